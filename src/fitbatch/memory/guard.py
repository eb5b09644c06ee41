"""OOMGuard: a training step that survives running out of memory without losing a sample.

``guard.step(batch, loss_fn)`` zeroes the gradients, computes ``loss_fn(batch)`` and its
backward, and steps the optimizer. When that runs out of memory it frees what it can, discards
the partial gradients and recomputes the *same* gradient as 2, 4, 8, ... micro-batches with
gradient accumulation, each micro-batch's loss scaled by its share of the batch's real size
units (tokens, say), so that for a ``loss_fn`` returning the mean loss per unit the result
equals the whole batch's gradient. It then feeds the failure back: a fitted
:class:`~fitbatch.memory.BatchMemoryModel` given as ``cost`` is refitted with the failing
batch (handed to ``sampler.set_cost`` when the sampler has one); otherwise
``sampler.set_budget`` lowers the budget. A sample that does not fit even alone raises
:class:`SampleTooLargeError` naming it.

In data-parallel runs (``torch.distributed`` initialised, world size > 1) every rank runs its
micro-batches without communication (``no_sync`` for ``DistributedDataParallel``), then all
ranks agree, with one small all-reduce, whether any of them failed and into how many parts to
split; only when all succeeded does the guard average the gradients itself. A rank that fails
therefore never leaves the others waiting in a collective, and all ranks take the same
decisions (same budget, same refitted model). The price is that gradient communication no
longer overlaps the backward pass.

>>> import torch
>>> net = torch.nn.Linear(4, 1)
>>> guard = OOMGuard(net, torch.optim.SGD(net.parameters(), lr=0.1))
>>> batch = torch.ones(8, 4)
>>> loss = guard.step(batch, lambda rows: net(rows).pow(2).mean())
>>> guard.steps, guard.ooms
(1, 0)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._state import STEPS_KEY, StateSchema
from fitbatch._validate import fraction, parse_budget, positive_int
from fitbatch.costs import CostModel
from fitbatch.memory._guard_split import _batch_len, accumulate, sample_units
from fitbatch.memory._guard_sync import (
    agree,
    gather_failure,
    least_budget,
    max_over_ranks,
    no_sync,
    reduce_gradients,
)
from fitbatch.memory.model import BatchMemoryModel, load_memory_model
from fitbatch.memory.profile import PeakTracker, free_memory

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

STATE = StateSchema("OOMGuard", version=1, required=(STEPS_KEY, "ooms", "clean_steps", "window_peak", "cost"))
_GROW_TARGET = 0.95  # grow the budget while peaks stay below this fraction of the capacity
_GROW_STEP = 1.10  # at most +10 % per window


class SampleTooLargeError(RuntimeError):
    """A single sample runs out of memory on its own: splitting cannot help.

    Attributes:
        position: its position in the batch given to :meth:`OOMGuard.step` (``None`` when it
            was on another rank).
        sample_id: its id from ``ids=`` (or the position when no ids were given).
        units: its size in real size units.

    >>> import torch
    >>> from fitbatch.memory import OOMGuard, SampleTooLargeError
    >>> net = torch.nn.Linear(1, 1)
    >>> guard = OOMGuard(net, size_fn=lambda row: float(row[0]))  # a row holds its sample's length
    >>> def loss_fn(rows):  # pretend that more than 10 size units run out of memory
    ...     if rows.sum() > 10:
    ...         raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
    ...     return net(rows).mean()
    >>> try:
    ...     guard.step(torch.tensor([[12.0]]), loss_fn, ids=["doc-7"])
    ... except SampleTooLargeError as error:
    ...     print(error.position, error.sample_id, error.units)
    0 doc-7 12.0
    """

    def __init__(
        self,
        message: str,
        *,
        position: int | None = None,
        sample_id: Any = None,
        units: float | None = None,
    ) -> None:
        super().__init__(message)
        self.position, self.sample_id, self.units = position, sample_id, units


@dataclasses.dataclass(frozen=True)
class OOMEvent:
    """One step that ran out of memory and was recovered (kept in ``OOMGuard.events``).

    Attributes:
        step: the guard's step number (0-based).
        count: samples in this rank's batch.
        units: their total real size units.
        max_units: the largest sample's units (the padded length when units are lengths).
        parts: micro-batches the step finally used.
        budget_before: the sampler's budget before feedback (``None``: no sampler budget).
        budget_after: after feedback.
        refit: whether the memory model was refitted.

    >>> event = OOMEvent(step=3, count=4, units=16.0, max_units=6.0, parts=2,
    ...                  budget_before=16.0, budget_after=14.4, refit=False)
    >>> f"step {event.step}: {event.count} samples recovered as {event.parts} micro-batches"
    'step 3: 4 samples recovered as 2 micro-batches'
    """

    step: int
    count: int
    units: float
    max_units: float
    parts: int
    budget_before: float | None
    budget_after: float | None
    refit: bool


class OOMGuard:
    """Runs training steps that split themselves on out-of-memory errors.

    Args:
        model: the ``torch.nn.Module`` trained (possibly ``DistributedDataParallel``); its
            gradients are zeroed at the start of every step.
        optimizer: stepped after the gradient is complete; ``None`` leaves that to the caller.
        sampler: an object with ``budget`` and ``set_budget(new)`` (and optionally
            ``set_cost(model)``), told about failures and, with ``grow_after``, headroom.
        size_fn: real size units of one sample (tokens, say), used to weight micro-batch
            losses; ``None`` counts every sample as 1 (for a per-sample mean loss).
        cost: the cost model the batches were planned with; a fitted
            :class:`~fitbatch.memory.BatchMemoryModel` is refitted with each failing batch.
            It measures batches in ``size_fn``'s units, so it needs ``size_fn``.
        capacity: bytes the steps may use; the failing point's peak when refitting (default:
            the sampler's budget) and the ceiling for ``grow_after``.
        backoff: factor applied to the budget (or to the failing batch's cost, if lower)
            when a batch runs out of memory.
        grow_after: after this many consecutive steps without failure whose peaks stayed
            under 95 % of ``capacity``, raise the sampler's budget (by at most 10 %). Needs
            ``capacity``; ``None`` never grows.

    Raises:
        TypeError: if ``model`` is not a ``torch.nn.Module`` or ``size_fn`` not callable.
        ValueError: for a ``backoff`` outside (0, 1), ``grow_after`` without ``capacity``, or
            ``cost`` without ``size_fn``.

    A step of 8 samples that runs out of memory is recomputed as 2 micro-batches of 4, and the
    sampler's budget is lowered by ``backoff`` for the next epochs:

    >>> import torch
    >>> import fitbatch
    >>> sampler = fitbatch.BudgetBatchSampler([1] * 8, 8, cost="sum", shuffle=False)
    >>> net = torch.nn.Linear(2, 1)
    >>> guard = fitbatch.OOMGuard(net, torch.optim.SGD(net.parameters(), lr=0.1), sampler=sampler)
    >>> def loss_fn(rows):  # pretend that more than 4 rows run out of memory
    ...     if len(rows) > 4:
    ...         raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
    ...     return net(rows).pow(2).mean()
    >>> data = torch.ones(8, 2)
    >>> for batch in sampler:
    ...     loss = guard.step(data[batch], loss_fn)
    >>> guard.steps, guard.ooms, guard.events[0].parts, sampler.budget
    (1, 1, 2, 7.2)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        sampler: Any = None,
        size_fn: Callable[[Any], float] | None = None,
        cost: CostModel | None = None,
        capacity: float | str | None = None,
        backoff: float = 0.9,
        grow_after: int | None = None,
    ) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if size_fn is not None and not callable(size_fn):
            raise TypeError(f"size_fn must be callable or None, got {size_fn!r}")
        if cost is not None and not isinstance(cost, CostModel):
            raise TypeError(f"cost must be a fitbatch CostModel or None, got {cost!r}")
        if cost is not None and size_fn is None:  # a sample would count as size 1 in the model
            raise ValueError(
                "cost= measures the failing batches in size units: pass size_fn= too (a sample's "
                "tokens, say), or leave cost out to lower the budget by backoff alone"
            )
        backoff = fraction("backoff", backoff)
        if not 0.0 < backoff < 1.0:
            raise ValueError(f"backoff must be strictly between 0 and 1, got {backoff!r}")
        self.capacity = None if capacity is None else parse_budget(capacity, "capacity")
        self.grow_after = positive_int("grow_after", grow_after, allow_none=True)
        if self.grow_after is not None and self.capacity is None:
            raise ValueError(
                "grow_after needs capacity= (bytes or '70GiB') to know how much room there is"
            )
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self.size_fn, self.cost, self.backoff = size_fn, cost, backoff
        self.events: list[OOMEvent] = []
        self.steps = 0
        self.ooms = 0
        self._clean_steps = 0
        self._window_peak = 0.0
        param = next(iter(model.parameters()), None)
        self.device = param.device if param is not None else torch.device("cpu")
        if getattr(model, "broadcast_buffers", False) and any(True for _ in model.buffers()):
            logger.warning(
                "OOMGuard: DistributedDataParallel(broadcast_buffers=True) broadcasts buffers in "
                "every forward, so ranks that split differently would desynchronise; "
                "wrap the model with broadcast_buffers=False"
            )

    # ------------------------------------------------------------------ public protocol

    def step(
        self,
        batch: Any,
        loss_fn: Callable[[Any], torch.Tensor],
        *,
        ids: Sequence[Any] | None = None,
    ) -> torch.Tensor:
        """One training step on ``batch``, split into micro-batches if it runs out of memory.

        Args:
            batch: a list or tuple of samples, a tensor (split along dim 0) or a mapping of
                per-row tensors or lists (split along their first dimension). Pass samples
                uncollated and collate inside ``loss_fn`` so that micro-batches are padded
                only to their own longest sample.
            loss_fn: ``loss_fn(micro_batch)`` returns the scalar mean loss per size unit of
                the samples it is given (the usual mean over tokens, or over samples when
                ``size_fn`` is ``None``).
            ids: dataset ids of the samples, used in messages only.

        Returns:
            The whole batch's loss (detached).

        Raises:
            SampleTooLargeError: if a single sample runs out of memory on its own.
        """
        n = _batch_len(batch)
        if ids is not None and len(ids) != n:
            raise ValueError(f"ids has {len(ids)} entries for a batch of {n} samples; pass one id per sample, or none")
        units = sample_units(batch, n, self.size_fn)
        total = float(units.sum())
        order = np.argsort(-units, kind="stable")  # similar sizes together: less padding
        tracker = (
            PeakTracker(self.device) if self.grow_after is not None else contextlib.nullcontext()
        )
        parts, retried, whole_failed = 1, False, False
        with tracker:
            while True:
                self.model.zero_grad(set_to_none=True)
                loss, failed = accumulate(
                    batch, loss_fn, units, total, order, parts, no_sync(self.model)
                )
                fatal, request = agree(failed, parts, n, self.device)
                if not fatal and request == 0:
                    break
                loss = None
                self.model.zero_grad(set_to_none=True)
                free_memory(self.device)
                if fatal:
                    self._raise_too_large(failed, units, ids)
                logger.info(
                    "OOMGuard: step %d ran out of memory as %d part(s); retrying as %d",
                    self.steps,
                    parts,
                    request,
                )
                whole_failed = whole_failed or (parts == 1 and failed is not None)
                retried, parts = True, request
        if retried:  # (a rank asks for at least twice the parts; a batch splits into n at most)
            self._feedback(n, units, min(parts, n), failed_here=whole_failed)
        reduce_gradients(self.model)
        if self.optimizer is not None:
            self.optimizer.step()
        if isinstance(tracker, PeakTracker):
            self._track(float(tracker.baseline + tracker.peak), clean=not retried)
        self.steps += 1
        return loss  # type: ignore[no-any-return]  # the loop leaves only on success

    __call__ = step

    def wrap(self, loss_fn: Callable[[Any], torch.Tensor]) -> Callable[[Any], torch.Tensor]:
        """``guard.wrap(loss_fn)(batch)`` is ``guard.step(batch, loss_fn)``: a guarded step function."""

        def guarded(batch: Any) -> torch.Tensor:
            return self.step(batch, loss_fn)

        return guarded

    def state_dict(self) -> dict[str, Any]:
        """Counters, the growth window and a refitted memory model, as plain data."""
        return STATE.envelope(
            steps=self.steps,
            ooms=self.ooms,
            clean_steps=self._clean_steps,
            window_peak=self._window_peak,
            cost=self.cost.to_dict() if isinstance(self.cost, BatchMemoryModel) else None,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (events are not kept in state)."""
        STATE.check(state)
        for key in (STEPS_KEY, "ooms", "clean_steps"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"OOMGuard state key {key!r} must be an int >= 0, got {value!r}; pass what state_dict() returned, unchanged")
        peak = state["window_peak"]
        if isinstance(peak, bool) or not isinstance(peak, (int, float, np.number)) or not np.isfinite(peak) or peak < 0:
            raise ValueError(f"OOMGuard state key 'window_peak' must be a number >= 0, got {peak!r}; pass what state_dict() returned, unchanged")
        self.steps, self.ooms = int(state[STEPS_KEY]), int(state["ooms"])
        self._clean_steps, self._window_peak = (
            int(state["clean_steps"]),
            float(state["window_peak"]),
        )
        if state["cost"] is not None:
            self.cost = load_memory_model(dict(state["cost"]))

    # ---------------------------------------------------------------------- internals

    def _raise_too_large(
        self,
        failed: NDArray[np.int64] | None,
        units: NDArray[np.float64],
        ids: Sequence[Any] | None,
    ) -> None:
        if failed is None or len(failed) != 1:
            raise SampleTooLargeError(
                "OOMGuard: a sample on another rank runs out of memory even alone; "
                "see that rank's error"
            )
        pos = int(failed[0])
        sample_id = ids[pos] if ids is not None else pos
        raise SampleTooLargeError(
            f"OOMGuard: sample {sample_id!r} (position {pos} of the batch, {units[pos]:g} size units) "
            "runs out of memory even alone; drop or truncate such samples before batching, "
            "or give the step more memory",
            position=pos,
            sample_id=sample_id,
            units=float(units[pos]),
        )

    def _lower_budget(self, budget: float, wanted: float) -> float:
        """Set ``wanted`` on the sampler, or, where it refuses (its longest sample would cost more
        than that alone, under ``oversized="error"``), the least budget that still holds every
        sample alone; the budget it set. The step that failed is recovered either way."""
        try:
            self.sampler.set_budget(wanted)
            return wanted
        except ValueError as exc:
            least = least_budget(self.sampler)
            logger.warning(
                "OOMGuard: the sampler refused the budget %g (%s); %s", wanted, exc,
                f"set {least:g}, which holds its longest sample alone" if least is not None and least < budget
                else "kept the budget (split steps recover such batches)",
            )
            if least is None or least >= budget:
                return budget
            self.sampler.set_budget(least)
            return least

    def _feedback(
        self, n: int, units: NDArray[np.float64], parts: int, *, failed_here: bool
    ) -> None:
        """Refit the model or lower the budget, from the failures of all ranks (same result everywhere)."""
        self.ooms += 1
        self._clean_steps, self._window_peak = 0, 0.0
        rows = gather_failure(
            [float(failed_here), n, float(units.max()), float(units.sum())], self.device
        )
        rows = rows[rows[:, 0] > 0]
        budget = getattr(self.sampler, "budget", None)
        new_budget = budget
        refit = False
        peak = self.capacity if self.capacity is not None else budget
        if isinstance(self.cost, BatchMemoryModel) and peak is not None and len(rows):
            before, self.cost = self.cost, self.cost.refit(rows[:, 1], rows[:, 2], np.full(len(rows), float(peak)))
            set_cost = getattr(self.sampler, "set_cost", None)
            if callable(set_cost):
                try:
                    set_cost(self.cost)
                    refit = True
                except ValueError as exc:  # a sample would cost more than the budget alone
                    logger.warning("OOMGuard: the sampler refused the refitted model (%s); lowering the budget instead", exc)
                    self.cost = before
        if not refit and budget is not None and callable(getattr(self.sampler, "set_budget", None)):
            target = float(budget)
            if self.cost is not None and len(rows):
                failing = self.cost.evaluate(rows[:, 1], rows[:, 2], rows[:, 3])
                target = min(target, float(failing.min()))
            new_budget = self._lower_budget(float(budget), target * self.backoff)
        event = OOMEvent(
            self.steps,
            n,
            float(units.sum()),
            float(units.max()),
            parts,
            None if budget is None else float(budget),
            None if new_budget is None else float(new_budget),
            refit,
        )
        self.events.append(event)
        logger.warning(
            "OOMGuard: step %d (%d samples, %g units, longest %g) ran out of memory; recovered as %d "
            "micro-batches, no sample lost; budget %s -> %s%s",
            event.step,
            n,
            event.units,
            event.max_units,
            parts,
            budget,
            new_budget,
            ", memory model refitted" if refit else "",
        )

    def _track(self, peak: float, *, clean: bool) -> None:
        """Grow the budget after ``grow_after`` clean steps with steady headroom."""
        if not clean:
            return
        self._clean_steps += 1
        self._window_peak = max(self._window_peak, peak)
        if self.grow_after is None or self._clean_steps < self.grow_after:
            return
        window_peak = max_over_ranks(self._window_peak, self.device)
        self._clean_steps, self._window_peak = 0, 0.0
        budget = getattr(self.sampler, "budget", None)
        assert self.capacity is not None  # checked in __init__ with grow_after
        target = _GROW_TARGET * self.capacity
        if (
            budget is None
            or not callable(getattr(self.sampler, "set_budget", None))
            or window_peak <= 0
        ):
            return
        factor = min(_GROW_STEP, target / window_peak)
        if factor > 1.01:
            new_budget = float(budget) * factor
            self.sampler.set_budget(new_budget)
            logger.info(
                "OOMGuard: peaks stayed under %.4g bytes for %d steps; budget %s -> %.6g",
                window_peak,
                self.grow_after,
                budget,
                new_budget,
            )
