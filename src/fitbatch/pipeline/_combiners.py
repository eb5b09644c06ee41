"""Combiners: turn a batch (a list of items) into what the training step consumes.

An item is either a tuple/list of components (``(image, label)``), a mapping of named
components, or a single component (an array, a number). A combiner gathers each component
across the batch and returns the same structure: ``[(x1, y1), (x2, y2)]`` gives ``(xs, ys)``,
a list of dicts gives a dict, a list of arrays gives one array.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

PaddingValues = Any  # a number, a function array -> number, or one of these per component


def _columns(batch: Sequence[Any]) -> tuple[str, list[Any], list[list[Any]]]:
    """(structure, keys, one list per component) of a non-empty batch."""
    if isinstance(batch, (str, bytes)) or not isinstance(batch, Sequence):
        raise TypeError(f"a combiner takes a batch: a list of items, got {type(batch).__name__}")
    if len(batch) == 0:
        raise ValueError("cannot combine an empty batch")
    first = batch[0]
    if isinstance(first, (tuple, list)):
        width = len(first)
        for i, item in enumerate(batch):
            if not isinstance(item, (tuple, list)) or len(item) != width:
                raise ValueError(
                    f"batch items must all have {width} components like item 0; item {i} is {_brief(item)}"
                )
        return "tuple", [], [list(column) for column in zip(*batch, strict=True)]
    if isinstance(first, Mapping):
        keys = list(first)
        for i, item in enumerate(batch):
            if not isinstance(item, Mapping) or set(item) != set(keys):
                raise ValueError(
                    f"batch items must all have the keys {keys} like item 0; item {i} is {_brief(item)}"
                )
        return "dict", keys, [[item[k] for item in batch] for k in keys]
    return "single", [], [list(batch)]


def _rebuild(structure: str, keys: list[Any], values: list[Any]) -> Any:
    if structure == "tuple":
        return tuple(values)
    if structure == "dict":
        return dict(zip(keys, values, strict=True))
    return values[0]


def _brief(item: Any) -> str:
    text = repr(item)
    return text if len(text) <= 60 else text[:57] + "..."


def combine_batches(batch: Sequence[Any]) -> Any:
    """Gather each component into a tuple: ``[(x1, y1), (x2, y2)] -> ((x1, x2), (y1, y2))``.

    Args:
        batch: a non-empty list of items, all with the same structure.

    Returns:
        A tuple of tuples for tuple items, a dict of tuples for mapping items, else one tuple.

    Raises:
        ValueError: for an empty batch or items of different structure.

    >>> combine_batches([(1, "a"), (2, "b")])
    ((1, 2), ('a', 'b'))
    >>> combine_batches([3, 4])
    (3, 4)
    """
    structure, keys, columns = _columns(batch)
    return _rebuild(structure, keys, [tuple(c) for c in columns])


def combine_to_arrays(batch: Sequence[Any]) -> Any:
    """Stack each component into one numpy array (items of a component share a shape).

    The default combiner of :class:`~fitbatch.pipeline.Infinite`.

    Args:
        batch: a non-empty list of items, all with the same structure.

    Returns:
        A tuple of arrays for tuple items, a dict of arrays for mapping items, else one array.

    >>> xs, ys = combine_to_arrays([([1, 2], 0), ([3, 4], 1)])
    >>> xs.shape, ys
    ((2, 2), array([0, 1]))
    """
    structure, keys, columns = _columns(batch)
    return _rebuild(structure, keys, [np.array(c) for c in columns])


def combine_to_tensors(batch: Sequence[Any]) -> Any:
    """Stack each component into one ``torch`` tensor (needs torch).

    Tensors are stacked with ``torch.stack``; anything else goes through a numpy array and
    ``torch.as_tensor``.

    Args:
        batch: a non-empty list of items, all with the same structure.

    Returns:
        The structure of :func:`combine_to_arrays`, with tensors.

    Raises:
        ImportError: when torch is not installed.

    >>> xs, ys = combine_to_tensors([([1.0, 2.0], 0), ([3.0, 4.0], 1)])
    >>> tuple(xs.shape), ys.tolist()
    ((2, 2), [0, 1])
    """
    try:
        import torch
    except ImportError as error:  # pragma: no cover - torch is an optional dependency
        raise ImportError(
            "combine_to_tensors needs torch: pip install 'fitbatch[torch]'"
        ) from error
    structure, keys, columns = _columns(batch)
    tensors = [
        torch.stack(c)
        if all(isinstance(x, torch.Tensor) for x in c)
        else torch.as_tensor(np.array(c))
        for c in columns
    ]
    return _rebuild(structure, keys, tensors)


class _PadCombiner:
    """``combine_pad`` with fixed options; picklable, so it may run in a process stage."""

    def __init__(self, padding_values: PaddingValues, ratio: float | Sequence[float]) -> None:
        self.padding_values = _check_padding(padding_values)
        self.ratio = _check_ratio(ratio)

    def __call__(self, batch: Sequence[Any]) -> Any:
        structure, keys, columns = _columns(batch)
        values = self._per_component(structure, keys, len(columns))
        padded = [
            _pad_column(c, v, self.ratio, str(k))
            for c, v, k in zip(columns, values, keys or range(len(columns)), strict=True)
        ]
        return _rebuild(structure, keys, padded)

    def _per_component(self, structure: str, keys: list[Any], width: int) -> list[Any]:
        pv = self.padding_values
        if isinstance(pv, Mapping):
            if structure != "dict" or set(pv) != set(keys):
                raise ValueError(
                    f"padding_values has keys {sorted(pv, key=str)} but the items have {keys or 'no keys'}"
                )
            return [pv[k] for k in keys]
        if isinstance(pv, (tuple, list)):
            if structure == "dict" or len(pv) != width:
                raise ValueError(
                    f"padding_values gives {len(pv)} values but the items have {width} components"
                )
            return list(pv)
        return [pv] * width

    def __repr__(self) -> str:
        return f"combine_pad(padding_values={self.padding_values!r}, ratio={self.ratio!r})"


def _check_padding(value: Any) -> Any:
    def scalar(v: Any) -> bool:
        return (
            callable(v)
            or (isinstance(v, numbers.Number) and not isinstance(v, bool))
            or isinstance(v, np.generic)
        )

    parts = (
        list(value.values())
        if isinstance(value, Mapping)
        else value
        if isinstance(value, (tuple, list))
        else [value]
    )
    if not parts or not all(scalar(v) for v in parts):
        raise TypeError(
            "padding_values must be a number, a function array -> number, or a list/dict of "
            f"these per component, got {value!r}"
        )
    return value


def _check_ratio(ratio: Any) -> float | tuple[float, ...]:
    values = ratio if isinstance(ratio, (tuple, list)) else [ratio]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0.0 <= float(v) <= 1.0:
            raise ValueError(
                f"ratio must be a number in [0, 1] or one such number per axis, got {ratio!r}"
            )
    return tuple(float(v) for v in values) if isinstance(ratio, (tuple, list)) else float(ratio)


def _pad_column(
    column: list[Any], value: Any, ratio: float | tuple[float, ...], name: str
) -> np.ndarray:
    arrays = [np.asarray(x) for x in column]
    ndim = arrays[0].ndim
    if any(a.ndim != ndim for a in arrays):
        dims = sorted({a.ndim for a in arrays})
        raise ValueError(
            f"component {name} mixes arrays with {dims} dimensions; combine_pad pads shapes, not ranks"
        )
    if ndim == 0:
        return np.array(arrays)
    shape = np.max([a.shape for a in arrays], axis=0)
    if isinstance(ratio, tuple) and len(ratio) != ndim:
        raise ValueError(
            f"ratio gives {len(ratio)} values (one per axis) but component {name} has {ndim} axes"
        )
    ratios = ratio if isinstance(ratio, tuple) else (ratio,) * ndim
    out = np.empty((len(arrays), *shape), dtype=np.result_type(*arrays))
    for i, a in enumerate(arrays):
        out[i] = value(a) if callable(value) else value
        start = [
            math.floor((full - own) * r)
            for full, own, r in zip(shape, a.shape, ratios, strict=True)
        ]
        index = (i,) + tuple(slice(s, s + n) for s, n in zip(start, a.shape, strict=True))
        out[index] = a
    return out


def combine_pad(
    batch: Sequence[Any] | None = None,
    padding_values: PaddingValues = 0,
    ratio: float | Sequence[float] = 0.5,
) -> Any:
    """Pad each component to the batch's largest shape on every axis, then stack it.

    Use it directly, ``combiner=combine_pad``, or configured, ``combiner=combine_pad(
    padding_values=-1, ratio=0.0)``: called without a batch it returns the combiner.

    Args:
        batch: a non-empty list of items; ``None`` to get a configured combiner.
        padding_values: the fill value: a number, a function ``array -> number`` (for example
            ``numpy.min``), or one of these per component (a list for tuple items, a dict for
            mapping items).
        ratio: the share of each axis' padding put before the data (0 pads right only, 1 left
            only); a number, or one number per axis. The left share is rounded down.

    Returns:
        The combined batch (the structure of :func:`combine_to_arrays`), or a combiner.

    Raises:
        ValueError, TypeError: for invalid options, or components whose ranks differ.

    >>> xs, ys = combine_pad([([1, 2, 3], 0), ([4], 1)])
    >>> xs
    array([[1, 2, 3],
           [0, 4, 0]])
    >>> import numpy as np
    >>> combine_pad(padding_values=-1, ratio=0.0)([np.array([1, 2]), np.array([3])])
    array([[ 1,  2],
           [ 3, -1]])
    """
    combiner = _PadCombiner(padding_values, ratio)
    if batch is None:
        return combiner
    if isinstance(batch, (str, bytes)) or not isinstance(batch, Sequence):
        raise TypeError(
            f"combine_pad takes a batch (a list of items), got {batch!r}; to configure it, pass "
            "keywords only: combine_pad(padding_values=..., ratio=...)"
        )
    return combiner(batch)
