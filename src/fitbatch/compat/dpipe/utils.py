"""``dpipe.batch_iter.utils``: helpers that wrap a function for items of several components.

Each returns a picklable wrapper (usable in ``Loky`` when ``func`` is picklable) that calls
``func`` with the extra arguments given here after those given at the call, as dpipe does:
``unpack_args(f, 1)(xs, 2) == f(*xs, 2, 1)``. :func:`pad_batch_equal` pads with
:mod:`fitbatch.pipeline`'s padding (``combine_pad``).

:func:`random_apply` draws from numpy's global random state, as dpipe does, so that
``np.random.seed`` keeps reproducing a dpipe run (its signature has no seed).

>>> from fitbatch.compat.dpipe import apply_at, unpack_args
>>> apply_at(0, pow, 2)([3, "label"]), unpack_args(divmod)((7, 2))
((9, 'label'), (3, 1))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from fitbatch.pipeline._combiners import _check_ratio, _pad_column

__all__ = ["apply_at", "multiply", "pad_batch_equal", "random_apply", "sample_args", "unpack_args", "zip_apply"]

Func = Callable[..., Any]


def _callable(name: str, func: Any) -> None:
    if not callable(func):
        raise TypeError(f"{name} must be callable, got {func!r}")


def squeeze_first(inputs: Sequence[Any]) -> Any:
    """The only element of a sequence of one, else the sequence (dpipe's helper).

    >>> squeeze_first((5,)), squeeze_first((5, 6))
    (5, (5, 6))
    """
    return inputs[0] if len(inputs) == 1 else inputs


def pad_batch_equal(batch: Sequence[Any], padding_values: Any = 0, ratio: Any = 0.5) -> np.ndarray:
    """Pad every array of ``batch`` to the batch's largest shape and stack them.

    Args:
        batch: arrays (or numbers) of one rank.
        padding_values: the fill value, or a function ``array -> value`` (``numpy.min``).
        ratio: the share of each axis' padding put before the data (a number or one per axis).

    >>> pad_batch_equal([[1, 2, 3], [4]], padding_values=-1)
    array([[ 1,  2,  3],
           [-1,  4, -1]])
    """
    ratios = _check_ratio(ratio.tolist() if isinstance(ratio, np.ndarray) else ratio)
    return _pad_column(list(batch), padding_values, ratios, "batch")


class _Wrapper:
    """A named, picklable call: ``_call(xs, args_, kwargs_)`` supplied by each helper."""

    def __init__(self, name: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.name, self.func, self.args, self.kwargs = name, func, args, kwargs

    def __repr__(self) -> str:
        return f"{self.name}({getattr(self.func, '__qualname__', self.func)!r})"


class _UnpackArgs(_Wrapper):
    def __call__(self, xs: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
        return self.func(*xs, *args, *self.args, **kwargs, **self.kwargs)


class _Multiply(_Wrapper):
    def __call__(self, xs: Iterable[Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return tuple(self.func(x, *args, *self.args, **kwargs, **self.kwargs) for x in xs)


class _ApplyAt(_Wrapper):
    def __init__(self, index: set[int], func: Func, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("apply_at", func, args, kwargs)
        self.index = index

    def __call__(self, xs: Sequence[Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        chosen = {i + len(xs) if i < 0 else i for i in self.index}
        for i in chosen:
            if i < 0 or i >= len(xs):
                raise IndexError(f"Index {i} out of bounds.")
        return tuple(self.func(x, *args, *self.args, **kwargs, **self.kwargs) if i in chosen else x for i, x in enumerate(xs))


class _ZipApply(_Wrapper):
    def __call__(self, xs: Sequence[Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return tuple(f(x, *args, **kwargs, **self.kwargs) for f, x in zip(self.func, xs))


class _RandomApply(_Wrapper):
    def __init__(self, p: float, func: Func, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("random_apply", func, args, kwargs)
        self.p = p

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if np.random.binomial(1, self.p):  # the global state, as dpipe (see the module docstring)
            return self.func(*args, *self.args, **kwargs, **self.kwargs)
        return squeeze_first(args)


class _SampleArgs(_Wrapper):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        drawn = [arg() for arg in self.args]
        named = {name: arg() for name, arg in self.kwargs.items()}
        return self.func(*args, *drawn, **kwargs, **named)


def unpack_args(func: Func, *args: Any, **kwargs: Any) -> Func:
    """``wrapper(xs, *a, **k) = func(*xs, *a, *args, **k, **kwargs)``.

    >>> unpack_args(max, 10)([3, 4])
    10
    """
    _callable("func", func)
    return _UnpackArgs("unpack_args", func, args, kwargs)


def multiply(func: Func, *args: Any, **kwargs: Any) -> Func:
    """``wrapper(xs, *a, **k) = tuple(func(x, *a, *args, **k, **kwargs) for x in xs)``.

    >>> multiply(pow, 2)([3, 4])
    (9, 16)
    """
    _callable("func", func)
    return _Multiply("multiply", func, args, kwargs)


def apply_at(index: int | Sequence[int], func: Func, *args: Any, **kwargs: Any) -> Func:
    """Apply ``func`` (with the extra arguments) to the components at ``index``; keep the others.

    Raises:
        IndexError: when called on an item without a component at ``index``.

    >>> apply_at([0, -1], abs)((-1, -2, -3))
    (1, -2, 3)
    """
    _callable("func", func)
    return _ApplyAt(set(np.atleast_1d(index).tolist()), func, args, kwargs)


def zip_apply(*functions: Func, **kwargs: Any) -> Func:
    """``wrapper(xs, *a, **k) = tuple(f(x, *a, **k, **kwargs) for f, x in zip(functions, xs))``.

    >>> zip_apply(abs, str)([-4, 9])
    (4, '9')
    """
    for f in functions:
        _callable("each function", f)
    return _ZipApply("zip_apply", functions, (), kwargs)


def random_apply(p: float, func: Func, *args: Any, **kwargs: Any) -> Func:
    """With probability ``p``, ``func(*a, *args, **k, **kwargs)``; else the arguments unchanged.

    >>> random_apply(1.0, abs)(-3), random_apply(0.0, abs)(-3)
    (3, -3)
    """
    _callable("func", func)
    return _RandomApply(p, func, args, kwargs)


def sample_args(func: Func, *args: Func, **kwargs: Func) -> Func:
    """Call ``func`` with extra arguments drawn by calling each of ``args`` and ``kwargs``.

    >>> sample_args(round, ndigits=lambda: 1)(2.345)
    2.3
    """
    _callable("func", func)
    for f in (*args, *kwargs.values()):
        _callable("each argument sampler", f)
    return _SampleArgs("sample_args", func, args, kwargs)
