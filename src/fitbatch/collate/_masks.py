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

from typing import Any

import numpy as np


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


def block_causal_mask(seq_idx: Any, *, dtype: Any = None) -> Any:
    """The additive ``(1, 1, T, T)`` block-diagonal causal mask of a padding-free row.

    Args:
        seq_idx: the sample index of each token, shape ``(T,)`` or ``(1, T)`` (tensor or array).
        dtype: a floating torch dtype (default ``torch.float32``); allowed positions hold 0,
            the others ``torch.finfo(dtype).min``. Match the model's dtype.

    Returns:
        A torch tensor ``(1, 1, T, T)``, to pass as a transformers model's ``attention_mask``.

    Raises:
        ValueError: if ``seq_idx`` is not a 1-D (or ``(1, T)``) integer array, or ``dtype`` is not
            a floating dtype.

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
    pos = torch.arange(ids.shape[0], device=ids.device)
    allowed = (ids[:, None] == ids[None, :]) & (pos[None, :] <= pos[:, None])
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=ids.device)
    return mask.masked_fill_(allowed, 0.0)[None, None]


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
        ValueError: for a ``seq_idx`` that is not 1-D integer indices.
        ImportError: if this torch has no ``flex_attention`` (torch < 2.5).

    >>> import torch
    >>> mask = document_block_mask([0, 0, 1, 1, 1], block_size=2)
    >>> mask.shape
    (1, 1, 5, 5)
    >>> mask.to_dense().shape  # one entry per (query block, key block)
    torch.Size([1, 1, 3, 3])
    """
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
