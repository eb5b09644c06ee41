"""Attention masks for padding-free batches: samples side by side in one row must not see each other.

Two forms of the same "document + causal" rule (query ``i`` sees key ``j`` when both belong to
the same sample and ``j <= i``):

* :func:`block_causal_mask`: a dense additive ``(1, 1, T, T)`` mask (0 allowed, the dtype's
  minimum elsewhere) for ``sdpa``/``eager`` attention, which have no varlen path; O(T^2) memory.
* :func:`document_block_mask`: a ``torch.nn.attention.flex_attention`` ``BlockMask``, which
  stores only the non-empty blocks.

Both take ``seq_idx``: the sample index of each token (what :func:`make_varlen_collate` returns).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

#: the longest row :func:`block_causal_mask` builds by default: a (T, T) float32 mask of
#: 16,384 tokens is 1 GiB (40,000 tokens: 6.4 GB); pass ``max_tokens`` to allow more
MAX_DENSE_TOKENS = 16_384


def _seq_idx_tensor(seq_idx: Any) -> Any:
    import torch

    ids = seq_idx if isinstance(seq_idx, torch.Tensor) else torch.as_tensor(np.asarray(seq_idx))
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(
            f"seq_idx must be integer sample indices of shape (T,) or (1, T), got {tuple(ids.shape)} {ids.dtype}"
        )
    return ids.long()


def block_causal_mask(seq_idx: Any, *, dtype: Any = None, max_tokens: int | None = MAX_DENSE_TOKENS) -> Any:
    """The additive ``(1, 1, T, T)`` block-diagonal causal mask of a padding-free row.

    Args:
        seq_idx: the sample index of each token, shape ``(T,)`` or ``(1, T)`` (tensor or array).
        dtype: a floating torch dtype (default ``torch.float32``); allowed positions hold 0,
            the others ``torch.finfo(dtype).min``. Match the model's dtype.
        max_tokens: the longest row to build a dense mask for (default :data:`MAX_DENSE_TOKENS`,
            16,384: 1 GiB in float32); ``None``: no limit.

    Returns:
        A torch tensor ``(1, 1, T, T)``, to pass as a transformers model's ``attention_mask``.

    Raises:
        ValueError: if ``seq_idx`` is not a 1-D (or ``(1, T)``) integer array, ``dtype`` is not
            a floating dtype, or ``T`` exceeds ``max_tokens`` (the message names the ways out:
            FlashAttention's varlen arguments, :func:`document_block_mask`, a smaller budget,
            or a larger ``max_tokens``).

    >>> import torch
    >>> mask = block_causal_mask([0, 0, 1], dtype=torch.float32)
    >>> (mask[0, 0] == 0).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"dtype must be a floating torch dtype such as torch.float32, got {dtype!r}"
        )
    ids = _seq_idx_tensor(seq_idx)
    _check_dense(int(ids.shape[0]), max_tokens, dtype.itemsize)
    pos = torch.arange(ids.shape[0], device=ids.device)
    allowed = (ids[:, None] == ids[None, :]) & (pos[None, :] <= pos[:, None])
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=ids.device)
    return mask.masked_fill_(allowed, 0.0)[None, None]


def _check_dense(n: int, max_tokens: int | None, itemsize: int) -> None:
    if max_tokens is None:
        return
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1 or None, got {max_tokens!r}")
    if n > max_tokens:
        raise ValueError(
            f"a dense ({n}, {n}) attention mask needs {n * n * itemsize / 2**30:.1f} GiB (max_tokens={max_tokens}): "
            "use FlashAttention's varlen path (the collate's cu_seq_lens, no mask), document_block_mask "
            "(flex attention), a smaller budget, or pass max_tokens (make_varlen_collate(max_mask_tokens=...))"
        )


def document_block_mask(
    seq_idx: Any, *, causal: bool = True, block_size: int = 128, device: Any = None
) -> Any:
    """A flex-attention ``BlockMask``: each token sees its own sample only (and, if causal, the past).

    Args:
        seq_idx: the sample index of each token, shape ``(T,)`` or ``(1, T)``.
        causal: also hide later positions of the same sample (decoders); False for encoders.
        block_size: the ``BlockMask`` tile size (``T`` need not be a multiple of it).
        device: where the mask lives (default: ``seq_idx``'s device).

    Returns:
        A ``torch.nn.attention.flex_attention.BlockMask`` for one head and one row, to pass to
        ``flex_attention(q, k, v, block_mask=...)`` with ``q``/``k``/``v`` of shape
        ``(1, heads, T, head_dim)``.

    Raises:
        ValueError: for a ``seq_idx`` that is not 1-D integer indices, or a ``block_size``
            that is not an int >= 1.
        ImportError: if this torch has no ``flex_attention`` (torch < 2.5).

    >>> import torch
    >>> mask = document_block_mask([0, 0, 1, 1, 1], block_size=2)
    >>> mask.shape
    (1, 1, 5, 5)
    >>> mask.to_dense().shape  # one entry per (query block, key block)
    torch.Size([1, 1, 3, 3])
    """
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1 (the BlockMask tile, default 128), got {block_size!r}")
    from torch.nn.attention.flex_attention import create_block_mask

    ids = _seq_idx_tensor(seq_idx)
    if device is not None:
        ids = ids.to(device)
    n = int(ids.shape[0])

    def document(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        same = ids[q_idx] == ids[kv_idx]
        return same & (kv_idx <= q_idx) if causal else same

    return create_block_mask(
        document, B=1, H=1, Q_LEN=n, KV_LEN=n, device=str(ids.device), BLOCK_SIZE=block_size
    )
