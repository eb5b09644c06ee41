"""Padding-free (varlen) collate: a batch's samples concatenated into one ``(1, T)`` row.

What a ``packed`` plan (``cost="sum"``) is made for: no padding is computed, and the model keeps
the samples apart with the boundaries this collate returns, under the names transformers' models
accept (the same as ``transformers.DataCollatorWithFlattening``):

* ``input_ids``, ``labels``, ``position_ids`` (restarting at 0 for each sample), shape ``(1, T)``;
* ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32, the ``n + 1`` sample offsets) and
  ``max_length_q``/``max_length_k`` (int): FlashAttention's varlen arguments;
* ``seq_idx`` (int32, the sample index of each token), for masks and Mamba-style kernels;
* with ``causal_mask=True``, ``attention_mask``: the additive ``(1, 1, T, T)`` block-diagonal
  causal mask for ``sdpa``/``eager`` attention, which have no varlen path.

Labels follow transformers' convention: a causal LM shifts labels inside the model, so each
sample's first label is ``-100`` -- no sample's first token is predicted from the one before it.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fitbatch.collate import _fields as F
from fitbatch.collate._masks import MAX_DENSE_TOKENS, _check_dense, block_causal_mask
from fitbatch.collate._shapes import _pick, as_shapes

RETURN_TENSORS = ("pt", "np")
_RESERVED = ("input_ids", "labels", "position_ids", "seq_idx", "attention_mask")


def _check_options(
    return_tensors: str, keep_fields: Sequence[str], causal_mask: bool, ints: dict[str, Any]
) -> None:
    if return_tensors not in RETURN_TENSORS:
        raise ValueError(f"return_tensors must be one of {RETURN_TENSORS}, got {return_tensors!r}")
    if causal_mask and return_tensors != "pt":
        raise ValueError("causal_mask=True builds a torch mask: use return_tensors='pt'")
    for name, value in ints.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if isinstance(keep_fields, str) or any(
        not isinstance(k, str) or k in _RESERVED for k in keep_fields
    ):
        raise ValueError(
            f"keep_fields must be a sequence of field names other than {_RESERVED}, got {keep_fields!r}"
        )


def make_varlen_collate(
    *,
    return_tensors: str = "pt",
    pad_token_id: int = 0,
    label_pad: int = -100,
    separator: bool = True,
    keep_fields: Sequence[str] = (),
    causal_mask: bool = False,
    dtype: Any = None,
    shapes: Any = None,
    max_mask_tokens: int | None = MAX_DENSE_TOKENS,
) -> Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]]:
    """A collate function concatenating dict samples into one padding-free ``(1, T)`` row.

    Each sample is a mapping with ``input_ids`` (a 1-D sequence of token ids), optionally
    ``labels`` (same length; default: ``input_ids``) and the per-token fields in ``keep_fields``.

    Args:
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
        pad_token_id: the id of the padding sequence's tokens (only used with ``shapes``).
        label_pad: the label of positions without a loss (``-100``: transformers' ignore index).
        separator: write ``label_pad`` at each sample's first label (transformers' convention,
            ``DataCollatorWithFlattening``); False keeps the labels as given.
        keep_fields: other per-token fields to concatenate (padded with 0); others are dropped.
        causal_mask: also return ``attention_mask``, the additive ``(1, 1, T, T)`` block-diagonal
            causal mask, for ``sdpa``/``eager`` attention (torch only).
        dtype: the mask's floating torch dtype (default ``torch.float32``; match the model's).
        shapes: allowed ``(rows, length)`` shapes (a ``(k, 2)`` array-like, e.g. a plan's
            ``shapes``): the row is padded to ``rows * length`` tokens of the shape
            :func:`pick_shape` picks for ``(n samples, longest)``, with one padding sequence
            (its own ``cu_seq_lens`` entry and ``seq_idx``, labels ``label_pad``, positions
            restarting at 0), so the model sees at most ``k`` values of ``T``.

    Returns:
        ``collate(samples) -> dict``, to pass as a ``DataLoader``'s ``collate_fn``.

    Raises:
        ValueError: for an unknown ``return_tensors``, bad ``keep_fields``, ``shapes`` or
            ``max_mask_tokens``; the collate function raises ``ValueError`` for a batch that
            breaks the field rules (:mod:`fitbatch.collate._fields`: ``labels`` in some samples
            only, ``None`` or non-numeric values, float ``input_ids``), a sample with no tokens,
            per-token fields whose length differs from ``input_ids``, a batch no shape fits, or
            (``causal_mask``) a row longer than ``max_mask_tokens``.
        TypeError: if ``pad_token_id`` or ``label_pad`` is not an int.

    >>> collate = make_varlen_collate(return_tensors="np")
    >>> out = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    >>> out["input_ids"].tolist(), out["labels"].tolist(), out["position_ids"].tolist()
    ([[5, 6, 7, 8, 9]], [[-100, 6, 7, -100, 9]], [[0, 1, 2, 0, 1]])
    >>> out["cu_seq_lens_q"].tolist(), out["max_length_q"], out["seq_idx"].tolist()
    ([0, 3, 5], 3, [[0, 0, 0, 1, 1]])
    """
    _check_options(
        return_tensors,
        keep_fields,
        causal_mask,
        {"pad_token_id": pad_token_id, "label_pad": label_pad},
    )
    keep = tuple(keep_fields)
    table = None if shapes is None else as_shapes(shapes)
    if dtype is not None and not causal_mask:
        raise ValueError("dtype is the attention mask's dtype: pass it with causal_mask=True")
    _check_dense(0, max_mask_tokens, 4)  # a bad max_mask_tokens fails here, not at the first batch

    def collate(batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Concatenate ``batch`` into one row (see :func:`make_varlen_collate`)."""
        arrays = _concatenate(batch, keep, int(pad_token_id), int(label_pad), separator, table)
        return _convert(arrays, return_tensors, causal_mask, dtype, max_mask_tokens)

    return collate


def _fields(
    batch: Sequence[Mapping[str, Any]], keep: tuple[str, ...]
) -> tuple[list[np.ndarray], dict[str, list]]:
    """Each sample's ``input_ids`` and its other per-token fields, checked by the field rules
    (:mod:`._fields`: ``labels`` in every sample or in none, ...); ``labels`` default to
    ``input_ids``."""
    items = F.check_batch(batch, "varlen samples are dicts of token ids")
    for key in keep:
        if key not in items[0]:
            raise ValueError(f"sample 0 has no {key!r}, which keep_fields names")
    ids = F.values(items, "input_ids")
    lengths = F.check_tokens(ids)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise ValueError(f"sample {int(empty[0])} has no tokens: drop empty samples before collating")
    others: dict[str, list[np.ndarray]] = {"labels": ids}
    if "labels" in items[0]:
        others["labels"] = F.values(items, "labels")
        F.check_labels(others["labels"], lengths, per_sample=False)
    for key in keep:
        others[key] = F.values(items, key)
        for i, arr in enumerate(others[key]):
            if arr.shape[:1] != (lengths[i],):
                raise ValueError(
                    f"sample {i}: {key!r} has {arr.shape[:1]} positions but 'input_ids' has {lengths[i]}"
                )
    return [a.astype(np.int64, copy=False) for a in ids], others


def _concatenate(
    batch: Sequence[Mapping[str, Any]],
    keep: tuple[str, ...],
    pad_token_id: int,
    label_pad: int,
    separator: bool,
    table: np.ndarray | None,
) -> dict[str, Any]:
    ids, others = _fields(batch, keep)
    lengths = np.fromiter((x.size for x in ids), dtype=np.int64, count=len(ids))
    n, total = len(ids), int(lengths.sum())
    pad = 0
    if table is not None:
        rows, length = _pick(table, n, int(lengths.max()))
        pad = rows * length - total
    seg = np.append(lengths, pad) if pad else lengths
    cu = np.zeros(seg.size + 1, dtype=np.int64)
    np.cumsum(seg, out=cu[1:])
    out: dict[str, Any] = {
        "input_ids": np.concatenate([*ids, np.full(pad, pad_token_id)]).astype(np.int64),
        "labels": np.concatenate([*others["labels"], np.full(pad, label_pad)]).astype(np.int64),
    }
    if separator:
        out["labels"][cu[:n]] = label_pad
    # positions restart at each segment start: token t of segment s is at t - cu[s]
    out["position_ids"] = np.arange(cu[-1], dtype=np.int64) - np.repeat(cu[:-1], seg)
    out["seq_idx"] = np.repeat(np.arange(seg.size, dtype=np.int32), seg)
    for key in keep:
        parts = others[key]
        out[key] = np.concatenate(
            [*parts, np.zeros((pad, *parts[0].shape[1:]), dtype=parts[0].dtype)]
        )
    out["cu_seq_lens"] = cu.astype(np.int32)
    out["max_length"] = int(seg.max())
    return out


def _convert(
    arrays: dict[str, Any], return_tensors: str, causal_mask: bool, dtype: Any, max_tokens: int | None = MAX_DENSE_TOKENS
) -> dict[str, Any]:
    cu, longest = arrays.pop("cu_seq_lens"), arrays.pop("max_length")
    if return_tensors == "pt":
        import torch

        out: dict[str, Any] = {
            k: torch.from_numpy(np.ascontiguousarray(v))[None] for k, v in arrays.items()
        }
        cu = torch.from_numpy(cu)
    else:
        out = {k: v[None] for k, v in arrays.items()}
    out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    if causal_mask:
        out["attention_mask"] = block_causal_mask(out["seq_idx"], dtype=dtype, max_tokens=max_tokens)
    return out


_DEFAULT = make_varlen_collate()


def varlen_collate(batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Concatenate dict samples into one padding-free ``(1, T)`` row of torch tensors.

    :func:`make_varlen_collate` with its defaults: ``input_ids``, ``labels`` (each sample's first
    label ``-100``), ``position_ids``, ``seq_idx``, ``cu_seq_lens_q``/``_k``,
    ``max_length_q``/``_k`` -- what transformers' FlashAttention path takes. For ``sdpa`` or
    ``eager`` attention use ``make_varlen_collate(causal_mask=True)``.

    Args:
        batch: dict samples with ``input_ids`` and optionally ``labels``.

    Returns:
        A dict of torch tensors (and two ints), to unpack into a model: ``model(**batch)``.

    Raises:
        ValueError: see :func:`make_varlen_collate`.

    >>> import torch
    >>> out = varlen_collate([{"input_ids": torch.tensor([1, 2])}, {"input_ids": torch.tensor([3])}])
    >>> out["input_ids"], out["position_ids"], out["cu_seq_lens_q"]
    (tensor([[1, 2, 3]]), tensor([[0, 1, 0]]), tensor([0, 2, 3], dtype=torch.int32))
    """
    return _DEFAULT(batch)
