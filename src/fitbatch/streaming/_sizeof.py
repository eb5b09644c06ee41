"""How a stream measures its items: ``sizeof=fn`` per item, or ``sizeof=per_chunk(fn)`` per chunk.

>>> _sizers(len, None)[0]("abc")
3
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._validate import format_offenders
from fitbatch.sizes._coerce import MAX_EXACT


@dataclasses.dataclass(frozen=True)
class PerChunk:
    """A ``sizeof`` that sizes a whole chunk of items at once (built by :func:`per_chunk`).

    Attributes:
        fn: ``items -> sizes``: a list of items in, one number per item out (array-like).

    >>> PerChunk(len).fn([1, 2])
    2
    """

    fn: Callable[[list[Any]], Any]


def per_chunk(fn: Callable[[list[Any]], Any]) -> PerChunk:
    """Mark ``fn`` as sizing a list of items at once, for ``batch_stream(sizeof=...)``.

    A stream reads its source in chunks; one call per chunk is faster than one per item when the
    sizes come from a vectorised computation (a numpy lookup, a tokenizer's batch call).

    Args:
        fn: ``items -> sizes``, one number per item.

    Returns:
        A :class:`PerChunk` to pass as ``sizeof``.

    Raises:
        TypeError: ``fn`` is not callable.

    >>> import numpy as np
    >>> from fitbatch import batch_stream
    >>> lengths = np.array([5, 3, 8, 2])
    >>> list(batch_stream(range(4), sizeof=per_chunk(lambda ids: lengths[ids]), budget=10, cost="sum"))
    [[0, 1], [2, 3]]
    """
    if not callable(fn):
        raise TypeError(f"per_chunk takes a function items -> sizes, got {fn!r}")
    return PerChunk(fn)


def _sizers(
    sizeof: Any, sizeof_batch: Any
) -> tuple[Callable[[Any], float] | None, Callable[[list[Any]], Any] | None]:
    """(per item, per chunk) from ``sizeof`` and the deprecated ``sizeof_batch``: exactly one is set."""
    if sizeof_batch is not None:
        warnings.warn(
            "batch_stream(sizeof_batch=fn) is deprecated since fitbatch 0.2.0 and removed in 0.3.0: "
            "pass sizeof=fitbatch.streaming.per_chunk(fn)",
            DeprecationWarning,
            stacklevel=3,
        )
        if sizeof is not None:
            raise TypeError(
                "pass exactly one of sizeof and sizeof_batch (deprecated: sizeof=per_chunk(fn))"
            )
        sizeof = per_chunk(sizeof_batch)
    if sizeof is None:
        raise TypeError(
            "pass exactly one of sizeof (item -> size) and sizeof=per_chunk(fn) (items -> sizes)"
        )
    if isinstance(sizeof, PerChunk):
        return None, sizeof.fn
    if not callable(sizeof):
        raise TypeError(f"sizeof must be callable (item -> size) or per_chunk(fn), got {sizeof!r}")
    return sizeof, None


def check_sizes(sizes: NDArray[np.float64], first: int) -> None:
    """Refuse sizes of a chunk that are negative, not finite, or above 2**53 (float64 rounds those).

    ``first`` is the stream position of ``sizes[0]``; the message names the items.

    >>> check_sizes(np.array([3.0, 2.0**53 + 2]), 10)
    Traceback (most recent call last):
    ...
    ValueError: sizes must be at most 2**53 = 9007199254740992 (float64 rounds larger integers); bad sizes at stream item 11 (size 9007199254740994.0)
    """
    # min and max propagate NaN: one pass each tells that every size is finite and >= 0
    if sizes.size == 0 or (sizes.min() >= 0 and sizes.max() <= MAX_EXACT):
        return
    if np.isfinite(sizes).all() and (sizes >= 0).all():
        where = np.flatnonzero(sizes > MAX_EXACT)
        reason = f"sizes must be at most 2**53 = {MAX_EXACT} (float64 rounds larger integers)"
    else:
        where = np.flatnonzero(~(np.isfinite(sizes) & (sizes >= 0)))
        reason = "sizes must be non-negative and finite"
    raise ValueError(
        f"{reason}; bad sizes at stream "
        + format_offenders(where + first, sizes[where]).replace("index", "item")
    )


def measure(
    items: list[Any],
    first: int,
    sizeof: Callable[[Any], float] | None,
    sizeof_batch: Callable[[list[Any]], Any] | None,
) -> NDArray[np.float64]:
    """The sizes of a chunk of stream items (``first`` is the position of ``items[0]``), checked.

    A failing ``sizeof`` is re-raised with the stream position of the item (or chunk) it failed on.

    >>> measure(["ab", "c"], 0, len, None).tolist()
    [2.0, 1.0]
    """
    n = len(items)
    if sizeof_batch is not None:
        try:
            raw = np.asarray(sizeof_batch(items))
            if raw.dtype.kind not in "iuf":  # as plan_batches refuses them: no silent casts
                kind = "booleans" if raw.dtype == bool else f"{raw.dtype} values"
                raise TypeError(
                    f"sizeof_batch returned {kind} ({raw.ravel()[:3].tolist()}...); return numbers"
                )
            sizes = raw.astype(np.float64, copy=False)
        except Exception as exc:
            raise located(
                exc, f"sizeof_batch failed on the chunk of stream items {first}..{first + n - 1}"
            ) from exc
        if sizes.shape != (n,):
            raise ValueError(
                f"sizeof_batch returned shape {sizes.shape} for a chunk of {n} items "
                f"(stream items {first}..{first + n - 1}); it must return one number per item"
            )
    else:
        assert sizeof is not None  # batch_stream checks that exactly one is given
        it = iter(items)
        try:
            values = list(map(sizeof, it))  # each item asked once: a sizeof may log or count
        except Exception as exc:
            # `it` stopped just past the failing item
            pos = first + n - operator.length_hint(it) - 1
            raise located(exc, f"sizeof failed on stream item {pos}") from exc
        refuse_types(values, first)
        sizes = np.fromiter(values, dtype=np.float64, count=n)
    check_sizes(sizes, first)
    return sizes


def located(exc: Exception, where: str) -> Exception:
    """The same exception type with the stream position in its message."""
    msg = f"{where}: {type(exc).__name__}: {exc}"
    try:
        return type(exc)(msg)
    except Exception:  # exception types with other constructors
        return RuntimeError(msg)


def refuse_types(values: list[Any], first: int) -> None:
    """Refuse what ``sizeof`` returned unless every value is a real number, as
    :func:`fitbatch.plan_batches` refuses other sizes (``np.fromiter`` reads True as 1.0 and
    ``"3"`` as 3.0, silently). One pass over the values' types, in C.

    >>> refuse_types([3, 2.5, np.int32(4)], 0)
    >>> refuse_types([3, True], 10)
    Traceback (most recent call last):
    ...
    TypeError: sizeof returned the bool True for stream item 11; sizes must be numbers (return the item's length or cost, e.g. an int)
    """
    bad = {
        t for t in set(map(type, values))
        if t in (bool, np.bool_) or issubclass(t, np.complexfloating) or not issubclass(t, (numbers.Real, np.number))
    }
    if bad:
        i = next(i for i, v in enumerate(values) if type(v) in bad)
        what = "the bool" if type(values[i]) in (bool, np.bool_) else type(values[i]).__name__
        raise TypeError(
            f"sizeof returned {what} {values[i]!r} for stream item {first + i}; "
            "sizes must be numbers (return the item's length or cost, e.g. an int)"
        )
