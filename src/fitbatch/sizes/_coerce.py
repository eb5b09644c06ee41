"""Sizes: one number per sample (or one row of D numbers), validated and converted once.

Accepted forms:

* a 1-D array-like of non-negative finite numbers (ints or floats), numpy/torch/list;
* a 2-D ``(N, D)`` array for samples with several size dimensions;
* a mapping ``index -> size`` whose keys are exactly ``0 .. N-1``;
* a mapping of named columns ``name -> sizes`` (str keys, array-likes of one length N): an
  ``(N, D)`` array whose columns keep their names (sorted), planned with one budget per column
  (:class:`fitbatch.costs.Limits`);
* a callable ``index -> size`` together with ``n``, the number of samples.

Each form is shown in :func:`as_sizes`; a bad size is refused with its index:

>>> as_sizes([1, -2])
Traceback (most recent call last):
...
ValueError: sizes must be non-negative and finite; 1 bad value: index 1 (size -2.0)
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping
from typing import Any, Union

import numpy as np
from numpy.typing import NDArray

from fitbatch._validate import format_offenders, non_negative_int

#: the largest integer size accepted: float64, in which sizes are planned, holds every integer
#: up to 2**53 exactly, and rounds larger ones
MAX_EXACT = 2**53

SizesLike = Union[NDArray[Any], "list[float]", Mapping[int, float], Callable[[int], float], Any]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Validated sizes: ``values`` is float64, shape ``(N,)`` or ``(N, D)``.

    Built by :func:`as_sizes`, which every planner calls on its ``sizes`` argument (and which
    returns a ``Sizes`` unchanged, so sizes validated once are not validated again).

    Attributes:
        values: the sizes, float64, C-contiguous; treat as read-only.
        integral: whether every size is a whole number.
        columns: the names of the columns of ``values``, sorted, when the sizes came as a
            mapping of named columns (several limits), else ``None``.

    >>> sizes = as_sizes([[3, 4], [1, 2], [5, 1]])
    >>> len(sizes), sizes.ndim, sizes.integral
    (3, 2, True)
    >>> sizes.real_units()
    array([12.,  2.,  5.])
    >>> as_sizes(sizes) is sizes
    True
    """

    values: NDArray[np.float64]
    integral: bool
    columns: tuple[str, ...] | None = None
    # derived arrays computed once per Sizes (sort keys): every epoch and strategy reuses them
    _cache: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def ndim(self) -> int:
        """Number of size dimensions D (1 for plain sizes)."""
        return 1 if self.values.ndim == 1 else int(self.values.shape[1])

    def cached(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per ``key`` for these sizes (the values must not be mutated)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def subset(self, index: Any) -> Sizes:
        """The sizes of the samples ``index`` selects (same column names).

        >>> as_sizes({"tokens": [5, 6, 7], "images": [0, 2, 1]}).subset([2, 0])
        Sizes(values=array([[1., 7.],
               [0., 5.]]), integral=True, columns=('images', 'tokens'))
        """
        return Sizes(self.values[index], self.integral, self.columns)

    def real_units(self) -> NDArray[np.float64]:
        """Per-sample real (unpadded) units: the size, or the product of a row's dimensions."""
        return self.values if self.values.ndim == 1 else np.prod(self.values, axis=1)


def as_sizes(sizes: SizesLike, n: int | None = None) -> Sizes:
    """Validate and convert ``sizes`` once, into a :class:`Sizes`.

    Args:
        sizes: a 1-D array-like of non-negative finite numbers (list, numpy array, torch
            tensor), an ``(N, D)`` array for samples with several size dimensions, a mapping
            ``index -> size`` whose keys are exactly ``0 .. N-1``, a callable
            ``index -> size`` (with ``n``), a mapping of named columns ``name -> sizes``
            (str keys, array-likes of equal length: ``(N, D)`` sizes with column names, for
            several limits), a :class:`Sizes` (returned as is), or an open
            :class:`fitbatch.SizeIndex` (memory-mapped; converted once, not re-validated).
        n: the number of samples: required with a callable, checked otherwise.

    Returns:
        A :class:`Sizes`.

    Raises:
        TypeError: non-numeric sizes, or a callable without ``n``.
        ValueError: a negative, infinite or NaN size, or an integer size above 2**53 (float64
            cannot hold it exactly; the message lists the first offenders), a wrong shape, a
            mapping with missing keys, or ``n`` not matching.

    >>> as_sizes([3, 1, 2]).values
    array([3., 1., 2.])
    >>> as_sizes({1: 5, 0: 7}).values
    array([7., 5.])
    >>> as_sizes({"tokens": [30, 12], "images": [1, 0]}).columns   # sorted
    ('images', 'tokens')
    >>> as_sizes(lambda i: 10 * i, n=3).values
    array([ 0., 10., 20.])
    >>> as_sizes([1, float("nan")])
    Traceback (most recent call last):
    ...
    ValueError: sizes must be non-negative and finite; 1 bad value: index 1 (size nan)
    """
    if isinstance(sizes, Sizes):
        return sizes
    hook = getattr(type(sizes), "__fitbatch_sizes__", None)
    if hook is not None:  # a fitbatch.SizeIndex: memory-mapped, validated when it was built
        out: Sizes = hook(sizes)
        if n is not None and len(out) != non_negative_int("n", n):
            raise ValueError(f"n={n} but sizes hold {len(out)} samples")
        return out
    columns = _column_names(sizes)
    if columns is not None and isinstance(sizes, Mapping):
        stacked = as_sizes(_stack_columns(sizes, columns), n)
        return Sizes(stacked.values, stacked.integral, columns)
    if callable(sizes) and not hasattr(sizes, "__len__"):
        if n is None:
            raise TypeError("sizes is a callable: pass n, the number of samples, too")
        count = non_negative_int("n", n)
        raw: Any = [sizes(i) for i in range(count)]
    elif isinstance(sizes, Mapping):
        raw = _from_mapping(sizes)
    elif isinstance(sizes, (str, bytes)):
        raise TypeError(f"sizes must be numbers, got a {type(sizes).__name__}")
    else:
        raw = sizes.detach().cpu().numpy() if hasattr(sizes, "detach") else sizes
    if n is not None and not callable(sizes):
        non_negative_int("n", n)
    try:
        arr = np.asarray(raw)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"sizes must be a numeric array-like; could not convert: {exc}") from None
    _refuse_inexact(arr, raw)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"sizes must be numeric, got dtype {arr.dtype} (first values {arr.ravel()[:3].tolist()!r})")
    if arr.dtype == bool:
        raise TypeError("sizes must be numbers, got booleans")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise TypeError("sizes must be real numbers, got complex values")
    if arr.ndim == 0 or arr.ndim > 2:
        raise ValueError(f"sizes must be 1-D (N,) or 2-D (N, D), got shape {arr.shape}")
    if arr.ndim == 2 and arr.shape[1] == 0:
        raise ValueError(f"sizes of shape {arr.shape} have no size dimension")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"n={n} but sizes hold {arr.shape[0]} samples")
    integral = bool(np.issubdtype(arr.dtype, np.integer))
    values = np.ascontiguousarray(arr, dtype=np.float64)
    if not integral or not arr.size or arr.min() < 0:  # integers are finite: only the sign to check
        _check_values(values)
    if not integral and values.size and values.size <= 1 << 26:
        integral = bool(np.all(values == np.floor(values)))
    return Sizes(values, integral)


def _column_names(sizes: Any) -> tuple[str, ...] | None:
    """The column names of a mapping of named columns (all keys str), else ``None``.

    A mapping with int keys is an ``index -> size`` mapping; one that mixes both is refused.
    """
    if not isinstance(sizes, Mapping) or not sizes:
        return None
    named = [isinstance(k, str) for k in sizes]
    if not any(named):
        return None
    if not all(named):
        raise TypeError(
            "a sizes mapping has either int keys 0..N-1 (one size per sample) or str keys (named "
            f"columns of sizes), not both; got keys {list(sizes)[:6]!r}"
        )
    return tuple(sorted(sizes))


def _stack_columns(sizes: Mapping[Any, Any], columns: tuple[str, ...]) -> NDArray[Any]:
    """The named columns side by side, ``(N, D)``; each column must be 1-D, all of one length."""
    arrays = []
    for name in columns:
        col = sizes[name]
        col = col.detach().cpu().numpy() if hasattr(col, "detach") else col
        try:
            arr = np.asarray(col)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"sizes column {name!r} must be a numeric array-like; could not convert: {exc}") from None
        if arr.ndim == 0:
            raise TypeError(
                f"sizes column {name!r} is one value ({col!r}): a sizes mapping has int keys 0..N-1 "
                "(one size per sample) or str keys naming columns of sizes (one array-like each)"
            )
        if arr.ndim != 1:
            raise ValueError(f"sizes column {name!r} must be 1-D (one size per sample), got shape {arr.shape}")
        arrays.append(arr)
    lengths = {name: a.shape[0] for name, a in zip(columns, arrays)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"sizes columns must hold one size per sample each, got lengths {lengths}")
    kind = np.result_type(*arrays) if all(a.dtype != object for a in arrays) else object
    return np.stack(arrays, axis=1).astype(kind, copy=False)


def _from_mapping(sizes: Mapping[Any, Any]) -> list[Any]:
    count = len(sizes)
    keys = list(sizes.keys())
    if any(isinstance(k, bool) or not isinstance(k, numbers.Integral) for k in keys):
        bad = next(k for k in keys if isinstance(k, bool) or not isinstance(k, numbers.Integral))
        raise TypeError(f"a sizes mapping must have int keys 0..N-1, got key {bad!r}")
    if sorted(keys) != list(range(count)):
        missing = sorted(set(range(count)) - set(keys))[:5]
        raise ValueError(
            f"a sizes mapping must have keys exactly 0..{count - 1}; missing {missing}"
            if missing
            else f"a sizes mapping must have keys exactly 0..{count - 1}; got keys outside it"
        )
    return [sizes[i] for i in range(count)]


def _refuse_inexact(arr: NDArray[Any], raw: Any) -> None:
    """Refuse integer sizes above :data:`MAX_EXACT`: float64 would round them.

    Whatever held them: an int64 or uint64 array, Python ints (too large for any integer dtype:
    an object array), or Python ints among floats in a list (a float array that rounded them).
    """
    if arr.ndim not in (1, 2):
        return  # refused for its shape
    if arr.dtype.kind in "iu":
        if arr.dtype.itemsize < 8 or not arr.size or arr.max() <= MAX_EXACT:
            return
        flat = arr.ravel()
        bad = np.flatnonzero(flat > MAX_EXACT)
        values = [int(v) for v in flat[bad[:5]]]
    elif arr.dtype == object or (arr.dtype.kind == "f" and arr.size and arr.max() >= MAX_EXACT and not isinstance(raw, np.ndarray)):
        # rare: look at the Python objects themselves
        try:
            objects = np.asarray(raw, dtype=object).ravel()
        except (TypeError, ValueError):  # pragma: no cover - asarray(raw) succeeded above
            return
        big = [
            i for i, v in enumerate(objects.tolist())
            if isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) > MAX_EXACT
        ]
        if not big:
            return
        bad = np.asarray(big)
        values = [int(objects[i]) for i in big[:5]]
    else:
        return
    rows = bad // (arr.shape[1] if arr.ndim == 2 and arr.shape[1] else 1)
    raise ValueError(
        f"integer sizes must be at most 2**53 = {MAX_EXACT} (float64 holds larger integers only "
        f"approximately); {bad.size} bad value{'s' if bad.size > 1 else ''}: {format_offenders(rows, values)}. "
        "Count in a coarser unit (KiB, not bytes), or pass floats to accept the rounding."
    )


def _check_values(values: NDArray[np.float64]) -> None:
    flat = values if values.ndim == 1 else values.min(axis=1)
    ok = np.isfinite(flat) & (flat >= 0)
    if values.ndim == 2:
        ok &= np.isfinite(values).all(axis=1)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        shown = values[bad] if values.ndim == 1 else [tuple(r) for r in values[bad[:5]].tolist()]
        raise ValueError(
            f"sizes must be non-negative and finite; {bad.size} bad value{'s' if bad.size > 1 else ''}: "
            + format_offenders(bad, shown)
        )

