"""Shared argument checks: each names the parameter, the offending value and the way out."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
from numpy.typing import NDArray

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BUDGET_RE = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def choice(name: str, value: Any, valid: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``valid``, else raise naming all alternatives."""
    options = tuple(valid)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {options}, got {value!r}")
    if value not in options:
        raise ValueError(f"unknown {name} {value!r}; expected one of {options}")
    return value


def positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """An int >= 1 (bools are refused), or ``None`` when allowed."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 1{' or None' if allow_none else ''}, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return int(value)


def non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return int(value)


def fraction(name: str, value: Any, *, low: float = 0.0, high: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    if not (low <= float(value) <= high):
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return float(value)


def parse_budget(value: Any, name: str = "budget") -> float:
    """Coerce a budget to a positive finite float.

    Accepts numbers and strings with an optional byte unit (``"70GiB"``, ``"1.5 GB"``,
    ``"512MiB"``, ``"16384"``).

    >>> parse_budget("2KiB")
    2048.0
    >>> parse_budget(16384)
    16384.0
    """
    if isinstance(value, str):
        match = _BUDGET_RE.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"{name} {value!r} is not a number with an optional unit; "
                f"units: {tuple(u for u in _UNITS if u)} (for example '70GiB')"
            )
        number = float(match.group(1)) * _UNITS[unit]
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number or a string like '70GiB', got {value!r}")
    else:
        number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return number


def state_mapping(name: str, state: Any) -> Any:
    """``state`` if it is a mapping (what a ``state_dict()`` returned), else a ``TypeError``.

    >>> state_mapping("sampler", None)
    Traceback (most recent call last):
    ...
    TypeError: sampler state must be a mapping (what state_dict() returned), got NoneType
    """
    from collections.abc import Mapping

    if not isinstance(state, Mapping):
        raise TypeError(f"{name} state must be a mapping (what state_dict() returned), got {type(state).__name__}")
    return state


def format_offenders(indices: Any, values: Any, limit: int = 5) -> str:
    """'index 3 (size 70000), index 9 (size 52000), ...' for the first ``limit`` offenders."""
    shown = ", ".join(f"index {int(i)} (size {v})" for i, v in zip(indices[:limit], values[:limit]))
    more = len(indices) - limit
    return shown + (f" and {more} more" if more > 0 else "")


def loss_sizes(values: Any, n: int, sizes: Any = None) -> NDArray[np.float64] | None:
    """``loss_sizes`` checked and coerced: ``None``, or one finite number >= 0 per sample (float64).

    The tokens of each sample that carry loss (labels != -100), beside the ``n`` sizes; with
    ``sizes`` (one column, the samples' tokens) none may exceed its sample's size: the tokens
    that carry loss are among the sample's tokens.

    >>> loss_sizes([3, 0, 2], 3).tolist()
    [3.0, 0.0, 2.0]
    >>> loss_sizes([3, -1, 2], 3)
    Traceback (most recent call last):
    ...
    ValueError: loss_sizes must be finite and >= 0; 1 bad row: index 1 (size -1.0). Pass the tokens of each sample that carry loss (labels != -100)
    >>> loss_sizes([3, 5, 2], 3, np.array([4.0, 4.0, 4.0]))
    Traceback (most recent call last):
    ...
    ValueError: loss_sizes must not exceed the sizes (a sample's tokens that carry loss are among its tokens); 1 bad row: index 1 (size 5.0) over sizes [4.0]. Pass the tokens of each sample that carry loss (labels != -100), counted in the same units as sizes
    """
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or isinstance(values, numbers.Number):
        raise TypeError(f"loss_sizes must be one number per sample (a sequence or array), got {values!r}")
    array = np.asarray(values)
    if array.dtype == bool or not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise TypeError(f"loss_sizes must hold ints or floats (one per sample), got dtype {array.dtype}")
    if array.ndim != 1 or array.size != n:
        raise ValueError(
            f"loss_sizes must have one entry per sample: {n} (the length of sizes), got shape {array.shape}"
        )
    out = np.ascontiguousarray(array, dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(out) & (out >= 0)))
    if bad.size:
        raise ValueError(
            f"loss_sizes must be finite and >= 0; {bad.size} bad row{'s' if bad.size > 1 else ''}: "
            f"{format_offenders(bad, out[bad])}. Pass the tokens of each sample that carry loss (labels != -100)"
        )
    column = None if sizes is None else np.asarray(sizes)
    if column is not None and column.ndim == 1 and column.shape[0] == n:
        over = np.flatnonzero(out > column)
        if over.size:
            raise ValueError(
                "loss_sizes must not exceed the sizes (a sample's tokens that carry loss are among its "
                f"tokens); {over.size} bad row{'s' if over.size > 1 else ''}: {format_offenders(over, out[over])} "
                f"over sizes {column[over[:5]].tolist()}. Pass the tokens of each sample that carry loss "
                "(labels != -100), counted in the same units as sizes"
            )
    return out
