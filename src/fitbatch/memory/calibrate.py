"""Calibration: probe real training steps, fit the batch memory model, recommend a byte budget.

Like an auto-batch-size finder, but per padded length: at each length the count doubles until a
step no longer fits (out of memory, or a measured peak above the capacity), then bisects toward
the largest count that fits. Every probe is a measurement, so the doubling and bisection points
spread over the (count, length) plane and :func:`~fitbatch.memory.fit_batch_model` fits them
all. Probes can be appended to a JSON-lines log, and a later call with the same log reuses
them (resume after a crash, or refit for another capacity without re-running).

>>> import torch
>>> def make_batch(count, length):
...     return torch.zeros(count, length)
>>> def step(batch):                      # peak: 3 tensors of the batch shape
...     (batch + 1) * 2 + 3
>>> cal = calibrate(step, make_batch, device="cpu", capacity="48KiB", lengths=(16, 32, 64),
...                 progress=False)
>>> cal.max_counts
{16: 256, 32: 128, 64: 64}
>>> round(cal.model.mean.per_token, 6), cal.budget == 0.95 * 48 * 1024
(12.0, True)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from fitbatch._validate import fraction, parse_budget, positive_int
from fitbatch.memory.model import BatchMemoryModel, fit_batch_model
from fitbatch.memory.profile import (
    PeakTracker,
    _progress,
    as_device,
    detect_capacity,
    free_memory,
    is_oom_error,
)

logger = logging.getLogger(__name__)

_FIT_FROM = 0.2  # probes peaking under this fraction of the capacity are measured, not fitted


@dataclasses.dataclass(frozen=True)
class Probe:
    """One measured training step.

    Attributes:
        count: samples in the synthetic batch.
        length: their padded length.
        peak: absolute peak bytes (allocator baseline + added; off CUDA, added only), or
            ``None`` when the step ran out of memory.
        seconds: wall time of the step.

    >>> Probe(count=32, length=8, peak=3072.0).fits(4096)
    True
    >>> Probe(count=64, length=8, peak=None).fits(4096)      # ran out of memory
    False
    """

    count: int
    length: int
    peak: float | None
    seconds: float = 0.0

    def fits(self, capacity: float) -> bool:
        """Whether the step completed within ``capacity`` bytes."""
        return self.peak is not None and self.peak <= capacity


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` found.

    Attributes:
        model: the fitted :class:`~fitbatch.memory.BatchMemoryModel` (an upper bound).
        budget: the recommended planning budget in bytes: ``capacity * (1 - headroom)``.
        capacity: the capacity probed against, in bytes.
        probes: every probe used, in the order made (or read from the log).
        max_counts: for each probed length, the largest count that fitted (0: not even one).
        complete: ``False`` when the time limit stopped the search early.

    >>> import torch
    >>> cal = calibrate(lambda batch: (batch + 1) * 2,
    ...                 lambda count, length: torch.zeros(count, length, device="meta"),
    ...                 device="meta", capacity="4KiB", lengths=(8, 16), progress=False)
    >>> cal.max_counts, cal.budget, cal.capacity, cal.complete
    ({8: 42, 16: 21}, 3891.2, 4096.0, True)
    >>> cal.probes[0].count, cal.probes[0].length, cal.probes[0].peak
    (1, 8, 96.0)
    >>> sorted(cal.to_dict())
    ['budget', 'capacity', 'complete', 'max_counts', 'model', 'probes']
    """

    model: BatchMemoryModel
    budget: float
    capacity: float
    probes: tuple[Probe, ...]
    max_counts: dict[int, int]
    complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able summary."""
        return {
            "model": self.model.to_dict(),
            "budget": self.budget,
            "capacity": self.capacity,
            "probes": [dataclasses.asdict(p) for p in self.probes],
            "max_counts": {str(k): v for k, v in self.max_counts.items()},
            "complete": self.complete,
        }


class _TimeUp(Exception):
    pass


class _Prober:
    """Runs (or replays from the log) one probe per (count, length)."""

    def __init__(
        self,
        step_fn: Callable[[Any], Any],
        make_batch: Callable[[int, int], Any],
        device: Any,
        log: str | os.PathLike[str] | None,
        deadline: float | None,
    ) -> None:
        self.step_fn, self.make_batch, self.device = step_fn, make_batch, device
        self.log, self.deadline = log, deadline
        self.cache = _read_log(log)
        self.probes: list[Probe] = []
        self.warm = False

    def __call__(self, count: int, length: int) -> Probe:
        probe = self.cache.get((count, length))
        if probe is None:
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise _TimeUp
            if not self.warm:  # first steps allocate lazily (optimizer state, workspaces)
                self._run(1, length)
                self.warm = True
            probe = self._run(count, length)
            self.cache[(count, length)] = probe
            if self.log is not None:
                with open(self.log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(dataclasses.asdict(probe)) + "\n")
        self.probes.append(probe)
        return probe

    def _run(self, count: int, length: int) -> Probe:
        start = time.monotonic()
        tracker = PeakTracker(self.device)
        oom = False
        try:
            with tracker:
                self.step_fn(self.make_batch(count, length))
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            oom = True
        if oom or self.device.type == "cuda":  # off CUDA, refcounting already freed the step
            free_memory(self.device)
        peak = None if oom else float(tracker.baseline + tracker.peak)
        logger.debug("probe count=%d length=%d peak=%s", count, length, peak)
        return Probe(count, length, peak, time.monotonic() - start)


def _read_log(log: str | os.PathLike[str] | None) -> dict[tuple[int, int], Probe]:
    cache: dict[tuple[int, int], Probe] = {}
    if log is None or not os.path.exists(log):
        return cache
    with open(log, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            try:
                probe = Probe(**json.loads(line))
            except (ValueError, TypeError):
                logger.warning(
                    "calibrate: skipping unreadable line %d of probe log %s", number, log
                )
                continue
            cache[(probe.count, probe.length)] = probe
    logger.info("calibrate: %d probes read from %s", len(cache), log)
    return cache


def _search(
    probe: Callable[[int, int], Probe], length: int, capacity: float, max_count: int
) -> int:
    """Largest count that fits at ``length`` (0 if none), by doubling then bisection."""
    lo, hi, count = 0, 0, 1
    # invariant: counts <= lo fit (lo = 0: none known), counts >= hi do not (hi = 0: none known)
    while True:
        if probe(count, length).fits(capacity):
            lo = count
        else:
            hi = count
        if hi == 0:
            if lo >= max_count:
                return lo
            count = min(2 * lo, max_count)
        elif hi - lo <= max(1, lo // 32):
            return lo
        else:
            count = (lo + hi) // 2


def _fit(probes: list[Probe], capacity: float) -> BatchMemoryModel:
    """Fit the probes that matter for planning: those whose peak is at least a fraction of the capacity.

    Small batches peak where fixed costs do (optimizer temporaries, workspaces): a *maximum*
    of two regimes that no sum of terms fits. Leaving those probes out is safe, since their
    measured peak is already far below the capacity.
    """
    measured = {(p.count, p.length): p for p in probes if p.peak is not None}
    if len(measured) < 4:
        raise RuntimeError(
            f"calibrate completed only {len(measured)} steps, too few to fit the memory model (4 needed); "
            "raise time_limit or capacity, or probe shorter lengths"
        )
    top = min(capacity, max(float(p.peak or 0.0) for p in measured.values()))
    chosen = [p for p in measured.values() if float(p.peak or 0.0) >= _FIT_FROM * top]
    if len(chosen) < 6 or len({p.length for p in chosen}) < 2:
        chosen = list(measured.values())
    return fit_batch_model(
        [p.count for p in chosen],
        [p.length for p in chosen],
        [float(p.peak or 0.0) for p in chosen],
    )


def calibrate(
    step_fn: Callable[[Any], Any],
    make_batch: Callable[[int, int], Any],
    *,
    device: Any,
    capacity: float | str | None = None,
    lengths: Iterable[int] = (128, 256, 512, 1024, 2048),
    max_count: int = 1024,
    headroom: float = 0.05,
    time_limit: float | None = None,
    log: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> Calibration:
    """Probe training steps on synthetic batches, fit the batch model, recommend a budget.

    Args:
        step_fn: one full training step on a batch (forward, backward, optimizer step), leaving
            no state behind (``zero_grad(set_to_none=True)`` at its start or end).
        make_batch: ``make_batch(count, length)`` builds a synthetic batch of ``count`` samples
            padded to ``length``; it runs inside the measurement, so inputs count too.
        device: the device the step runs on (CUDA: allocator peaks; CPU/meta: live tensors).
        capacity: bytes the steps may use (``"70GiB"``); ``None`` detects the device's
            capacity. A step whose peak exceeds it counts as not fitting, even without an OOM.
        lengths: padded lengths to probe.
        max_count: the largest count probed at any length.
        headroom: fraction of the capacity kept free for fragmentation: ``budget =
            capacity * (1 - headroom)``.
        time_limit: seconds after which no new probe starts; the fit uses what was measured.
        log: JSON-lines file of probes; existing probes in it are reused, new ones appended.
        progress: show a tqdm bar (over lengths) when tqdm is installed.

    Probes whose peak is under a fifth of the capacity are kept in ``probes`` but not fitted
    (the model serves batches near the budget; see ``_fit``).

    Returns:
        A :class:`Calibration` with ``model`` and ``budget`` to pass to the planner:
        ``plan_batches(sizes, cal.budget, cost=cal.model)``.

    Raises:
        ValueError: for invalid arguments.
        RuntimeError: if fewer than 4 steps completed, too few to fit the model.

    On the ``meta`` device nothing is allocated, yet every tensor's bytes are counted: a
    step's memory behaviour can be calibrated (and tested) without the accelerator.

    >>> import fitbatch, torch
    >>> def make_batch(count, length):
    ...     return torch.zeros(count, length, device="meta")
    >>> def step(batch):                  # peak: the batch and two results, 12 bytes per token
    ...     return (batch + 1) * 2
    >>> cal = calibrate(step, make_batch, device="meta", capacity="4KiB", lengths=(8, 16),
    ...                 progress=False)
    >>> cal.max_counts, round(cal.model.mean.per_token, 6), cal.budget
    ({8: 42, 16: 21}, 12.0, 3891.2)
    >>> plan = fitbatch.plan_batches([100, 300, 150, 40, 60], cal.budget, cost=cal.model,
    ...                              strategy="sorted")
    >>> plan.to_lists(), plan.costs.tolist()
    ([[3, 4], [0, 2], [1]], [1440.0, 3600.0, 3600.0])
    """
    dev = as_device(device)
    cap = detect_capacity(dev) if capacity is None else parse_budget(capacity, "capacity")
    probe_lengths = sorted({int(positive_int("lengths", v) or 0) for v in lengths})
    if not probe_lengths:
        raise ValueError("lengths must name at least one padded length to probe, got none")
    max_count = int(positive_int("max_count", max_count) or 1)
    headroom = fraction("headroom", headroom, low=0.0, high=0.9)
    if time_limit is not None and (isinstance(time_limit, bool) or not time_limit > 0):
        raise ValueError(
            f"time_limit must be a positive number of seconds or None, got {time_limit!r}"
        )
    deadline = None if time_limit is None else time.monotonic() + float(time_limit)
    prober = _Prober(step_fn, make_batch, dev, log, deadline)
    max_counts: dict[int, int] = {}
    complete = True
    try:
        for length in _progress(
            probe_lengths, total=len(probe_lengths), desc="calibrate", enabled=progress
        ):
            max_counts[length] = _search(prober, length, cap, max_count)
            if max_counts[length] == 0:
                logger.warning(
                    "calibrate: not even one sample of length %d fits in %.4g bytes; "
                    "longer lengths skipped",
                    length,
                    cap,
                )
                break
    except _TimeUp:
        complete = False
        logger.warning(
            "calibrate: time limit of %ss reached after %d probes; fitting what was measured",
            time_limit,
            len(prober.probes),
        )
    model = _fit(prober.probes, cap)
    budget = cap * (1.0 - headroom)
    logger.info(
        "calibrate: %d probes, margin %.2f%%, budget %.4g of capacity %.4g bytes",
        len(prober.probes),
        100 * model.margin,
        budget,
        cap,
    )
    return Calibration(model, budget, cap, tuple(prober.probes), max_counts, complete)
