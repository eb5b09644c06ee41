"""``PlanSampler``: the sampler protocol, written once for every fitbatch sampler.

:class:`~fitbatch.BudgetBatchSampler`, :class:`~fitbatch.schedule.ScheduledBatchSampler` and the compat
samplers (:mod:`fitbatch.compat`) are plan samplers: each plans an epoch and yields this rank's
batches of it. This module imports no torch, so that a compat adapter can be imported without
it; a sampler takes torch's ``BatchSampler`` (or ``Sampler``) as a second base with
:func:`torch_class`, which is the only place that falls back to ``object`` without torch.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import sys
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fitbatch._state import (
    CONFIG_KEY,
    EPOCH_KEY,
    N_SAMPLES_KEY,
    NUM_REPLICAS_KEY,
    SIZES_DIGEST_KEY,
    STEP_KEY,
    StateSchema,
    sizes_digest,
)
from fitbatch._validate import non_negative_int
from fitbatch.epoch._arrange import StepTotals
from fitbatch.plan._planner import BatchPlan
from fitbatch.sampler._sharding import outer_world
from fitbatch.sizes import Sizes


def torch_class(name: str) -> type:
    """``torch.utils.data.<name>``, or ``object`` when torch is not installed (imports torch).

    A sampler with it as a base passes the ``isinstance`` checks of ``DataLoader`` and Lightning.

    >>> torch_class("BatchSampler").__name__ in ("BatchSampler", "object")
    True
    """
    try:
        data = importlib.import_module("torch.utils.data")
    except ImportError:  # pragma: no cover - exercised only without torch
        return object
    base: type = getattr(data, name)
    return base


@dataclasses.dataclass(frozen=True)
class RankLayout:
    """One epoch as this rank runs it: its batches in order, and the steps' totals over all ranks.

    Every rank runs one batch per row; a step is one row, or several (micro-batches). Row 0 of
    ``plan`` runs at row ``first`` of the epoch: after a change of world size part-way through
    an epoch, the rows before it ran on other ranks.

    >>> from fitbatch.plan._planner import plan_batches
    >>> layout = RankLayout.alone(plan_batches([3, 1, 2], 4, cost="sum", strategy="sequential"))
    >>> len(layout.plan), layout.step_samples.tolist(), layout.step_units.tolist()
    (2, [2, 1], [4.0, 2.0])

    Attributes:
        plan: this rank's batches, one per row, in the order it runs them.
        step_samples, step_units: samples and real size units of each step of the epoch (from
            step 0, also those before ``first``), all ranks together.
        first: the row of the epoch that row 0 of ``plan`` runs at.
        step_loss_units: tokens that carry loss in each step, like ``step_units`` (``None``:
            the same as ``step_units``, no ``loss_sizes``).
    """

    plan: BatchPlan
    step_samples: NDArray[np.int64]
    step_units: NDArray[np.float64]
    first: int = 0
    step_loss_units: NDArray[np.float64] | None = None

    @property
    def end(self) -> int:
        """Rows in the epoch: ``first + len(plan)``."""
        return self.first + len(self.plan)

    @classmethod
    def alone(cls, plan: BatchPlan) -> RankLayout:
        """The layout of a plan that one rank runs alone: each batch is a step (see the class)."""
        return cls(plan, plan.counts, plan.real_units, step_loss_units=plan.loss_units)


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of an epoch's rows that iteration lays out at once: the epoch (one segment), or a
    window of a sampler that plans in windows.

    >>> Segment(key=0, first=0, end=5, last=True).end
    5

    Attributes:
        key: which segment (iteration watches each segment's layout for changes).
        first: the row of the epoch at which row 0 of the segment's batches runs.
        end: the row of the epoch after the segment's last batch.
        last: whether no segment follows it.
        handle: the sampler's own object for it (a window), or ``None``.
    """

    key: int
    first: int
    end: int
    last: bool
    handle: Any = None


class EpochHook:
    """What a :class:`PlanSampler` shows as its ``sampler``: frameworks that look for
    ``loader.batch_sampler.sampler.set_epoch`` (Lightning every epoch, accelerate's loaders'
    ``set_epoch``) set the fitbatch sampler's epoch through it.

    >>> from fitbatch import BudgetBatchSampler
    >>> sampler = BudgetBatchSampler([3, 1, 4, 1], 4, num_replicas=1, rank=0)
    >>> sampler.sampler.set_epoch(2)
    >>> sampler.epoch
    2
    """

    def __init__(self, owner: PlanSampler) -> None:
        self.owner = owner

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"EpochHook({self.owner!r})"


class PlanSampler:
    """Base of the samplers that yield one rank's batches of a planned epoch.

    It owns the protocol: ``epoch`` and :meth:`set_epoch`, ``len()`` (the batches the next
    iteration yields), re-entrant iteration over lists of int with the resume cursor,
    :meth:`plan`, :meth:`step_totals`, and the state envelope that a subclass's
    ``state_dict``/``load_state_dict`` call (:meth:`_save_state`, :meth:`_check_state`,
    :meth:`_seek`). A subclass fills the hooks:

    * ``_layout(epoch) -> RankLayout`` (required): the epoch as this rank runs it, the same
      steps on every rank (plan it, or take it from a cache of the subclass);
    * ``_config() -> dict`` (for state): a JSON-able configuration; a state saved with another
      one is refused;
    * ``_extra_state() -> dict`` (optional): fields of its own, beside the envelope's (or in
      place of one of them).

    A subclass whose current epoch changes part-way (a new budget) increments ``_revision``: an
    iterator that is running takes the new layout at its next batch, from the row it reached.

    The public ``state_dict``/``load_state_dict`` stay in the subclasses, a few lines each: the
    cursor has its own keyword there (``step=``, ``micro=``), and a sampler without state (the
    compat ones) must not look stateful to ``StatefulDataLoader``.

    A sampler with state also sets ``STATE`` (its :class:`~fitbatch._state.StateSchema`), and
    where its state names them otherwise ``CURSOR_KEY`` (rows of the epoch consumed,
    ``"step"``), ``CONFIG_KEY`` (``"config"``) and ``CONFIG_NAME`` (what the configuration is,
    for messages); it has ``num_replicas`` and ``_sizes`` (the samples).

    >>> from fitbatch.plan._planner import plan_batches
    >>> class Fixed(PlanSampler):
    ...     def _layout(self, epoch):
    ...         return RankLayout.alone(plan_batches([3, 1, 2, 2], 4, cost="sum", strategy="sequential"))
    >>> sampler = Fixed()
    >>> list(sampler), len(sampler), sampler.step_totals().samples.tolist()
    ([[0, 1], [2, 3]], 2, [2, 2])
    """

    epoch: int = 0
    _start = 0  # first row the next iteration yields (set by a resume)
    _position = 0  # rows of this epoch handed out by the latest iterator
    _revision = 0  # incremented when the current epoch's layout changes
    _digest: str | None = None  # sizes_digest of _sizes (and _loss), computed on first use
    _loss: NDArray[np.float64] | None = None  # loss_sizes, one per sample, when given
    CONFIG_HINT: ClassVar[str] = ""  # appended to the message of a refused configuration

    STATE: ClassVar[StateSchema]
    CURSOR_KEY: ClassVar[str] = STEP_KEY
    CONFIG_KEY: ClassVar[str] = CONFIG_KEY
    CONFIG_NAME: ClassVar[str] = "configuration"
    #: every rank plans the same global epoch and ``_layout`` picks ``self.rank``'s rows of it, so
    #: the sampler can lay out the batches of all ranks (under accelerate, see :meth:`__iter__`)
    SHARES_PLAN: ClassVar[bool] = False
    num_replicas: int
    rank: int
    _sizes: Sizes

    # ------------------------------------------------------------------ hooks

    def _layout(self, epoch: int) -> RankLayout:
        raise NotImplementedError

    def _config(self) -> dict[str, Any]:
        raise NotImplementedError

    def _extra_state(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ epochs and plans

    @property
    def sampler(self) -> Any:
        """``batch_sampler.sampler`` as frameworks read it: the sampler a compat sampler draws
        its order from (a ``DistributedSampler``, say), else an :class:`EpochHook`, whose
        ``set_epoch`` sets this sampler's epoch (Lightning calls it every epoch)."""
        wrapped = self.__dict__.get("_wrapped", self.__dict__.get("_sampler"))
        return wrapped if wrapped is not None else EpochHook(self)

    @sampler.setter
    def sampler(self, value: Any) -> None:
        self.__dict__["_wrapped"] = value

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration runs (every rank must call it alike).

        >>> from fitbatch import BudgetBatchSampler
        >>> sampler = BudgetBatchSampler([3, 1, 4, 1], 4, num_replicas=1, rank=0)
        >>> sampler.set_epoch(2)
        >>> sampler.epoch
        2
        """
        epoch = non_negative_int("epoch", epoch)
        if epoch != self.epoch:
            self.epoch, self._start, self._position = epoch, 0, 0

    def plan(self, epoch: int | None = None) -> BatchPlan:
        """This rank's batches of the epoch (default: the current one), in the order it runs them.

        For the current epoch, the epoch as it runs now: after a change part-way through it (a
        new budget), the batches already run, then those of the re-planned rest; after a resume
        on another world size, the batches this rank runs from the step it took over.

        >>> from fitbatch import BudgetBatchSampler
        >>> BudgetBatchSampler([3, 1, 4, 1], 4, strategy="sorted", num_replicas=1, rank=0).plan().to_lists()
        [[3, 1], [0], [2]]
        """
        return self._layout(self._epoch(epoch)).plan

    def n_steps(self, epoch: int | None = None) -> int:
        """How many batches this rank runs in the epoch (default: the current one): ``len(plan(epoch))``.

        A ``BudgetBatchSampler`` planning in windows counts them without planning the epoch.

        >>> from fitbatch import BudgetBatchSampler
        >>> BudgetBatchSampler([3, 1, 4, 1], 4, strategy="sorted", num_replicas=1, rank=0).n_steps()
        3
        """
        return len(self.plan(epoch))

    @property
    def shapes(self) -> NDArray[np.int64] | None:
        """With ``max_shapes``: the (K, 2) ``(rows, length)`` shapes every batch fits, else ``None``.

        The same on every rank and in every epoch (it depends on the sizes, the budget, the cost
        and the options only): compile a model for these shapes, and pad each batch to the one
        ``plan().shapes`` gives it.

        >>> from fitbatch import BudgetBatchSampler
        >>> BudgetBatchSampler([3, 5, 9, 10, 4, 10], 40, max_shapes=2, num_replicas=1, rank=0).shapes.tolist()
        [[8, 5], [4, 10]]
        """
        return self.plan().shape_set

    def step_totals(self, epoch: int | None = None) -> StepTotals:
        """Per step of the epoch: samples, real size units and loss units summed over all ranks.

        Indexed by the step of the epoch, from 0 (the ``step`` of the state counts the same
        steps). For the current epoch, the epoch as it runs now: every step already run keeps
        its totals, also those run on another world size before a resume, and the steps after
        a change part-way (a new budget) are those of the re-planned rest, so the arrays change
        with such a change and a loop that normalises by them reads them again. A
        :class:`StepTotals` ``(samples, units, loss_units)``; ``loss_units`` are the tokens that
        carry loss (``loss_sizes=``), or ``units`` when the sampler has none.

        >>> from fitbatch import BudgetBatchSampler
        >>> sampler = BudgetBatchSampler([3, 1, 4, 1], 4, strategy="sorted", num_replicas=1, rank=0)
        >>> [totals.tolist() for totals in sampler.step_totals()]
        [[2, 1, 1], [2.0, 3.0, 4.0], [2.0, 3.0, 4.0]]
        """
        lay = self._layout(self._epoch(epoch))
        loss = lay.step_units if lay.step_loss_units is None else lay.step_loss_units
        return StepTotals(lay.step_samples, lay.step_units, loss)

    def _epoch(self, epoch: int | None) -> int:
        return self.epoch if epoch is None else non_negative_int("epoch", epoch)

    # ------------------------------------------------------------------ iteration

    def __len__(self) -> int:
        """The batches the next iteration yields: the epoch's rows as it runs now, less the resume cursor.

        After a change part-way through the epoch (a new budget), the count follows the
        re-planned rest; after a resume, it counts the rows from the saved cursor (on another
        world size: from the step the new ranks took over). Once an iteration has begun, the
        next one runs the epoch again from its start (or from that step).
        """
        first, end = self._span()
        return max(0, end - max(self._start, first)) * outer_world(self, sys._getframe(1))

    def _span(self) -> tuple[int, int]:
        """The rows of the current epoch this rank runs, ``(first, end)``: the hook ``len()`` reads.

        From :meth:`_layout` by default; a subclass that counts an epoch without planning it
        whole (``BudgetBatchSampler`` in windows: a census) fills it.
        """
        lay = self._layout(self.epoch)
        return lay.first, lay.end

    def __iter__(self) -> Iterator[list[int]]:
        # Under accelerate's BatchSamplerShard (``accelerator.prepare`` of the loader), yield the
        # batches of all ranks, step by step: the shard's every-world-th pick then hands each rank
        # its own. Elsewhere, this rank's batches. (fitbatch.sampler._sharding says why.)
        world = outer_world(self, sys._getframe(1), iterating=True)
        if world > 1:
            self._position = self._start
            return self._generate_world(world)
        return (batch for _, batch in self._rows())

    def _rows(self) -> Iterator[tuple[int, list[int]]]:
        """The next iteration as ``(row of the epoch, batch)`` pairs (for extras such as ``with_info``)."""
        self._position = self._start
        return self._generate()

    def _generate(self) -> Iterator[tuple[int, list[int]]]:
        # The resume cursor is taken on the first next(), not in __iter__: a multi-worker
        # DataLoader calls iter() twice per epoch and only runs the second iterator.
        row, self._start = self._start, 0
        epoch, seen = self.epoch, None
        seg = self._segment_at(row)
        while True:
            # Invariant: rows before `row` are handed out; a change of the segment's layout
            # (``_revision``) replaces only rows from the one handed out last, so `row` stays.
            if seen != (self._revision, seg.key) and self.epoch == epoch:
                seen = (self._revision, seg.key)
                plan, seg = self._segment_plan(seg)
                order, bounds = plan.order, plan.offsets.tolist()
                row = max(row, seg.first)
                self._position = row
            if row >= seg.end:
                if seg.last or self.epoch != epoch:
                    return
                seg, seen = self._segment_after(seg), None
                continue
            k = row - seg.first
            batch = order[bounds[k] : bounds[k + 1]].tolist()
            row += 1
            self._position = row
            yield row - 1, batch

    def _generate_world(self, world: int) -> Iterator[list[int]]:
        """Every rank's batches from the resume cursor on: step k yields rank 0's, rank 1's, ... batch k."""
        start, self._start = self._start, 0
        seg, row = self._segment_at(start), start
        while True:
            own, seg = self._segment_plan(seg)  # fills the subclass's caches, which the views share
            plans = []
            for rank in range(world):
                if rank == self.rank:
                    plans.append(own)
                    continue
                view = copy.copy(self)  # the same sampler as rank `rank` runs it
                view.rank = rank
                plans.append(view._segment_plan(seg)[0])
            # rows count from the epoch's start; row `first` is row 0 of the plans (after a
            # resume on another world size, the rows before it ran on the old world)
            for r in range(max(row, seg.first), seg.end):
                self._position = r + 1
                k = r - seg.first
                for plan in plans:
                    lo, hi = plan.offsets[k : k + 2].tolist()
                    yield plan.order[lo:hi].tolist()
            row = seg.end
            if seg.last:
                return
            seg = self._segment_after(seg)

    # ------------------------------------------------------------------ segments (iteration's hooks)

    def _segment_at(self, row: int) -> Segment:
        """The segment of the current epoch that holds ``row`` (by default the epoch: one segment)."""
        return Segment(key=0, first=0, end=0, last=True)

    def _segment_plan(self, seg: Segment) -> tuple[BatchPlan, Segment]:
        """This rank's batches of ``seg`` as laid out now, and the segment's rows now (a change
        part-way, such as a new budget, may have re-planned it)."""
        lay = self._layout(self.epoch)
        return lay.plan, Segment(key=seg.key, first=lay.first, end=lay.end, last=True)

    def _segment_after(self, seg: Segment) -> Segment:
        """The segment after ``seg`` (not the last one)."""
        raise NotImplementedError(f"{type(self).__name__} lays its epoch out as one segment")

    # ------------------------------------------------------------------ state envelope

    def _save_state(self, done: int | None) -> dict[str, Any]:
        """The state after ``done`` rows of the epoch (default: those handed out so far)."""
        cursor = self._position if done is None else non_negative_int(self.CURSOR_KEY, done)
        self._check_cursor(cursor, self._layout(self.epoch))
        fields = {
            EPOCH_KEY: self.epoch,
            self.CURSOR_KEY: cursor,
            NUM_REPLICAS_KEY: self.num_replicas,
            N_SAMPLES_KEY: len(self._sizes),
            SIZES_DIGEST_KEY: self._sizes_digest(),
            self.CONFIG_KEY: self._config(),
        }
        return self.STATE.envelope(**{**fields, **self._extra_state()})

    def _sizes_digest(self) -> str:
        if self._digest is None:
            self._digest = sizes_digest(self._sizes.values, self._loss, getattr(self._sizes, "columns", None))
        return self._digest

    def _check_state(self, state: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> tuple[int, int]:
        """Check ``state`` against the schema, the samples and ``config`` (default: ``_config()``); its (epoch, cursor).

        Configurations are compared as JSON stores them (a tuple and a list are alike).
        """
        self.STATE.check(state)
        if state[N_SAMPLES_KEY] != len(self._sizes):
            raise ValueError(
                f"state is for {state[N_SAMPLES_KEY]} samples, this sampler has {len(self._sizes)}; "
                "resume over the same samples"
            )
        if state[SIZES_DIGEST_KEY] != self._sizes_digest():
            raise ValueError(
                f"state was saved over other sizes or loss_sizes (sizes_digest {state[SIZES_DIGEST_KEY]}, this "
                f"sampler's {self._sizes_digest()}); resume over the same samples, in the same order, with the "
                "same loss_sizes"
            )
        saved, mine = _as_json(state[self.CONFIG_KEY]), _as_json(self._config() if config is None else config)
        if saved != mine:
            differ = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
            shown = "; ".join(f"{k}: saved {saved.get(k)!r}, this sampler {mine.get(k)!r}" for k in differ)
            raise ValueError(
                f"state was saved with another {self.CONFIG_NAME} ({shown}); build the sampler with "
                f"the saved ones{self.CONFIG_HINT}"
            )
        return int(state[EPOCH_KEY]), int(state[self.CURSOR_KEY])

    def _check_began(self, state: Mapping[str, Any], now: Mapping[str, Any], began: Mapping[str, Any]) -> tuple[int, int, bool]:
        """:meth:`_check_state` against the configuration the saved epoch began with: the one in
        force ``now`` (a fresh sampler, or a later epoch), or the one this sampler's epoch
        ``began`` with before a change part-way (the state loaded again, a rollback); its
        (epoch, cursor, whether it was ``now``'s). A state of neither is refused naming ``began``."""
        self.STATE.check(state)
        if _as_json(state[self.CONFIG_KEY]) == _as_json(now):
            return (*self._check_state(state, now), True)
        return (*self._check_state(state, began), False)

    def _check_cursor(self, cursor: int, lay: RankLayout) -> None:
        """Refuse a cursor outside the rows this rank runs in the epoch (``lay.first .. lay.end``)."""
        if not lay.first <= cursor <= lay.end:
            where = f"from row {lay.first} (rows before it ran on another world size) " if lay.first else ""
            raise ValueError(
                f"{self.CURSOR_KEY} {cursor} is outside epoch {self.epoch}, which this sampler runs "
                f"{where}to row {lay.end}; pass the {self.CURSOR_KEY}s of the epoch completed, "
                f"{lay.first}..{lay.end}"
            )

    def _seek(self, row: int) -> None:
        """Start the next iteration at ``row`` of the current epoch (checked by :meth:`_check_cursor`)."""
        self._start = self._position = row
        self._revision += 1


def _as_json(value: Any) -> dict[str, Any]:
    """``value`` as JSON stores it (tuples become lists): a saved configuration compares equal."""
    out: dict[str, Any] = json.loads(json.dumps(value))
    return out
