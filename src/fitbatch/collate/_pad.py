"""Padding collate functions for a ``DataLoader`` fed by a budget sampler.

``pad_collate`` pads each sequence (a tensor or array whose first axis is its length) to the
batch's longest, and returns the padded values, the lengths and a boolean mask (True on real
positions). Samples may also be tuples or dicts: every sequence field is padded, every scalar
field is stacked. Works with torch tensors, and with numpy arrays when torch is absent.

>>> import numpy as np
>>> batch = pad_collate([np.array([1, 2, 3]), np.array([4])])
>>> batch.values.tolist(), batch.lengths.tolist(), batch.mask.tolist()
([[1, 2, 3], [4, 0, 0]], [3, 1], [[True, True, True], [True, False, False]])
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from fitbatch.collate._fields import as_batch


class PaddedBatch(NamedTuple):
    """Padded sequences: ``values`` (B, L, ...), ``lengths`` (B,), ``mask`` (B, L) True = real.

    What :func:`pad_collate` returns for a field of sequences: a named tuple, so it unpacks.
    The three are torch tensors when torch is installed, numpy arrays otherwise.

    Attributes:
        values: the sequences padded to the batch's longest (or to a multiple, see
            :func:`make_pad_collate`), shape ``(B, L, ...)``.
        lengths: each sequence's real length, int64, shape ``(B,)``.
        mask: ``True`` on real positions, ``False`` on padding, shape ``(B, L)``.

    >>> import torch
    >>> values, lengths, mask = pad_collate([torch.tensor([1, 2]), torch.tensor([3])])
    >>> values
    tensor([[1, 2],
            [3, 0]])
    >>> lengths, mask
    (tensor([2, 1]), tensor([[ True,  True],
            [ True, False]]))
    """

    values: Any
    lengths: Any
    mask: Any


def _torch() -> Any:
    try:
        import torch

        return torch
    except ImportError:  # pragma: no cover - exercised only without torch
        return None


def _is_sequence(x: Any) -> bool:
    return hasattr(x, "shape") and len(x.shape) >= 1


def padded_dtype(arrays: Sequence[np.ndarray], raw: Sequence[Any], fill: float) -> np.dtype[Any]:
    """The dtype of a padded field: its samples' common type, where an empty list has none.

    numpy reads ``[]`` as float64, which would turn a batch of token ids with one empty sample
    into floats; such samples are left out, and a field of only empty lists takes the padding
    value's type.

    >>> padded_dtype([np.asarray([]), np.asarray([5, 6])], [[], [5, 6]], 0)
    dtype('int64')
    >>> padded_dtype([np.asarray([])], [[]], -1.0)
    dtype('float64')
    """
    typed = [a for a, r in zip(arrays, raw) if not (isinstance(r, list) and len(r) == 0)]
    return np.result_type(*typed) if typed else np.asarray(fill).dtype


def _pad(items: Sequence[Any], value: float, multiple: int, raw: Sequence[Any]) -> PaddedBatch:
    torch = _torch()
    as_torch = torch is not None and isinstance(items[0], torch.Tensor)
    lengths = [int(x.shape[0]) for x in items]
    tails = {tuple(x.shape[1:]) for x in items}
    if len(tails) > 1:
        raise ValueError(f"samples differ beyond their first (length) axis: shapes {sorted(tails)}")
    longest = max(lengths) if lengths else 0
    if multiple > 1:
        longest = -(-longest // multiple) * multiple
    tail = tails.pop()
    if as_torch:
        out = items[0].new_full((len(items), longest, *tail), value)
        for i, x in enumerate(items):
            out[i, : x.shape[0]] = x
        lens = torch.tensor(lengths, dtype=torch.long)
        mask = torch.arange(longest)[None, :] < lens[:, None]
        return PaddedBatch(out, lens, mask)
    arrays = [np.asarray(x) for x in items]
    out_np = np.full((len(arrays), longest, *tail), value, dtype=padded_dtype(arrays, raw, value))
    for i, x in enumerate(arrays):
        out_np[i, : x.shape[0]] = x
    lens_np = np.asarray(lengths, dtype=np.int64)
    mask_np = np.arange(longest)[None, :] < lens_np[:, None]
    if torch is not None:
        return PaddedBatch(
            torch.from_numpy(out_np), torch.from_numpy(lens_np), torch.from_numpy(mask_np)
        )
    return PaddedBatch(out_np, lens_np, mask_np)


def _stack(items: Sequence[Any]) -> Any:
    torch = _torch()
    if torch is not None:
        if isinstance(items[0], torch.Tensor):
            return torch.stack(list(items))
        return torch.as_tensor(np.asarray(items))
    return np.asarray(items)


def make_pad_collate(
    padding_value: float = 0, *, pad_to_multiple_of: int = 1
) -> Callable[[Sequence[Any]], Any]:
    """A collate function padding with ``padding_value`` to a multiple of ``pad_to_multiple_of``.

    The function it returns collates like :func:`pad_collate`: a field of sequences becomes a
    :class:`PaddedBatch`, scalars are stacked, tuples and dicts are collated field by field.

    Args:
        padding_value: the value written in padded positions (``-100`` for ignored labels).
        pad_to_multiple_of: round every padded length up to a multiple of this (8 for tensor
            cores, a fixed set of shapes for compilers).

    Returns:
        ``collate(batch) -> collated batch``, to pass as a ``DataLoader``'s ``collate_fn``.

    Raises:
        ValueError: if ``pad_to_multiple_of`` is not an int >= 1; the collate function raises
            ``ValueError`` for an empty batch or samples whose shapes differ beyond the first
            (length) axis.

    >>> import numpy as np
    >>> collate = make_pad_collate(-1, pad_to_multiple_of=4)
    >>> batch = collate([(np.array([5, 6, 7]), 0), (np.array([8]), 1)])
    >>> batch[0].values.tolist(), batch[0].lengths.tolist(), batch[1].tolist()
    ([[5, 6, 7, -1], [8, -1, -1, -1]], [3, 1], [0, 1])
    """
    if (
        isinstance(pad_to_multiple_of, bool)
        or not isinstance(pad_to_multiple_of, numbers.Integral)
        or pad_to_multiple_of < 1
    ):
        raise ValueError(f"pad_to_multiple_of must be an int >= 1, got {pad_to_multiple_of!r}")

    def collate(batch: Sequence[Any]) -> Any:
        """Collate ``batch``, padding sequences (see :func:`make_pad_collate`)."""
        batch = as_batch(batch, "samples")  # a generator is read once; empty: ValueError
        first = batch[0]
        if isinstance(first, Mapping):
            return {k: collate([b[k] for b in batch]) for k in first}
        if isinstance(first, tuple):
            return (
                type(first)(*(collate([b[i] for b in batch]) for i in range(len(first))))
                if hasattr(first, "_fields")
                else tuple(collate([b[i] for b in batch]) for i in range(len(first)))
            )
        if isinstance(first, list) or _is_sequence(first):
            items = [np.asarray(b) if isinstance(b, list) else b for b in batch]
            return _pad(items, padding_value, int(pad_to_multiple_of), batch)
        if isinstance(first, (numbers.Number, np.generic)) or hasattr(first, "shape"):
            return _stack(batch)
        return list(batch)

    return collate


_ZERO_PAD = make_pad_collate()


def pad_collate(batch: Sequence[Any]) -> Any:
    """Collate a batch of samples, padding every sequence field with zeros to the longest.

    A sample may be a sequence (a tensor or array whose first axis is its length, or a list),
    a scalar, or a tuple or dict of those: sequence fields become :class:`PaddedBatch`, scalar
    fields are stacked, anything else is returned as a list. Use :func:`make_pad_collate` for
    another padding value or padded lengths rounded to a multiple.

    Args:
        batch: the samples of one batch (what a ``DataLoader`` with a batch sampler fetches).

    Returns:
        The collated batch, with the structure of one sample.

    Raises:
        ValueError: for an empty batch, or samples whose shapes differ beyond the first axis.

    >>> import torch
    >>> batch = pad_collate([{"ids": torch.tensor([1, 2, 3]), "label": 0},
    ...                      {"ids": torch.tensor([4]), "label": 1}])
    >>> batch["ids"].values.tolist(), batch["ids"].mask.tolist(), batch["label"].tolist()
    ([[1, 2, 3], [4, 0, 0]], [[True, True, True], [True, False, False]], [0, 1])
    """
    return _ZERO_PAD(batch)
