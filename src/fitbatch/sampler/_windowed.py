"""``WindowedBatchSampler``: an epoch of a billion samples planned one window at a time.

A :class:`~fitbatch.BudgetBatchSampler` plans the whole epoch on every rank: about 36 bytes per
sample at peak. This sampler plans it in windows of about a million samples (see
:mod:`fitbatch.epoch._windows`): a rank holds one window's plan, reads one window's sizes from a
memory-mapped :class:`~fitbatch.SizeIndex`, and never holds the epoch. It keeps the
guarantees of the plan samplers: every sample once per epoch, equal steps on every rank with
cost-balanced batches, exact ``len()``, ``set_budget``/``set_cost`` part-way, and an exact
resume, also on another world size.

* **First batch**: window 0 is planned, nothing else. **Resume**: the state is ``(epoch, window,
  its first step, carry, step)`` plus the epoch's events; a resume plans two windows.
* **len()**: the windows not planned yet are counted by a *census* (each window's batch count),
  shared over ``torch.distributed`` with ``census="collective"`` (rank r counts windows r, r +
  world, ...; one ``all_reduce``): every rank must call ``len()`` together. Once per epoch.
* ``plan()`` and ``step_totals()`` walk the epoch window by window (time O(n)).

``BudgetBatchSampler(..., window="auto")`` (the default) becomes this sampler above
:data:`~fitbatch.epoch._windows.AUTO_ABOVE` samples; ``window=N`` asks for it at any size.

>>> sampler = WindowedBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 10, window=4, block=2,
...                                strategy="sorted", num_replicas=1, rank=0)
>>> list(sampler), len(sampler)
([[3, 1], [0, 2], [6, 4], [7], [5]], 5)
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fitbatch._state import (
    DIGEST,
    EPOCH_KEY,
    EVENTS_KEY,
    N_SAMPLES_KEY,
    NUM_REPLICAS_KEY,
    OPTIONS_KEY,
    SIZES_DIGEST_KEY,
    STEP_KEY,
    StateSchema,
    integer,
    mapping,
)
from fitbatch._validate import choice, positive_int, state_mapping
from fitbatch.costs import CostModel
from fitbatch.epoch import _windows as W
from fitbatch.epoch._arrange import POLICIES
from fitbatch.epoch._timeline import (
    Planner,
    Timeline,
    _join,
    budget_change,
    changed,
    check_step,
    cost_change,
)
from fitbatch.epoch._windows import (
    CARRY_KEY,
    CENSUS,
    WINDOW_KEY,
    WINDOW_STEP_KEY,
    Live,
    window_events,
)
from fitbatch.epoch._world import shared_seed, shared_world, world_info
from fitbatch.plan._options import PlanKeywords, PlanOptions
from fitbatch.plan._planner import BatchPlan
from fitbatch.sampler import _windowed_state as _state
from fitbatch.sampler._protocol import PlanSampler, RankLayout, torch_class
from fitbatch.sizes import SizesLike
from fitbatch.strategies import Strategy

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)


TorchBatchSampler = torch_class("BatchSampler")


class WindowedBatchSampler(PlanSampler, TorchBatchSampler):  # type: ignore[misc,valid-type]
    """Yield budget-planned batches of an epoch planned window by window (see the module docstring).

    Args:
        sizes: a :class:`~fitbatch.SizeIndex` (read through its memory map, a window at a time)
            or anything :func:`fitbatch.as_sizes` takes (validated and held once).
        budget: as for :class:`~fitbatch.BudgetBatchSampler`, one budget for every rank.
        cost: as for :class:`~fitbatch.BudgetBatchSampler`.
        strategy: as for :class:`~fitbatch.BudgetBatchSampler`.
        num_replicas: as for :class:`~fitbatch.BudgetBatchSampler`.
        rank: as for :class:`~fitbatch.BudgetBatchSampler`.
        policy: as for :class:`~fitbatch.BudgetBatchSampler`.
        n: as for :class:`~fitbatch.BudgetBatchSampler`.
        window: samples per window (rounded down to whole blocks); each is planned alone.
            ``None`` (default): :func:`fitbatch.epoch._windows.auto_window`, 2**20 samples, or more
            when a window would hold fewer than two batches per rank (a resume adopts the
            saved window).
        block: samples per block, the unit the epoch's keyed permutation moves.
        census: ``"collective"`` (share the census over ``torch.distributed`` when it is
            initialised) or ``"local"``.
        **options: the :class:`~fitbatch.plan.PlanOptions` keywords but ``drop_last`` and
            ``max_shapes`` (their per-window meaning would differ from the epoch's).

    Raises:
        ValueError, TypeError: invalid sizes, budget or options, naming the parameter.

    >>> sizes = [5] * 14
    >>> ranks = [WindowedBatchSampler(sizes, 5, window=5, block=1, cost="sum", strategy="sequential",
    ...                               num_replicas=2, rank=r) for r in range(2)]
    >>> [list(s) for s in ranks]  # window 0's fifth batch, [1], runs beside window 1's
    [[[0], [4], [5], [6], [9], [10], [13]], [[3], [2], [8], [7], [1], [12], [11]]]
    >>> state = ranks[0].state_dict(step=3)
    >>> state["window"], state["window_step"], state["carry"]
    (1, 2, 1)
    """

    STATE = StateSchema(
        "windowed sampler",
        version=1,
        required={
            EPOCH_KEY: integer(),
            STEP_KEY: integer(),
            NUM_REPLICAS_KEY: integer(1),
            N_SAMPLES_KEY: integer(),
            SIZES_DIGEST_KEY: DIGEST,
            OPTIONS_KEY: mapping,
            EVENTS_KEY: window_events,
            WINDOW_KEY: integer(),
            WINDOW_STEP_KEY: integer(),
            CARRY_KEY: integer(),
        },
    )
    CURSOR_KEY = STEP_KEY
    CONFIG_KEY = OPTIONS_KEY
    CONFIG_NAME = "set of planning options"
    SHARES_PLAN = True

    def __init__(
        self,
        sizes: SizesLike,
        budget: float | str | Mapping[str, float | str],
        *,
        cost: str | CostModel | Any = "padded",
        strategy: str | Strategy = "pooled",
        num_replicas: int | None = None,
        rank: int | None = None,
        policy: str = "split",
        n: int | None = None,
        window: int | None = None,
        block: int = W.BLOCK,
        census: str = "collective",
        **options: Unpack[PlanKeywords],
    ) -> None:
        if isinstance(budget, Sequence) and not isinstance(budget, str):
            raise ValueError("a windowed sampler takes one budget for every rank; pass one budget, or window=None")
        for name in ("drop_last", "max_shapes", "loss_sizes"):
            if options.get(name) not in (None, False):
                raise ValueError(f"{name} is not supported with windowed plans; leave it out, or pass window=None")
        self._column = W.Column.of(sizes, n)
        # the protocol's samples (it reads their len(); the digest is the column's, set here)
        self._sizes = self._column  # type: ignore[assignment]
        self._digest = self._column.digest
        self._auto = window is None
        if window is not None:
            window = positive_int("window", window)
        self.block = int(positive_int("block", block) or W.BLOCK)
        self.census = choice("census", census, CENSUS)
        self.num_replicas, self.rank = world_info(num_replicas, rank)
        if "seed" in options:
            options["seed"] = shared_seed(options["seed"], self.num_replicas)
        self._opts = PlanOptions.build(budget, cost=cost, strategy=strategy, **options)  # type: ignore[arg-type]
        self._column.screen(self._opts)  # an oversized sample refused now, not windows into the epoch
        self.window = int(window) if window is not None else W.auto_window(self._column, self._opts, self.num_replicas)
        if self.window < 2 * self.num_replicas:  # every window (the last: half of one, at least) gives every rank a batch
            raise ValueError(f"window={self.window} holds fewer than 2 x num_replicas={self.num_replicas} samples; pass a larger window")
        self.policy = choice("policy", policy, POLICIES)
        self._begun, self._world0 = self._opts, self.num_replicas
        self._events: list[dict[str, Any]] = []
        self._live: Live | None = None
        self._from_row = 0  # the first step of the epoch this world runs
        self._marks: dict[int, tuple[int, int]] = {}  # window -> (first step, batches handed in), this epoch
        self._counts: dict[tuple[int, str], dict[int, int]] = {}  # census: (epoch, options) -> window -> own batches

    @property
    def options(self) -> PlanOptions:
        return self._opts

    @property
    def budget(self) -> float:
        return self._opts.budget

    def windows(self, epoch: int | None = None) -> W.Windows:
        """The windows of an epoch (default: the current one)."""
        shuffle = self._begun.effective_shuffle
        return W.Windows.keyed(
            len(self._column), window=self.window, block=self.block, seed=self._begun.seed,
            epoch=self._epoch(epoch), shuffle=shuffle,
        )

    def set_budget(self, budget: float | str | Mapping[str, float | str]) -> None:
        """Change the budget from the next batch on (see :meth:`fitbatch.BudgetBatchSampler.set_budget`).

        Part-way through a window, the rest of the window is planned again; later windows are
        planned with the new budget, and batches handed on from the window that are over it are
        planned again where they land. The state records ``{"window": w, "step": k, "budget": b}``.
        """
        change = budget_change(self._opts, budget)
        if change is not None:
            self._change(*change)

    def set_cost(self, cost: Any) -> None:
        """Change the cost model from the next batch on (like :meth:`set_budget`)."""
        change = cost_change(self._opts, cost)
        if change is not None:
            self._change(*change)

    def _change(self, change: dict[str, Any], model: CostModel | None = None) -> None:
        known = () if model is None else (model,)
        after = changed(self._opts, None, {STEP_KEY: 0, **change}, known)[0]
        self._column.screen(after)  # refused: nothing changes
        if self._position == 0 and not self._events:  # the epoch has not begun: it begins with the change
            self._begun = self._opts = after
            self._live, self._marks = None, {}
            self._revision += 1
            return
        live = self._current()
        event = {WINDOW_KEY: live.plan.index, STEP_KEY: self._position - live.first, **change}
        self._apply(live, event, self._generation(live), known)
        self._events.append(event)
        logger.info("epoch %d: %s from step %d on (window %d); the rest re-planned", self.epoch, change, self._position, live.plan.index)
        self._revision += 1

    def _generation(self, live: Live) -> int:
        """The number of the next event of ``live``'s window (1 for its first): it keys the re-plan's stream."""
        return 1 + sum(e[WINDOW_KEY] == live.plan.index for e in self._events)

    def _apply(self, live: Live, event: Mapping[str, Any], generation: int, known: Sequence[CostModel] = ()) -> None:
        """Apply the ``generation``-th event of ``live``'s window to its timeline, and to the options in force."""
        local = {k: v for k, v in event.items() if k != WINDOW_KEY}
        planner = Planner(live.plan.sizes, self.policy, self.epoch)
        live.timeline, self._opts, _ = planner.apply(live.timeline, local, generation, self._opts, None, (*known, self._opts.cost))

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plans (every rank must call it alike)."""
        before = self.epoch
        super().set_epoch(epoch)
        if self.epoch != before:
            self._begun, self._world0 = self._opts, self.num_replicas
            self._events, self._live, self._marks, self._from_row = [], None, {}, 0
            self._revision += 1

    def _options_at(self, w: int) -> tuple[PlanOptions, int]:
        """The options and the world in force when window ``w`` of the current epoch began."""
        return W.options_at(self._begun, self._world0, self._events, w, self._opts.cost)

    def _build(self, w: int, first: int, carry_in: Sequence[np.ndarray]) -> Live:
        """Window ``w`` planned with the options of its start, handed ``carry_in``; its saved events replayed.

        Leaves ``self._opts`` at the options in force after the window's events.
        """
        windows = self.windows()
        self._opts, world = self._options_at(w)
        plan = W.build_window(
            self._column, windows, w, self._opts, world=world, epoch=self.epoch, carry_in=carry_in, policy=self.policy,
        )
        self._marks[w] = (first, len(carry_in))
        live = Live(plan, first, Timeline.start(plan.steps, self._opts.cost, self._opts.budget), w == windows.n_windows - 1)
        mine = [event for event in self._events if event[WINDOW_KEY] == w]
        for generation, event in enumerate(mine, 1):
            check_step(f"event {event!r}", int(event[STEP_KEY]), live.timeline, self.epoch)
            self._apply(live, event, generation)
        self._live = live
        return live

    def _rebuild(self, w: int, first: int, carried: int) -> Live:
        """Window ``w`` rebuilt on its own (a resume): the window before it planned for what it handed on."""
        carry: tuple[np.ndarray, ...] = ()
        if carried:
            before, _ = self._options_at(w - 1)
            ids, _, own = W.own_plan(self._column, self.windows(), w - 1, before, self.epoch)
            carry = tuple(ids[b] for b in own.select(W.handed_on(own, carried, before, self.epoch, w - 1)))
        return self._build(w, first, carry)

    def _current(self) -> Live:
        if self._live is None:
            self._build(0, 0, ())
            assert self._live is not None
            if self.rank == 0:
                logger.info("epoch %d: %d windows of %d samples; window 0: %s", self.epoch, self.windows().n_windows,
                            self.window, self._live.timeline.steps.plan.stats().summary())
        return self._live

    def _next(self, live: Live) -> Live:
        """The window after ``live``, handed ``live``'s batches."""
        return self._build(live.plan.index + 1, live.end, live.plan.carry)

    def _at(self, row: int) -> Live:
        """The window that runs step ``row``: the live one, or one this epoch passed, rebuilt (then walked on)."""
        live = self._current()
        if row < live.first:  # a window this epoch passed (a restart of the epoch, say): rebuilt
            w = max([w for w, (first, _) in self._marks.items() if first <= row], default=0)
            first, carried = self._marks.get(w, (0, 0))
            live = self._rebuild(w, first, carried)
        while row >= live.end and not live.last:
            live = self._next(live)
        return live

    def _rank_batches(self, live: Live) -> tuple[BatchPlan, int]:
        """This rank's batches of a window (dataset indices) and the step of the epoch its first runs at."""
        tl = live.timeline
        local = tl.rank_plan(self.rank, live.plan.sizes)
        ids = live.plan.ids
        per = (local.costs, local.real_units, local.padded_units)
        plan = local.rebatched(ids[local.order], local.offsets, per, index_map=ids)
        return plan, live.first + tl.base

    def _generate(self) -> Iterator[tuple[int, list[int]]]:
        row, self._start = self._start, 0
        epoch, seen = self.epoch, None
        live = self._at(row)
        while self.epoch == epoch:
            if seen != (self._revision, live.plan.index):
                seen = (self._revision, live.plan.index)
                plan, first = self._rank_batches(live)
                order, bounds = plan.order, plan.offsets.tolist()
                row = max(row, first)
                self._position = row
            if row >= live.end:
                if live.last:
                    return
                live, seen = self._next(live), None
                continue
            k = row - first
            batch = order[bounds[k] : bounds[k + 1]].tolist()
            row += 1
            self._position = row
            yield row - 1, batch

    def _generate_world(self, world: int) -> Iterator[list[int]]:
        """Every rank's batches, step by step (under accelerate's sharding; see the base class)."""
        start, self._start = self._start, 0
        live = self._at(start)
        row = start
        while True:
            plans = []
            for rank in range(world):
                view = copy.copy(self)
                view.rank = rank
                plans.append(view._rank_batches(live))
            first = plans[0][1]
            for r in range(max(row, first), live.end):
                self._position = r + 1
                for plan, _ in plans:
                    lo, hi = plan.offsets[r - first : r - first + 2].tolist()
                    yield plan.order[lo:hi].tolist()
            row = live.end
            if live.last:
                return
            live = self._next(live)

    def __len__(self) -> int:
        """The batches the next iteration yields: the epoch's steps from the resume cursor on.

        The steps of windows not planned yet come from the census (see the module docstring).
        """
        return max(0, self._end() - max(self._start, self._from())) * self._outer()

    def _outer(self) -> int:
        import sys

        from fitbatch.sampler._sharding import outer_world

        return outer_world(self, sys._getframe(2))

    def _from(self) -> int:
        """The first step this world runs (after a resume on another world size: where it took over)."""
        return self._from_row

    def _end(self) -> int:
        """Steps in the epoch as it runs now: the live window's end, then the census's steps.

        Windows that hold saved events (a prefetching loader's, after a resume) are planned to
        count them; the census counts the others with the options in force after them.
        """
        live = self._current()
        ahead = max((int(e[WINDOW_KEY]) for e in self._events), default=-1)
        if ahead > live.plan.index and not live.last:
            saved = (self._live, dict(self._marks), self._opts)
            try:
                while live.plan.index < ahead and not live.last:
                    live = self._next(live)
                return self._end_after(live)
            finally:
                self._live, self._marks, self._opts = saved
        return self._end_after(live)

    def _end_after(self, live: Live) -> int:
        """The epoch's steps when window ``live`` runs with the options in force now."""
        if live.last:
            return live.end
        todo = list(range(live.plan.index + 1, self.windows().n_windows))
        counts = self._census(todo, self.epoch)
        refit = W.carried_batches(self._column, live.plan.carry, self._opts, self.epoch, todo[0])
        steps = W.window_steps([counts[w] for w in todo], self.num_replicas, self.policy, len(live.plan.carry), refit)
        return live.end + sum(steps)

    def n_steps(self, epoch: int | None = None) -> int:
        """How many batches this rank runs in the epoch (default: the current one), from the census.

        ``len(plan(epoch))`` without planning the epoch: the windows planned so far, then each
        later window's batch count (see the module docstring; collective like ``len()``).

        >>> WindowedBatchSampler([5] * 8, 5, window=4, block=1, cost="sum", num_replicas=2, rank=0).n_steps()
        4
        """
        epoch = self._epoch(epoch)
        if epoch == self.epoch:
            return self._end() - self._from_row
        todo = list(range(self.windows(epoch).n_windows))
        counts = self._census(todo, epoch)
        return sum(W.window_steps([counts[w] for w in todo], self.num_replicas, self.policy))

    def _census(self, todo: list[int], epoch: int) -> dict[int, int]:
        """Own batch counts of an epoch's windows ``todo`` under the options in force (once per epoch and options)."""
        known = self._counts.setdefault((epoch, json.dumps(self._opts.to_dict(), sort_keys=True, default=str)), {})
        missing = [w for w in todo if w not in known]
        if missing:
            group = self.census == "collective" and shared_world(self.num_replicas)
            counts = W.census(self._column, self.windows(epoch), self._opts, epoch, missing, self.rank, self.num_replicas, group)
            known.update(zip(missing, counts))
        return known

    def _layout(self, epoch: int) -> RankLayout:
        """The whole epoch as this rank runs it, walked window by window from window 0 (time O(n))."""
        if epoch != self.epoch:
            other = copy.copy(self)
            other.set_epoch(epoch)
            return other._layout(epoch)
        saved = (self._live, dict(self._marks), self._opts)
        parts, totals, left_out = [], [], []
        live = self._build(0, 0, ())
        while True:
            if live.end > self._from_row:  # windows before a change of world size ran on other ranks
                parts.append(self._rank_batches(live)[0])
            totals.append(live.timeline.step_totals())
            whole = live.timeline.steps.plan  # the epoch's samples left out, as dataset indices
            left_out.append((live.plan.ids[whole.skipped], live.plan.ids[whole.dropped], whole.dropped_batches))
            if live.last:
                break
            live = self._next(live)
        self._live, self._marks, self._opts = saved
        if not parts:  # an epoch of no steps (every batch dropped)
            parts.append(self._rank_batches(live)[0])
        joined = _join(parts, parts[-1], lower_bound=sum(p.lower_bound for p in parts), straggler=None)
        joined.skipped = np.concatenate([s for s, _, _ in left_out])
        joined.dropped = np.concatenate([d for _, d, _ in left_out])
        joined.dropped_batches = sum(k for _, _, k in left_out)
        samples, units, loss = (np.concatenate([getattr(t, f) for t in totals]) for f in ("samples", "units", "loss_units"))
        return RankLayout(joined, samples, units, self._from_row, loss)

    def _config(self, begun: PlanOptions | None = None) -> dict[str, Any]:
        return {**(self._begun if begun is None else begun).to_dict(), "window": self.window, "block": self.block}

    def state_dict(self, *, step: int | None = None) -> dict[str, Any]:
        """A JSON-able state: ``epoch``, ``step``, the window it is in, and the epoch's events.

        ``window``, ``window_step`` (the step of the epoch that window began at) and ``carry``
        (batches it was handed) let a resume plan two windows only. ``step`` defaults to the
        batches handed out; pass the loop's own count with a prefetching ``DataLoader``
        (a step in a window this epoch has passed is fine).
        """
        return _state.save(self, step)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where ``state`` was taken: plan its window (and the one before it), replay its events.

        On another world size the rest of the saved window is arranged for the new ranks, and
        the windows after it are planned for them.

        Raises:
            ValueError: a state of another kind or version, other samples or options, or a
                window or step outside the epoch.
        """
        _state.load(self, state_mapping("windowed sampler", state))

    def __repr__(self) -> str:
        where = f"rank={self.rank}/{self.num_replicas}, epoch={self.epoch}"
        return f"WindowedBatchSampler(n={len(self._column)}, budget={self.budget:g}, window={self.window}, {where})"


__all__ = ["WindowedBatchSampler"]
