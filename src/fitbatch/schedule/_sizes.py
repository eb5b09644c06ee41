"""``BatchSizeSchedule``: the global batch size of every optimizer step.

A schedule maps a *global* step (counted across epochs, as in the PyTorch-XLA emulator's
``trace.csv``) to a positive int: samples per step for a sample-count sampler, real size units
(tokens) per step for a budget sampler. It is built from a trace (CSV ``step,batchsize``), a
list, a constant, a linear ramp-up or a function. A finite schedule says what happens after its
last step with ``on_exhausted``: ``"error"`` (default: a ``ValueError`` naming the step, raised
as soon as the sampler plans an epoch that needs it), ``"hold_last"`` or ``"cycle"``.

>>> import io
>>> trace = BatchSizeSchedule.from_csv(io.StringIO("step,batchsize\\r\\n 0, 32\\r\\n 1, 64\\r\\n"))
>>> trace.values(0, 2).tolist(), len(trace)
([32, 64], 2)
>>> trace(5)
Traceback (most recent call last):
...
ValueError: the batch-size schedule has 2 steps (trace <StringIO>), step 5 was asked for; pass on_exhausted='hold_last' or 'cycle', or extend the trace
>>> BatchSizeSchedule.ramp(32, 32, 256, final=128).values(0, 8).tolist()
[32, 32, 32, 64, 64, 96, 128, 128]
"""

from __future__ import annotations

import csv
import io
import math
import numbers
import os
import re
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Union, cast

import numpy as np
from numpy.typing import NDArray

from fitbatch._validate import choice, non_negative_int, positive_int

IntArray = NDArray[np.int64]
ON_EXHAUSTED = ("error", "hold_last", "cycle")
ScheduleLike = Union["BatchSizeSchedule", int, Sequence[int], str, "os.PathLike[str]", Callable[[int], int]]


class BatchSizeSchedule:
    """Global batch size per optimizer step; build it with one of the class methods.

    ``schedule(step)`` is the size of one step, ``schedule.values(start, count)`` of many at
    once; ``len(schedule)`` is the number of steps of a list or trace (``TypeError`` for
    schedules without an end; :attr:`length` is ``None`` for those).

    >>> BatchSizeSchedule.from_list([8, 16], on_exhausted="hold_last").values(0, 4).tolist()
    [8, 16, 16, 16]
    >>> BatchSizeSchedule.constant(64)(10**9)
    64
    """

    def __init__(
        self,
        *,
        kind: str,
        table: IntArray | None = None,
        fn: Callable[[int], int] | None = None,
        on_exhausted: str = "error",
        rows: IntArray | None = None,
        source: str = "",
        spec: dict[str, Any] | None = None,
    ) -> None:
        # Use the class methods; this constructor trusts its (already validated) arguments.
        self.kind = kind
        self._table = table
        self._fn = fn
        self.on_exhausted = choice("on_exhausted", on_exhausted, ON_EXHAUSTED)
        self._rows = rows  # file line of each trace entry, for error messages
        self.source = source
        self._spec = dict(spec or {})
        # a ramp: stage i has size _stages[i] from step _firsts[i] on
        self._stages: IntArray = np.zeros(0, np.int64)
        self._firsts: IntArray = np.zeros(0, np.int64)

    # ------------------------------------------------------------------ builders

    @classmethod
    def constant(cls, size: int) -> BatchSizeSchedule:
        """The same size at every step."""
        value = int(positive_int("size", size) or 1)
        return cls(kind="constant", table=np.array([value], np.int64), on_exhausted="hold_last",
                   spec={"size": value})

    @classmethod
    def from_list(cls, sizes: Sequence[int] | NDArray[Any], *, on_exhausted: str = "error") -> BatchSizeSchedule:
        """One size per step, from step 0 on (``sizes[k]`` is step k)."""
        values = np.asarray(sizes)
        if values.ndim != 1 or values.size == 0:
            raise ValueError(f"sizes must be a non-empty 1-D sequence of ints, got shape {values.shape}")
        if not np.issubdtype(values.dtype, np.integer):
            if not np.issubdtype(values.dtype, np.floating) or not np.all(values == np.round(values)):
                raise TypeError(f"sizes must be ints, got {values[:3].tolist()!r}...")
        table = values.astype(np.int64)
        _check_positive(table, None, "the list")
        return cls(kind="list", table=table, on_exhausted=on_exhausted, spec=_digest(table))

    @classmethod
    def from_csv(cls, source: str | os.PathLike[str] | io.TextIOBase | Any, *, on_exhausted: str = "error") -> BatchSizeSchedule:
        """A trace file in the PyTorch-XLA emulator's format: ``step,batchsize`` rows.

        The header line is optional: only the first line may be one, text with no number in it
        (``step,batchsize``). Spaces around values, CRLF line ends, a UTF-8 BOM and blank lines
        are tolerated. Steps must be 0, 1, 2, ... in order; sizes positive ints (below 2**63).
        Every row is checked before training starts; errors name the file, the line and the value.

        Raises:
            ValueError: a row that is not two whole numbers, a step out of order, a size < 1
                or too large, no rows, or a file that is not UTF-8 text.
            OSError: the file cannot be read.

        Args:
            source: a path, or an open text file.
            on_exhausted: after the last row: ``"error"``, ``"hold_last"`` or ``"cycle"``.
        """
        if isinstance(source, (str, os.PathLike)):
            name = os.fspath(source)
            with open(name, "rb") as fh:
                text = _decode(fh.read(), name)
        elif hasattr(source, "read"):
            name = str(getattr(source, "name", f"<{type(source).__name__}>"))
            try:
                data = source.read()
            except UnicodeDecodeError as exc:
                raise ValueError(_not_text(name, exc)) from None
            text = _decode(data, name) if isinstance(data, bytes) else str(data).lstrip("\ufeff")
        else:
            raise TypeError(f"source must be a path or an open text file, got {source!r}")
        table, rows = _parse_trace(text, str(name))
        return cls(kind="trace", table=table, on_exhausted=on_exhausted, rows=rows, source=str(name),
                   spec=_digest(table))

    @classmethod
    def ramp(cls, start: int, increment: int, over: int, *, final: int) -> BatchSizeSchedule:
        """Grow from ``start`` to ``final`` by ``increment``, evenly over ``over`` samples.

        Megatron-LM's ``--rampup-batch-size start increment samples`` rule: the size is
        ``start + increment * floor(consumed / (over / n_increments))``, capped at ``final``,
        where ``consumed`` counts the scheduled samples of the earlier steps.
        """
        start_ = int(positive_int("start", start) or 1)
        inc = int(positive_int("increment", increment) or 1)
        total = non_negative_int("over", over)
        final_ = int(positive_int("final", final) or 1)
        if final_ < start_ or (final_ - start_) % inc:
            raise ValueError(
                f"final ({final_}) must be start ({start_}) plus a whole number of increments ({inc})"
            )
        n_inc = (final_ - start_) // inc
        # stage i (size start + i*inc) begins at step firsts[i]
        firsts = np.zeros(n_inc + 1, np.int64)
        consumed, step = 0, 0
        for i in range(n_inc):
            size = start_ + i * inc
            goal = math.ceil((i + 1) * total / n_inc)
            n = max(0, -(-(goal - consumed) // size))
            consumed, step = consumed + n * size, step + n
            firsts[i + 1] = step
        stages = start_ + inc * np.arange(n_inc + 1, dtype=np.int64)
        sched = cls(kind="ramp", on_exhausted="hold_last",
                    spec={"start": start_, "increment": inc, "over": total, "final": final_})
        sched._stages, sched._firsts = stages, firsts
        return sched

    @classmethod
    def from_function(cls, fn: Callable[[int], int]) -> BatchSizeSchedule:
        """``fn(step) -> size`` for every step (checked as it is evaluated)."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        name = getattr(fn, "__qualname__", type(fn).__name__)
        return cls(kind="function", fn=fn, on_exhausted="hold_last", source=name, spec={"name": name})

    @classmethod
    def coerce(cls, value: ScheduleLike) -> BatchSizeSchedule:
        """A schedule from any accepted form: a schedule, an int (constant), a path (CSV
        trace), a sequence (list) or a callable (function)."""
        if isinstance(value, BatchSizeSchedule):
            return value
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return cls.constant(int(value))
        if isinstance(value, (str, os.PathLike)):
            return cls.from_csv(value)
        if callable(value):
            return cls.from_function(value)
        if isinstance(value, (Sequence, np.ndarray)):
            return cls.from_list(cast("Sequence[int]", value))
        raise TypeError(
            "schedule must be a BatchSizeSchedule, an int, a CSV path, a sequence of ints or a "
            f"function step -> size, got {value!r}"
        )

    # ------------------------------------------------------------------ evaluation

    @property
    def length(self) -> int | None:
        """Steps of a list or trace; ``None`` for schedules without an end."""
        return None if self._table is None or self.kind == "constant" else int(self._table.size)

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError(f"a {self.kind} schedule has no end; use .length")
        return self.length

    def __call__(self, step: int) -> int:
        return int(self.values(non_negative_int("step", step), 1)[0])

    def values(self, start: int, count: int) -> IntArray:
        """Sizes of steps ``start .. start + count - 1``."""
        steps = np.arange(start, start + count, dtype=np.int64)
        if self._table is not None:
            n = self._table.size
            if self.kind == "constant" or self.on_exhausted == "hold_last":
                return self._table[np.minimum(steps, n - 1)]
            if self.on_exhausted == "cycle":
                return self._table[steps % n]
            if count and start + count > n:
                raise ValueError(
                    f"the batch-size schedule has {n} steps ({' '.join(filter(None, (self.kind, self.source)))}), step "
                    f"{max(start, n)} was asked for; pass on_exhausted='hold_last' or 'cycle', or "
                    f"extend the {self.kind}"
                )
            return self._table[steps]
        if self.kind == "ramp":
            stage = np.searchsorted(self._firsts, steps, side="right") - 1
            return self._stages[stage]
        fn = self._fn
        if fn is None:
            raise TypeError(f"a {self.kind} schedule needs a function; build it with a class method")
        return np.array([_as_size(fn(s), s) for s in steps.tolist()], np.int64)

    def distinct(self) -> IntArray | None:
        """Every value the schedule can take, when that set is known up front."""
        if self._table is not None:
            return self._table
        if self.kind == "ramp":
            return self._stages
        return None

    def where(self, value: int) -> str:
        """Where ``value`` comes from, for error messages (the first trace line holding it)."""
        if self._table is not None and self.kind != "constant":
            k = int(np.flatnonzero(self._table == value)[0])
            if self._rows is not None:
                return f"{self.source} line {int(self._rows[k])} (step {k})"
            return f"step {k}"
        return f"the {self.kind} schedule"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description (sampler state stores it to detect a changed schedule)."""
        return {"kind": self.kind, "on_exhausted": self.on_exhausted, **self._spec}

    def __repr__(self) -> str:
        spec = ", ".join(f"{k}={v!r}" for k, v in self._spec.items() if k != "crc32")
        return f"BatchSizeSchedule.{self.kind}({spec}, on_exhausted={self.on_exhausted!r})"


def _digest(table: IntArray) -> dict[str, Any]:
    return {"steps": int(table.size), "crc32": zlib.crc32(table.astype("<i8").tobytes())}


def _as_size(value: Any, step: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)) or value < 1:
        raise ValueError(f"the schedule function returned {value!r} for step {step}; expected an int >= 1")
    return int(value)


def _check_positive(table: IntArray, rows: IntArray | None, source: str) -> None:
    bad = np.flatnonzero(table < 1)
    if bad.size:
        where = ", ".join(
            (f"line {int(rows[k])}" if rows is not None else f"step {int(k)}") + f" ({int(table[k])})" for k in bad[:5]
        )
        raise ValueError(f"batch sizes must be >= 1; {bad.size} bad in {source}: {where}")


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(_not_text(name, exc)) from None


def _not_text(name: str, exc: UnicodeDecodeError) -> str:
    return (
        f"{name} is not a UTF-8 text file (byte {exc.start}: {exc.object[exc.start:exc.start + 1]!r}); "
        "expected a CSV trace of 'step,batchsize' rows"
    )


# the largest batch size a trace may hold (int64)
_MAX_SIZE = np.iinfo(np.int64).max


def _parse_trace(text: str, name: str) -> tuple[IntArray, IntArray]:
    sizes: list[int] = []
    rows: list[int] = []
    reader = csv.reader(io.StringIO(text))
    first = True
    try:
        for fields in reader:
            line_no = reader.line_num
            cells = [c.strip() for c in fields]
            if not any(cells):
                continue
            if first and not any(_is_number(c) for c in cells):
                first = False
                continue  # the header: text with no number in it, such as 'step,batchsize'
            first = False
            step, size = _trace_row(cells, fields, f"{name} line {line_no}")
            if step != len(sizes):
                raise ValueError(f"{name} line {line_no}: step {step} out of order; expected step {len(sizes)}")
            sizes.append(size)
            rows.append(line_no)
    except csv.Error as exc:
        raise ValueError(f"{name} line {reader.line_num}: not a CSV row ({exc})") from None
    if not sizes:
        raise ValueError(f"{name} holds no 'step,batchsize' rows")
    table, lines = np.array(sizes, np.int64), np.array(rows, np.int64)
    _check_positive(table, lines, name)
    return table, lines


def _trace_row(cells: list[str], fields: list[str], where: str) -> tuple[int, int]:
    """(step, size) of one row, or ``ValueError`` naming ``where`` and the value refused."""
    expected = f"{where}: expected 'step,batchsize' with two whole numbers"
    if len(cells) != 2:
        raise ValueError(f"{expected}, got {len(cells)} fields {','.join(fields)!r}")
    for what, cell in (("step", cells[0]), ("batch size", cells[1])):
        if not _INT.fullmatch(cell):
            raise ValueError(f"{expected}, got {what} {cell!r}")
    step, size = int(cells[0]), int(cells[1])
    if size > _MAX_SIZE:
        raise ValueError(f"{where}: batch size {cells[1]} is too large (the most is 2**63 - 1)")
    return step, size


_INT = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() also takes '1_000' and '²'


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
