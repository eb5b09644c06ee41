"""Context parallelism for a packed micro-batch: :func:`cp_shard`.

Under causal attention the late tokens of a document attend to more keys than the early ones, so
cutting a document into ``cp_size`` contiguous pieces loads the last rank most. The balanced cut
(Megatron's, torchtitan's) pads each document to a multiple of ``2 * cp_size``, cuts it into
``2 * cp_size`` equal chunks, and gives rank ``i`` chunks ``i`` and ``2 * cp_size - 1 - i``: one
early, one late. Each rank keeps the tokens' positions within their document, so attention of
its queries over the keys/values gathered from all CP ranks, masked by document and position, is
the unsharded causal attention. :func:`~fitbatch.steps.partition` with ``cp_size=`` counts the
same padded lengths against the budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._validate import non_negative_int, positive_int

IntArray = NDArray[np.int64]


def cp_shard(
    batch: Mapping[str, Any], cp_rank: int, cp_size: int, *, pad_token_id: int = 0, label_pad: int = -100
) -> dict[str, Any]:
    """Context-parallel rank ``cp_rank``'s share of a packed (varlen) batch.

    Args:
        batch: a padding-free batch, as :func:`fitbatch.collate.make_varlen_collate` returns:
            ``input_ids`` and ``labels`` of shape ``(1, T)`` and ``cu_seq_lens_q`` (or
            ``cu_seq_lens``), the ``n + 1`` document offsets; numpy arrays or torch tensors.
        cp_rank: this rank's index in the context-parallel group, ``0 <= cp_rank < cp_size``.
        cp_size: the context-parallel group's size.
        pad_token_id: the id of the tokens that pad each document to a multiple of ``2 * cp_size``.
        label_pad: the label of padding (``-100``: no loss).

    Returns:
        A dict of the same array type: ``input_ids``, ``labels``, ``position_ids`` (each token's
        position in its document: the padding continues it) and ``seq_idx`` (its document),
        each ``(1, t)``; ``shift_labels`` ``(1, t)``, the label of each token's successor in
        its document (what a causal LM's loss compares the token's logits with, computed before
        the cut, which separates neighbours; transformers' loss takes it as ``shift_labels``);
        ``cp_index`` ``(t,)``, each token's index in the unsharded row (-1 for padding);
        ``cu_seq_lens`` (int32, ``n + 1``) and ``max_length``: this rank's document offsets.

    Raises:
        ValueError: a rank outside ``[0, cp_size)``, or a batch without the keys above, or with
            offsets that do not match ``input_ids``.
        TypeError: ``cp_rank`` or ``cp_size`` not an int.

    >>> import numpy as np
    >>> batch = {"input_ids": np.array([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]),
    ...          "labels": np.array([[-100, 2, 3, 4, 5, 6, -100, 8, 9, 10]]),
    ...          "cu_seq_lens_q": np.array([0, 6, 10], dtype=np.int32)}
    >>> out = cp_shard(batch, 0, 2)     # documents of 6 and 4 tokens padded to 8 and 4: chunks 2, 1
    >>> out["input_ids"].tolist(), out["position_ids"].tolist(), out["cu_seq_lens"].tolist()
    ([[1, 2, 0, 0, 7, 10]], [[0, 1, 6, 7, 0, 3]], [0, 4, 6])
    >>> out["shift_labels"].tolist(), out["cp_index"].tolist()
    ([[2, 3, -100, -100, 8, -100]], [0, 1, -1, -1, 6, 9])
    """
    size = positive_int("cp_size", cp_size)
    rank = non_negative_int("cp_rank", cp_rank)
    assert size is not None
    if rank >= size:
        raise ValueError(f"cp_rank must be in [0, cp_size={size}), got {cp_rank!r}")
    ids, like = _array(batch, "input_ids")
    labels = _array(batch, "labels")[0] if "labels" in batch else ids
    key = "cu_seq_lens_q" if "cu_seq_lens_q" in batch else "cu_seq_lens"
    cu = _array(batch, key)[0].astype(np.int64).ravel()
    if cu.size < 1 or cu[0] != 0 or cu[-1] != ids.size or np.any(np.diff(cu) < 0):
        raise ValueError(
            f"{key} must rise from 0 to the {ids.size} tokens of input_ids, got {cu.tolist()[:8]}"
        )
    index, pos, doc, local_cu = _layout(np.diff(cu), cu[:-1], rank, size)
    real = index >= 0
    at = np.where(real, index, 0)
    nxt = np.where(real & (pos + 1 < np.diff(cu)[doc]), at + 1, -1)  # the successor in its document
    out = {
        "input_ids": np.where(real, ids[at], pad_token_id),
        "labels": np.where(real, labels[at], label_pad),
        "shift_labels": np.where(nxt >= 0, labels[np.maximum(nxt, 0)], label_pad),
        "position_ids": pos,
        "seq_idx": doc.astype(np.int32),
    }
    converted = {k: like(v[None]) for k, v in out.items()}
    converted["cp_index"] = like(index)
    converted["cu_seq_lens"] = like(local_cu.astype(np.int32))
    converted["max_length"] = int(np.diff(local_cu).max()) if local_cu.size > 1 else 0
    return converted


def _layout(lengths: IntArray, starts: IntArray, rank: int, size: int) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """This rank's tokens: their index in the unsharded row (-1: padding), position in their
    document, document, and the local document offsets."""
    unit = 2 * size
    chunk = -(-lengths // unit)  # each document padded to chunk * unit tokens
    local = 2 * chunk
    local_cu = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(local, out=local_cu[1:])
    doc = np.repeat(np.arange(lengths.size, dtype=np.int64), local)
    k = np.arange(local_cu[-1], dtype=np.int64) - local_cu[doc]  # 0 .. 2*chunk-1 within the document
    c = chunk[doc]
    # the first chunk of a document is chunk `rank`, the second chunk `unit - 1 - rank`
    pos = np.where(k < c, rank * c + k, (unit - 1 - rank) * c + (k - c))
    index = np.where(pos < lengths[doc], starts[doc] + pos, -1)
    return index, pos, doc, local_cu


def _array(batch: Mapping[str, Any], key: str) -> tuple[Any, Any]:
    """``batch[key]`` flattened to a numpy array, and a function giving arrays of its kind."""
    if key not in batch:
        raise ValueError(f"batch has no {key!r} (keys: {sorted(batch)}): pass a make_varlen_collate batch")
    value = batch[key]
    if hasattr(value, "detach"):  # a torch tensor: answer in torch, on its device
        import torch

        device = value.device
        return value.detach().cpu().numpy().ravel(), lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)
    return np.asarray(value).ravel(), np.asarray
