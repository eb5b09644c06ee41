"""``ScheduledBatchSampler``: micro-batches that follow a global batch-size schedule.

Step s of the schedule (counted across epochs) consumes ``schedule(s)`` samples (or size units,
with a budget as ``micro_batch_size``) over all ranks, as an equal number of micro-batches on
every rank; see :mod:`fitbatch.schedule._layout` for the split and the rounding rule. The
sampler yields this rank's micro-batches as lists of int (a ``DataLoader`` ``batch_sampler``);
:meth:`with_info` and :meth:`infos` give, for each, a :class:`MicroBatchInfo` with what a
:class:`~fitbatch.schedule.GradientAccumulator` needs: whether it closes its step, and the step's samples
real units and loss units summed over all ranks (computed from the shared plan, without
communication).

Epoch end: when the samples left cannot fill the next step, ``drop_last=True`` drops them and
``drop_last=False`` (default) runs them as a final, smaller step (split like an ``"uneven"``
size; the few samples that cannot give every rank an equal count are dropped). Dropped samples
are counted in ``plan().stats()`` and logged.

>>> trace = BatchSizeSchedule.from_list([2, 4], on_exhausted="hold_last")
>>> sampler = ScheduledBatchSampler(9, trace, micro_batch_size=2, shuffle=False, drop_last=True)
>>> [(batch, info.step, info.closes_step) for batch, info in sampler.with_info()]
[([0, 1], 0, True), ([2, 3], 1, False), ([4, 5], 1, True)]
>>> len(sampler), sampler.plan().stats().dropped
(3, 3)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import numbers
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from fitbatch._rng import SeedLike, resolve_seed
from fitbatch._state import (
    CONFIG_KEY,
    DIGEST,
    EPOCH_KEY,
    MICRO_KEY,
    N_SAMPLES_KEY,
    NUM_REPLICAS_KEY,
    SIZES_DIGEST_KEY,
    StateSchema,
    integer,
    mapping,
)
from fitbatch._validate import choice, non_negative_int, parse_budget, positive_int
from fitbatch._validate import loss_sizes as check_loss_sizes
from fitbatch.epoch._world import shared_seed, world_info
from fitbatch.plan._planner import PlanOptions
from fitbatch.sampler._budget import TorchBatchSampler
from fitbatch.sampler._protocol import PlanSampler, RankLayout
from fitbatch.schedule._layout import ROUNDING, Layout, budget_layout, round_sizes, sample_layout
from fitbatch.schedule._sizes import BatchSizeSchedule, ScheduleLike
from fitbatch.sizes import Sizes, SizesLike, as_sizes

logger = logging.getLogger(__name__)

FIRST_STEP_KEY = "first_step"


@dataclasses.dataclass(frozen=True)
class MicroBatchInfo:
    """Where one micro-batch stands in its optimizer step (the same on every rank but ``samples``/``units``).

    Attributes:
        epoch: the epoch.
        step: the global step (counted across epochs; the schedule's step).
        micro: index of this micro-batch within the step, on this rank.
        n_micro: micro-batches per rank in this step.
        samples, units: this rank's samples and real size units in this micro-batch.
        step_samples, step_units: samples and real units of the whole step, all ranks.
        scheduled: the schedule's size for this step (after rounding).
        world: number of ranks.
        loss_units, step_loss_units: tokens that carry loss (the sampler's ``loss_sizes``) in
            this micro-batch and in the whole step (all ranks, all micro-batches); equal to
            ``units`` and ``step_units`` when the sampler has no ``loss_sizes``.

    >>> from fitbatch.schedule import ScheduledBatchSampler
    >>> sampler = ScheduledBatchSampler([3, 5, 2, 6], 4, micro_batch_size=2, shuffle=False)
    >>> for batch, info in sampler.with_info():
    ...     print(batch, info)
    [0, 1] MicroBatchInfo(epoch=0, step=0, micro=0, n_micro=2, samples=2, units=8.0, step_samples=4,
                          step_units=16.0, scheduled=4, world=1, loss_units=8.0, step_loss_units=16.0)
    [2, 3] MicroBatchInfo(epoch=0, step=0, micro=1, n_micro=2, samples=2, units=8.0, step_samples=4,
                          step_units=16.0, scheduled=4, world=1, loss_units=8.0, step_loss_units=16.0)
    >>> info.opens_step, info.closes_step
    (False, True)
    """

    epoch: int
    step: int
    micro: int
    n_micro: int
    samples: int
    units: float
    step_samples: int
    step_units: float
    scheduled: int
    world: int
    loss_units: float | None = None
    step_loss_units: float | None = None

    @property
    def opens_step(self) -> bool:
        return self.micro == 0

    @property
    def closes_step(self) -> bool:
        return self.micro == self.n_micro - 1


class ScheduledBatchSampler(PlanSampler, TorchBatchSampler):  # type: ignore[misc,valid-type]
    """Yield micro-batches whose steps follow a batch-size schedule.

    A :class:`~fitbatch.sampler._budget.PlanSampler` whose rows are micro-batches: ``len()``, ``plan()``
    and the state's ``micro`` count micro-batches, ``step_totals()`` optimizer steps.

    Args:
        sizes: the number of samples, or one size per sample (real units, e.g. tokens, used
            for ``info.step_units`` and by a budget).
        schedule: a :class:`BatchSizeSchedule` or any form :meth:`BatchSizeSchedule.coerce`
            accepts (int, CSV path, list, function): samples per step when
            ``micro_batch_size`` is an int, real size units per step when it is a budget.
        micro_batch_size: what one micro-batch on one rank may hold: an int is its most
            samples; a budget (a string such as ``"64KiB"`` or ``"4096"``, or a
            :class:`~fitbatch.plan.PlanOptions` whose ``seed`` and ``shuffle`` this sampler's
            replace) is its most cost: micro-batches are then planned by the core planner and
            grouped into steps of at most ``schedule(s)`` real units.
        micro_budget: deprecated, removed in 0.3.0: pass the budget as ``micro_batch_size``.
        num_replicas: data-parallel world size; read from ``torch.distributed`` when omitted.
        rank: this process's rank; read from ``torch.distributed`` when omitted.
        shuffle: shuffle the epoch; its random order comes from ``(seed, epoch)`` only.
        seed: the seed of that order.
        drop_last: drop the epoch's last samples that cannot fill a whole step (see module doc).
        rounding: sample-count sizes that do not split evenly: ``"error"`` (default), ``"down"``,
            ``"up"`` or ``"uneven"`` (see ``fitbatch.schedule._layout.ROUNDING``).
        loss_sizes: optional, per sample, the tokens that carry loss (labels != -100): they do
            not change the micro-batches; ``info.step_loss_units`` and
            ``step_totals().loss_units`` sum them over the step (for
            ``GradientAccumulator(normalize="loss_tokens")``); part of the state's ``sizes_digest``.

    Raises:
        ValueError: a schedule value that cannot be split (naming the trace line), a schedule
            that runs out during epoch 0 with ``on_exhausted="error"``, or bad options.
        TypeError: a ``micro_batch_size`` that is neither an int nor a budget.

    A budget as ``micro_batch_size``: padded micro-batches of cost at most 8, 16 tokens a step:

    >>> tokens = ScheduledBatchSampler([3, 5, 2, 6], 16, micro_batch_size="8", shuffle=False)
    >>> list(tokens), tokens.step_totals().units.tolist()
    ([[3], [1], [0, 2]], [16.0])
    """

    STATE = StateSchema(
        "sampler",
        version=2,
        required={
            EPOCH_KEY: integer(),
            MICRO_KEY: integer(),  # micro-batches of the epoch consumed
            FIRST_STEP_KEY: integer(),  # the global step the epoch begins at
            NUM_REPLICAS_KEY: integer(1),
            N_SAMPLES_KEY: integer(),
            SIZES_DIGEST_KEY: DIGEST,
            CONFIG_KEY: mapping,
        },
    )
    CURSOR_KEY = MICRO_KEY
    CONFIG_NAME = "schedule or options"
    SHARES_PLAN = True

    def __init__(
        self,
        sizes: int | SizesLike,
        schedule: ScheduleLike,
        *,
        micro_batch_size: int | str | PlanOptions | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: SeedLike = 0,
        drop_last: bool = False,
        rounding: str = "error",
        micro_budget: float | str | PlanOptions | None = None,
        loss_sizes: Any = None,
    ) -> None:
        if micro_budget is not None:
            warnings.warn(
                "ScheduledBatchSampler(micro_budget=...) is deprecated and will be removed in 0.3.0; "
                "pass the budget as micro_batch_size= (a string such as '64KiB', or a PlanOptions)",
                DeprecationWarning,
                stacklevel=2,
            )
        if isinstance(sizes, (int, np.integer)) and not isinstance(sizes, bool):
            self._sizes = Sizes(np.ones(non_negative_int("sizes", sizes), np.float64), True)
        else:
            self._sizes = as_sizes(sizes)
        self._loss = check_loss_sizes(loss_sizes, len(self._sizes), self._sizes.values)
        self.schedule = BatchSizeSchedule.coerce(schedule)
        self.num_replicas, self.rank = world_info(num_replicas, rank)
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self.shuffle, self.drop_last = shuffle, drop_last
        self.seed = resolve_seed(shared_seed(seed, self.num_replicas))
        self.rounding = choice("rounding", rounding, ROUNDING)
        self.micro_batch_size, self._opts = self._resolve_micro(micro_batch_size, micro_budget)
        self._first: dict[int, int] = {0: 0}  # epoch -> its first global step
        self._cache: Layout | None = None
        values = self.schedule.distinct()
        if values is not None and self._opts is None:  # every trace row, before any training
            round_sizes(self.schedule, values, self.micro_batch_size or 1, self.num_replicas, self.rounding, None)
        self.layout(0)  # fail early: epoch 0 must be plannable

    def _resolve_micro(self, size: Any, budget: Any) -> tuple[int | None, PlanOptions | None]:
        """(samples per micro-batch, None) for an int, (None, planning options) for a budget."""
        if (size is None) == (budget is None):
            raise ValueError(
                "pass exactly one of micro_batch_size (an int: samples per micro-batch, or a budget such "
                "as '64KiB' or a PlanOptions) and the deprecated micro_budget"
            )
        if budget is None and not isinstance(size, (str, PlanOptions)):
            if isinstance(size, bool) or not isinstance(size, numbers.Integral):
                raise TypeError(
                    "micro_batch_size must be an int (samples per micro-batch), a budget string such "
                    f"as '64KiB' or a PlanOptions, got {size!r}"
                )
            return positive_int("micro_batch_size", size), None
        name, budget = ("micro_budget", budget) if budget is not None else ("micro_batch_size", size)
        if self.rounding != "error":
            raise ValueError("rounding applies to sample counts (an int micro_batch_size), not to a budget")
        if isinstance(budget, PlanOptions):
            return None, dataclasses.replace(budget, seed=self.seed, shuffle=self.shuffle)
        return None, PlanOptions.build(parse_budget(budget, name), seed=self.seed, shuffle=self.shuffle)

    # ------------------------------------------------------------------ plans

    def first_step(self, epoch: int | None = None) -> int:
        """The global step the epoch starts at (steps of all earlier epochs)."""
        epoch = self._epoch(epoch)
        known = max(e for e in self._first if e <= epoch)
        while known < epoch:
            self._first[known + 1] = self._first[known] + self.layout(known).n_steps
            known += 1
        return self._first[epoch]

    def layout(self, epoch: int | None = None) -> Layout:
        """The epoch's shared layout of micro-batches and steps (all ranks)."""
        epoch = self._epoch(epoch)
        if self._cache is not None and self._cache.epoch == epoch:
            return self._cache
        first = self.first_step(epoch)
        if self._opts is None:
            lay = sample_layout(
                self.schedule, self._sizes, micro=self.micro_batch_size or 1, world=self.num_replicas,
                rounding=self.rounding, seed=self.seed, epoch=epoch, first_step=first,
                shuffle=self.shuffle, drop_last=self.drop_last, loss=self._loss,
            )
        else:
            lay = budget_layout(
                self.schedule, self._sizes, self._opts, world=self.num_replicas, epoch=epoch,
                first_step=first, drop_last=self.drop_last, loss=self._loss,
            )
        self._first[epoch + 1] = first + lay.n_steps
        self._cache = lay
        return lay

    def _layout(self, epoch: int) -> RankLayout:
        # plan(): this rank's micro-batches in order; its stats count the dropped samples
        lay = self.layout(epoch)
        return RankLayout(lay.plan.select(lay.grid[:, self.rank]), lay.step_samples, lay.step_units, 0, lay.step_loss_units)

    def num_steps(self, epoch: int | None = None) -> int:
        """Optimizer steps in the epoch."""
        return self.layout(epoch).n_steps

    # ------------------------------------------------------------------ iteration

    def with_info(self) -> Iterator[tuple[list[int], MicroBatchInfo]]:
        """Iterate like ``iter(sampler)``, pairing each micro-batch with its :class:`MicroBatchInfo`.

        >>> sampler = ScheduledBatchSampler(8, 4, micro_batch_size=2, shuffle=False, num_replicas=1, rank=0)
        >>> [(batch, info.step, info.closes_step) for batch, info in sampler.with_info()][:2]
        [([0, 1], 0, False), ([2, 3], 0, True)]
        """
        return ((batch, self._info(self.layout(), row)) for row, batch in self._rows())

    def infos(self) -> list[MicroBatchInfo]:
        """The infos of the micro-batches the next iteration yields, in order.

        Call it before iterating a ``DataLoader`` over this sampler, then
        ``zip(loader, infos)``: the iteration takes the resume cursor when it starts.
        """
        lay = self.layout()
        return [self._info(lay, row) for row in range(self._start, lay.n_rows)]

    def _info(self, lay: Layout, row: int) -> MicroBatchInfo:
        k = int(np.searchsorted(lay.step_rows, row, side="right")) - 1
        b = int(lay.grid[row, self.rank])
        return MicroBatchInfo(
            epoch=lay.epoch,
            step=lay.first_step + k,
            micro=row - int(lay.step_rows[k]),
            n_micro=int(lay.step_rows[k + 1] - lay.step_rows[k]),
            samples=int(lay.plan.counts[b]),
            units=float(lay.plan.real_units[b]),
            step_samples=int(lay.step_samples[k]),
            step_units=float(lay.step_units[k]),
            scheduled=int(lay.scheduled[k]),
            world=self.num_replicas,
            loss_units=float(lay.plan.loss_units[b]),
            step_loss_units=float(lay.step_loss_units[k]),
        )

    # ------------------------------------------------------------------ state

    def _config(self) -> dict[str, Any]:
        config = {
            "schedule": self.schedule.to_dict(),
            "micro_batch_size": self.micro_batch_size,
            "micro_budget": None if self._opts is None else self._opts.to_dict(),
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "rounding": self.rounding,
        }
        normalised: dict[str, Any] = json.loads(json.dumps(config))  # compare as JSON stores it
        return normalised

    def _extra_state(self) -> dict[str, Any]:
        return {FIRST_STEP_KEY: self.first_step()}

    def state_dict(self, *, micro: int | None = None) -> dict[str, Any]:
        """A JSON-able state: ``epoch`` and ``micro`` (micro-batches of the epoch consumed).

        Args:
            micro: micro-batches the training loop completed in this epoch. Defaults to those
                the latest iterator handed out; with a prefetching ``DataLoader`` pass the
                loop's own count. Checkpoint at a step boundary (after ``info.closes_step``).

        >>> sampler = ScheduledBatchSampler(8, 4, micro_batch_size=2, num_replicas=1, rank=0)
        >>> state = sampler.state_dict(micro=2)
        >>> state["epoch"], state["micro"], state["first_step"]
        (0, 2, 0)
        """
        return self._save_state(micro)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where ``state`` was taken: re-plans the epoch, no replay.

        Raises:
            ValueError: a state of another kind or version, a value of the wrong type or range,
                other samples (count or ``sizes_digest``), world size, schedule or options, a
                ``first_step`` that is not where this schedule begins the epoch, or a ``micro``
                beyond the epoch's micro-batches.

        >>> sampler = ScheduledBatchSampler(8, 4, micro_batch_size=2, shuffle=False, num_replicas=1, rank=0)
        >>> sampler.load_state_dict(sampler.state_dict(micro=2))
        >>> list(sampler)
        [[4, 5], [6, 7]]
        """
        epoch, micro = self._check_state(state)
        if state[NUM_REPLICAS_KEY] != self.num_replicas:
            raise ValueError(
                f"state was saved with {state[NUM_REPLICAS_KEY]} ranks, this sampler has {self.num_replicas}; "
                "resuming a schedule with another world size is not supported"
            )
        first = self.first_step(epoch)  # derived from the schedule: the saved one must agree
        if state[FIRST_STEP_KEY] != first:
            raise ValueError(
                f"state's {FIRST_STEP_KEY} {state[FIRST_STEP_KEY]!r} is not where epoch {epoch} begins with this "
                f"schedule and these samples (step {first}); pass what state_dict() returned, unchanged"
            )
        rows = self.layout(epoch).n_rows
        if micro > rows:
            raise ValueError(
                f"state's {MICRO_KEY} {micro} is beyond epoch {epoch}, which has {rows} micro-batches per rank; "
                f"pass the micro-batches of the epoch completed, 0..{rows}"
            )
        self.set_epoch(epoch)
        self._seek(micro)

    def __repr__(self) -> str:
        unit = self.micro_batch_size if self._opts is None else f"{self._opts.budget:g}"
        return (
            f"ScheduledBatchSampler(n={len(self._sizes)}, schedule={self.schedule!r}, micro_batch_size={unit!r}, "
            f"rank={self.rank}/{self.num_replicas}, epoch={self.epoch})"
        )
