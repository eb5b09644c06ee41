"""``BudgetBatchSampler``: budget-planned batches for ``torch.utils.data.DataLoader``.

A :class:`PlanSampler` (the protocol all fitbatch samplers share: ``len()``, iteration, epochs,
the resume cursor and the state envelope, see :mod:`fitbatch.sampler._protocol`), and a subclass of
torch's ``BatchSampler`` when torch is importable (a plain iterable otherwise). It yields lists
of int, has an exact ``len()`` (the batches the next iteration yields), ``set_epoch(epoch)``,
re-entrant iteration, data-parallel splitting and exact resume:

* every rank plans the same epoch from ``(seed, epoch)`` and runs its share of cost-balanced
  steps; all ranks yield the same number of batches (see :mod:`fitbatch.epoch._arrange`);
* one engine runs every epoch as a sequence of *windows* (:mod:`fitbatch.epoch._windows`): an
  unwindowed epoch (``window=None``, and ``"auto"`` below 2**25 samples) is one window whose
  samples are in index order and whose seed is the epoch's own, planned whole; ``window=N``
  plans windows of about ``N`` samples one at a time, in memory O(window);
* ``set_budget``/``set_cost`` part-way through an epoch re-plan the samples of the steps not yet
  handed out (the running iteration takes them at its next batch) and are saved as *events*;
* ``state_dict()`` is ``{version, epoch, step, events, ...}`` (and, planning in windows, the
  window the step is in, under a digest); ``load_state_dict()`` re-plans that window (no replay
  of consumed batches), replays its events and continues at ``step``; if the world size
  changed, the rest of the window is re-arranged for the new world so every remaining sample is
  seen exactly once (:mod:`fitbatch.epoch._timeline`).

>>> sampler = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted")
>>> list(sampler)
[[3, 1], [6, 0, 2], [4, 7], [5]]
>>> len(sampler)
4
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import numbers
from collections.abc import Mapping, Sequence
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
    _refuse,
    events,
    integer,
    mapping,
    sizes_digest,
)
from fitbatch._validate import choice, non_negative_int, parse_budget, positive_int
from fitbatch._validate import loss_sizes as check_loss_sizes
from fitbatch.costs import CostModel
from fitbatch.epoch import _windows as W
from fitbatch.epoch._arrange import POLICIES, Steps, TooFewSamples
from fitbatch.epoch._timeline import (
    Budgets,
    Planner,
    Timeline,
    _join,
    budget_change,
    changed,
    check_step,
    cost_change,
)
from fitbatch.epoch._windows import CARRY_KEY, CENSUS, WINDOW_KEY, WINDOW_STEP_KEY, Live
from fitbatch.epoch._world import shared_seed, shared_world, world_info
from fitbatch.plan._options import PlanKeywords, PlanOptions
from fitbatch.plan._planner import BatchPlan
from fitbatch.sampler._protocol import PlanSampler, RankLayout, Segment, torch_class
from fitbatch.sizes import SizesLike
from fitbatch.strategies import Strategy

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

#: torch's ``BatchSampler`` (``object`` without torch): the samplers' second base, so that
#: ``DataLoader`` and Lightning type checks pass
TorchBatchSampler = torch_class("BatchSampler")

#: a windowed state's digest of its window fields (``window``, ``window_step``, ``carry``) with
#: the epoch, the world it began on and its events: an edited state is refused
WINDOW_DIGEST_KEY = "window_digest"
_WINDOW_FIELDS = (WINDOW_KEY, WINDOW_STEP_KEY, CARRY_KEY, WINDOW_DIGEST_KEY)
#: options a window cannot take on its own (their meaning is the epoch's): with them the epoch is one window
_WHOLE_EPOCH = ("drop_last", "max_shapes")


def sampler_events(name: str, value: Any) -> None:
    """A check for a sampler's events (:func:`fitbatch._state.events`), each with the ``window`` it
    happened in when the epoch is planned in windows (its ``step`` then counts from that window's first).

    >>> sampler_events("events", [{"step": 3, "budget": 100.0}, {"window": 2, "step": 1, "num_replicas": 4}])
    >>> sampler_events("events", [{"window": -1, "step": 3, "budget": 100.0}])
    Traceback (most recent call last):
    ...
    ValueError: events must be a list of events, each with an optional 'window' (an int >= 0); item 0 is {'window': -1, 'step': 3, 'budget': 100.0}, got [{'window': -1, 'step': 3, 'budget': 100.0}]; pass what state_dict() returned, unchanged
    """
    if isinstance(value, list):
        for i, event in enumerate(value):
            w = event.get(WINDOW_KEY, 0) if isinstance(event, Mapping) else 0
            if not (isinstance(w, int) and not isinstance(w, bool) and w >= 0):
                _refuse(name, value, f"a list of events, each with an optional 'window' (an int >= 0); item {i} is {event!r}")
        value = [{k: v for k, v in e.items() if k != WINDOW_KEY} if isinstance(e, Mapping) else e for e in value]
    events(name, value)


class BudgetBatchSampler(PlanSampler, TorchBatchSampler):  # type: ignore[misc,valid-type]
    """Yield batches of indices whose cost fits a budget.

    ``plan()`` is this rank's batches in step order (after a resume on another world size: from
    the step the new ranks took over); :meth:`steps` is the arrangement of all ranks (after a
    change part-way through the epoch: that of its rest; planning in windows: the window's).
    :meth:`set_budget` and :meth:`set_cost` apply from the next batch; the state records them
    (see ``state_dict``).

    Args:
        sizes: one size per sample (array-like, mapping, a :class:`~fitbatch.SizeIndex`, or a
            callable with ``n``). Planning in windows, an index is read through its memory map
            a window at a time.
        budget: the most cost one batch may have; a sequence of one budget per rank gives
            ranks with different memory budgets of their own (step counts stay equal).
        cost: cost model (``"padded"``, ``"sum"``, ``"polynomial"``, a ``CostModel``).
        strategy: grouping strategy (``"pooled"`` default; see :mod:`fitbatch.strategies`).
        num_replicas: data-parallel world size; read from ``torch.distributed`` when omitted.
        rank: this process's rank in it; read from ``torch.distributed`` when omitted.
        policy: leftover batches that do not divide among ranks: ``"split"`` or ``"drop"``.
        n: the number of samples when ``sizes`` is a callable.
        loss_sizes: optional, per sample, the tokens that carry loss (labels != -100): they do
            not change the batches; ``step_totals().loss_units`` sums them per step over all
            ranks, and they are part of the state's ``sizes_digest``.
        window: samples per window (rounded down to whole blocks), each planned alone, in
            memory O(window) (:mod:`fitbatch.epoch._windows`). ``"auto"`` (default): above
            :data:`fitbatch.epoch._windows.AUTO_ABOVE` samples (2**25), windows of
            :func:`~fitbatch.epoch._windows.auto_window` samples (about a million), else one
            window; ``None``: one window. The window changes memory, never which options
            work: ``drop_last``, ``max_shapes`` and per-rank budgets mean something of the
            whole epoch, so with them the epoch is one window.
        block: samples per block, the unit the epoch's keyed permutation of windows moves.
        census: how ``len()`` counts the batches of windows not planned yet:
            ``"collective"`` (shared over ``torch.distributed`` when it is initialised; every
            rank must call ``len()`` together) or ``"local"``.
        **options: ``max_batch_size``, ``batch_size_multiple``, ``shuffle``, ``seed``,
            ``oversized``, ``drop_last``, ``saturation``, ``max_shapes`` (see :attr:`shapes`),
            with the meaning and the defaults of the :class:`fitbatch.plan.PlanOptions` attributes (typed:
            :class:`~fitbatch.plan._options.PlanKeywords`).

    Raises:
        ValueError, TypeError: invalid sizes, budget or options (naming the parameter).

    >>> sampler = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted", num_replicas=1, rank=0)
    >>> list(sampler), len(sampler)
    ([[3, 1], [6, 0, 2], [4, 7], [5]], 4)
    >>> windowed = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 10, window=4, block=2, strategy="sorted",
    ...                               num_replicas=1, rank=0)
    >>> list(windowed), len(windowed)
    ([[3, 1], [0, 2], [6, 4], [7], [5]], 5)
    """

    STATE = StateSchema(
        "sampler",
        version=2,
        required={
            EPOCH_KEY: integer(),
            STEP_KEY: integer(),  # steps of the epoch consumed, all arrangements together
            NUM_REPLICAS_KEY: integer(1),  # the world the epoch began on
            N_SAMPLES_KEY: integer(),
            SIZES_DIGEST_KEY: DIGEST,
            OPTIONS_KEY: mapping,  # the options the epoch began with
            EVENTS_KEY: sampler_events,  # changes of budget, cost or world size during the epoch
        },
        optional={  # planning in windows: the window the step is in
            WINDOW_KEY: integer(),
            WINDOW_STEP_KEY: integer(),  # the step of the epoch that window began at
            CARRY_KEY: integer(),  # batches it was handed by the window before it
            WINDOW_DIGEST_KEY: DIGEST,
        },
    )
    CURSOR_KEY = STEP_KEY
    CONFIG_KEY = OPTIONS_KEY
    CONFIG_NAME = "set of planning options"
    SHARES_PLAN = True
    CONFIG_HINT = (
        " (those the saved epoch began with: a budget or cost changed during the epoch is an event "
        "in the state, replayed on load)"
    )

    def __init__(
        self,
        sizes: SizesLike,
        budget: float | str | Sequence[float | str] | Mapping[str, float | str],
        *,
        cost: str | CostModel | Any = "padded",
        strategy: str | Strategy = "pooled",
        num_replicas: int | None = None,
        rank: int | None = None,
        policy: str = "split",
        n: int | None = None,
        loss_sizes: Any = None,
        window: int | str | None = "auto",
        block: int = W.BLOCK,
        census: str = "collective",
        **options: Unpack[PlanKeywords],
    ) -> None:
        self._column = W.Column.of(sizes, n)
        # the protocol's samples: it reads their len(), values and columns (see _sizes_digest)
        self._sizes = self._column  # type: ignore[assignment]
        self._loss = check_loss_sizes(loss_sizes, len(self._column), self._column.values)
        self.num_replicas, self.rank = world_info(num_replicas, rank)
        self._budgets: Budgets = None
        if isinstance(budget, Sequence) and not isinstance(budget, str):
            if len(budget) != self.num_replicas:
                raise ValueError(f"budget has {len(budget)} per-rank values for {self.num_replicas} ranks")
            self._budgets = tuple(parse_budget(b, "budget") for b in budget)
            budget = min(self._budgets)
        if "seed" in options:
            options["seed"] = shared_seed(options["seed"], self.num_replicas)
        self._opts = PlanOptions.build(budget, cost=cost, strategy=strategy, **options)
        if self._budgets is not None and self._opts.max_shapes is not None:
            raise ValueError("max_shapes needs one budget for every rank (the shapes are shared); pass one budget")
        self.policy = choice("policy", policy, POLICIES)
        self.block = int(positive_int("block", block) or W.BLOCK)
        self.census = choice("census", census, CENSUS)
        self._auto = window == "auto"
        self.window = self._window(window)
        # the current epoch: what it began with, its changes (events) and its windows as they run
        self._begun: tuple[PlanOptions, Budgets] = (self._opts, self._budgets)
        self._world0 = self.num_replicas
        self._events: list[dict[str, Any]] = []
        self._live: Live | None = None  # the window running now
        self._from_row = 0  # the first step of the epoch this world runs
        self._marks: dict[int, tuple[int, int]] = {}  # window -> (first step, batches handed in), this epoch
        self._counts: dict[tuple[int, str], dict[int, int]] = {}  # census: (epoch, options) -> window -> own batches
        self._lasts: dict[tuple[int, str], tuple[int, int]] = {}  # (epoch, options) -> the last window's own batches, slack
        self._cache: tuple[int, Steps] | None = None  # another epoch's arrangement (one window)
        self._rank_layout: tuple[int, int, int, RankLayout] | None = None  # (epoch, revision, rank, layout)

    def _window(self, window: Any) -> int | None:
        """Samples per window from the ``window`` argument, or ``None`` for one window (see the class)."""
        if window is None:
            return None
        if isinstance(window, numbers.Integral) and not isinstance(window, bool):
            size: int | None = int(positive_int("window", window) or 0)
        elif window == "auto":
            size = None
        else:
            raise ValueError(f"window must be 'auto', None or a number of samples >= 1, got {window!r}")
        whole = [name for name in _WHOLE_EPOCH if getattr(self._opts, name) not in (None, False)]
        whole += ["per-rank budgets"] if self._budgets is not None else []
        if window == "auto":
            if len(self._column) <= W.AUTO_ABOVE or whole:
                return None
            size = W.auto_window(self._column, self._opts, self.num_replicas)
            logger.info("%d samples: planned in windows of %d (pass window=None for one window)", len(self._column), size)
        elif whole:
            logger.info("window=%s: the epoch is one window with %s, which are the whole epoch's", window, ", ".join(whole))
            return None
        assert size is not None
        if size < 2 * self.num_replicas:  # every window (the last: half of one, at least) gives every rank a batch
            raise ValueError(f"window={size} holds fewer than 2 x num_replicas={self.num_replicas} samples; pass a larger window")
        self._column.screen(self._opts)  # an oversized sample refused now, not windows into the epoch
        return size

    # ------------------------------------------------------------------ configuration

    @property
    def options(self) -> PlanOptions:
        return self._opts

    @property
    def budget(self) -> float:
        return self._opts.budget

    def set_budget(self, budget: float | str | Mapping[str, float | str]) -> None:
        """Change the budget from the next batch on (e.g. after an out-of-memory error).

        Before the epoch's first batch, the epoch is planned with it. Part-way through an epoch,
        the samples of the steps not yet handed out (of the window running, planning in windows)
        are planned again with the new budget and arranged for the ranks: a running iteration
        takes them at its next batch, every sample of the epoch still runs once, ``len()`` and
        :meth:`step_totals` describe the epoch as it now runs, and the state records the change
        as an event (``{"step": k, "budget": b}``, with its ``"window"`` planning in windows), so
        a resume rebuilds the same batches. Later windows and epochs are planned with the new
        budget; batches handed on to the next window that are over it are planned again there.

        Every rank must make the same change at the same step (:class:`~fitbatch.memory.OOMGuard`
        agrees on one budget over all ranks; a ``DataLoader`` must hand out as many batches on
        every rank, i.e. the same ``num_workers`` and ``prefetch_factor``). With per-rank budgets,
        each rank's budget is scaled so that the smallest becomes ``budget``. With several limits,
        ``budget`` is a mapping of every column to its new budget (a cost change, see
        :meth:`set_cost`).

        Raises:
            ValueError: a budget that is not positive and finite, or (``oversized="error"``) one
                that a sample exceeds alone (any sample: later epochs plan them all); a refused
                change changes nothing.

        >>> sampler = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted", num_replicas=1, rank=0)
        >>> it = iter(sampler)
        >>> next(it), next(it)
        ([3, 1], [6, 0, 2])
        >>> sampler.set_budget(9)
        >>> list(it), len(sampler), sampler.state_dict()["events"]
        ([[4], [7], [5]], 5, [{'step': 2, 'budget': 9.0}])
        """
        change = budget_change(self._opts, budget)
        if change is not None:
            self._change(*change)

    def set_cost(self, cost: Any) -> None:
        """Change the cost model from the next batch on (e.g. a memory model refitted after OOM).

        Like :meth:`set_budget`: part-way through an epoch the rest of it is planned again and the
        state records the change (``{"step": k, "cost": model.to_dict()}``); a resume rebuilds the
        model from that description (built-in and :mod:`fitbatch.memory` models).
        """
        change = cost_change(self._opts, cost)
        if change is not None:
            self._change(*change)

    def _change(self, change: dict[str, Any], model: CostModel | None = None) -> None:
        known = () if model is None else (model,)
        opts, budgets = changed(self._opts, self._budgets, {STEP_KEY: 0, **change}, known)
        self._column.screen(opts)  # fail here, not when the next epoch is planned; a refused change changes nothing
        if self._position == 0 and not self._events:  # the epoch has not begun: it begins with the change
            self._begun = (opts, budgets)
            self._opts, self._budgets = opts, budgets
            self._live, self._marks, self._cache = None, {}, None
            logger.info("epoch %d planned with %s", self.epoch, change)
        else:
            live = self._current()
            event = {**self._window_of_event(live), STEP_KEY: self._position - live.first, **change}
            self._apply(live, event, self._generation(live), known)
            self._events.append(event)
            self._cache = None
            logger.info("epoch %d: %s from step %d on; the rest re-planned", self.epoch, change, self._position)
        self._revision += 1

    def _window_of_event(self, live: Live) -> dict[str, int]:
        """An event's window field: planning in windows, the window it happened in (else none)."""
        return {} if self.window is None else {WINDOW_KEY: live.plan.index}

    def _generation(self, live: Live) -> int:
        """The number of the next event of ``live``'s window (1 for its first): it keys the re-plan's stream."""
        return 1 + sum(int(e.get(WINDOW_KEY, 0)) == live.plan.index for e in self._events)

    def _apply(self, live: Live, event: Mapping[str, Any], generation: int, known: Sequence[CostModel] = ()) -> None:
        """Apply the ``generation``-th event of ``live``'s window to its timeline, and to the options in force."""
        local = {k: v for k, v in event.items() if k != WINDOW_KEY}
        planner = Planner(live.plan.sizes, self.policy, self.epoch, live.plan.loss)
        try:
            live.timeline, self._opts, self._budgets = planner.apply(
                live.timeline, local, generation, self._opts, self._budgets, (*known, self._opts.cost)
            )
        except TooFewSamples:
            if NUM_REPLICAS_KEY not in local or live.last:
                raise
            # the rest of the window cannot be split among the new ranks: it joins the next window
            joined = W.carry_rest(
                live, self._column, self.windows(), int(local[STEP_KEY]), int(local[NUM_REPLICAS_KEY]), self._opts,
                epoch=self.epoch, policy=self.policy, loss=self._loss,
            )
            live.plan, live.timeline, live.last, live.span = joined.plan, joined.timeline, joined.last, joined.span

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plans (every rank must call it alike).

        >>> sampler = BudgetBatchSampler([3, 1, 4, 1], 4, num_replicas=1, rank=0)
        >>> sampler.set_epoch(1)
        >>> sampler.epoch, len(sampler)
        (1, 3)
        """
        before = self.epoch
        super().set_epoch(epoch)
        if self.epoch != before:  # changes and resumes apply to their own epoch only
            self._begun, self._world0 = (self._opts, self._budgets), self.num_replicas
            self._events, self._live, self._marks, self._from_row = [], None, {}, 0
            self._revision += 1

    # ------------------------------------------------------------------ windows

    def windows(self, epoch: int | None = None) -> W.Windows:
        """The windows of an epoch (default: the current one); one window without ``window=``.

        A last window whose own batches could not be split among the ranks joins the one
        before it (again, until one can be, or the epoch is one window).
        """
        epoch = self._epoch(epoch)
        n = len(self._column)
        if self.window is None:
            return W.Windows.whole(n)
        opts = self._begun[0] if epoch == self.epoch else self._opts
        return W.Windows.keyed(n, window=self.window, block=self.block, seed=opts.seed, epoch=epoch, shuffle=opts.effective_shuffle)

    def _last(self, epoch: int) -> tuple[int, int]:
        """The last window's own batches and its samples less them, under the options in force (for :func:`W.absorbs`)."""
        key = (epoch, _key(self._opts))
        if key not in self._lasts:
            windows = self.windows(epoch)
            _, _, own = W.own_plan(self._column, windows, windows.n_windows - 1, self._opts, epoch)
            self._lasts[key] = (len(own), own.n_samples - len(own))
        return self._lasts[key]

    def _options_at(self, w: int) -> tuple[PlanOptions, Budgets, int]:
        """The options, per-rank budgets and world in force when window ``w`` of the current epoch began."""
        opts, budgets = self._begun
        if w == 0:
            return opts, budgets, self._world0
        later, world = W.options_at(opts, self._world0, [e for e in self._events if WINDOW_KEY in e], w, self._opts.cost)
        return later, budgets, world

    def _build(self, w: int, first: int, carry_in: Sequence[np.ndarray]) -> Live:
        """Window ``w`` planned with the options of its start, handed ``carry_in``; its saved events replayed.

        Leaves the options in force at those after the window's events. One window is the
        epoch planned whole (:class:`~fitbatch.epoch._timeline.Planner`), in index order.
        """
        windows = self.windows()
        self._opts, self._budgets, world = self._options_at(w)
        absorb = None
        if windows.one:
            sizes = self._column.whole()
            timeline = Planner(sizes, self.policy, self.epoch, self._loss).start(self._opts, self._budgets, world)
            plan = W.WindowPlan(0, None, sizes, timeline.steps, (), 0, self._loss)
        else:
            own = W.own_plan(self._column, windows, w, self._opts, self.epoch)
            if w == windows.n_windows - 2:  # the last window joins this one if it could not be split
                theirs = W.own_plan(self._column, windows, w + 1, self._opts, self.epoch)
                if W.absorbs(len(carry_in), len(own[2]), theirs[2], world, self.policy):
                    absorb = theirs
                    logger.info("epoch %d: the last window cannot be split for %d ranks; it joins window %d", self.epoch, world, w)
            plan = W.build_window(
                self._column, windows, w, self._opts, world=world, epoch=self.epoch, carry_in=carry_in,
                policy=self.policy, own=own, loss=self._loss, absorb=absorb,
            )
            timeline = Timeline.start(plan.steps, self._opts.cost, self._opts.budget)
        self._marks[w] = (first, len(carry_in))
        span = 1 if absorb is None else 2
        live = Live(plan, first, timeline, w + span - 1 == windows.n_windows - 1, span)
        mine = [event for event in self._events if int(event.get(WINDOW_KEY, 0)) == w]
        for generation, event in enumerate(mine, 1):
            self._apply(live, event, generation)
        self._live = live
        return live

    def _rebuild(self, w: int, first: int, carried: int) -> Live:
        """Window ``w`` rebuilt on its own (a resume): the window before it planned for what it handed on."""
        carry: tuple[np.ndarray, ...] = ()
        if carried:
            before = self._options_at(w - 1)[0]
            ids, _, own = W.own_plan(self._column, self.windows(), w - 1, before, self.epoch)
            carry = tuple(ids[b] for b in own.select(W.handed_on(own, carried, before, self.epoch, w - 1)))
        return self._build(w, first, carry)

    def _current(self) -> Live:
        """The window running now (window 0 when the epoch has not begun: planned on first use)."""
        if self._live is None:
            live = self._build(0, 0, ())
            if self.rank == 0:
                summary = live.timeline.steps.rank_plan(0).stats().summary()
                n_windows = self.windows().n_windows
                if n_windows == 1:  # an epoch planned whole: its plan's summary, as before windows
                    logger.info("epoch %d: %s", self.epoch, summary)
                else:
                    logger.info("epoch %d: %d windows; window 0: %s", self.epoch, n_windows, summary)
            return live
        return self._live

    def _next(self, live: Live) -> Live:
        """The window after ``live``, handed ``live``'s batches."""
        return self._build(live.plan.index + live.span, live.end, live.plan.carry)

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
        tl, ids = live.timeline, live.plan.ids
        if ids is None and live is self._live:
            lay = self._layout(self.epoch)
            return lay.plan, lay.first
        local = tl.rank_plan(self.rank, live.plan.sizes)
        if ids is None:  # one window: its indices are the dataset's (the layout's, when it is the live one)
            return local, live.first + tl.base
        per = (local.costs, local.real_units, local.padded_units)
        plan = local.rebatched(ids[local.order], local.offsets, per, index_map=ids)
        return plan, live.first + tl.base

    # ------------------------------------------------------------------ plans

    def steps(self, epoch: int | None = None) -> Steps:
        """The epoch's arrangement into steps (shared by all ranks); planning in windows, the window's.

        For the current epoch after a change part-way through it (budget, cost, world size):
        the arrangement of the rest of the epoch (of its window), from the step of the last
        change on. Another epoch planned in windows: its first window's.
        """
        epoch = self._epoch(epoch)
        if epoch == self.epoch:
            return self._current().timeline.steps
        if self._cache is None or self._cache[0] != epoch:
            if self.windows(epoch).one:
                planner = Planner(self._column.whole(), self.policy, epoch, self._loss)
                steps = planner.arrange(self._opts, self._budgets, self.num_replicas)
            else:
                other = self._other(epoch)
                steps = other._current().timeline.steps
            self._cache = (epoch, steps)
        return self._cache[1]

    def _other(self, epoch: int) -> BudgetBatchSampler:
        """This sampler at the start of another epoch (its options those in force now)."""
        other = copy.copy(self)
        other._rank_layout, other._cache = None, None
        other.set_epoch(epoch)
        return other

    def _layout(self, epoch: int) -> RankLayout:
        """The epoch as this rank runs it (planning in windows: walked window by window, time O(n))."""
        if epoch != self.epoch:
            if self.windows(epoch).one:
                steps = self.steps(epoch)
                return RankLayout(steps.rank_plan(self.rank), steps.step_samples, steps.step_units, 0, steps.step_loss_units)
            return self._other(epoch)._layout(epoch)
        if self._rank_layout is not None and self._rank_layout[:3] == (epoch, self._revision, self.rank):
            return self._rank_layout[3]
        live = self._current()
        if live.plan.ids is None:  # one window
            samples, units, loss = live.timeline.step_totals()
            layout = RankLayout(live.timeline.rank_plan(self.rank, live.plan.sizes), samples, units, live.timeline.base, loss)
        else:
            layout = self._walked()
        if live.plan.ids is None:  # (a walked epoch is not kept: it is O(n))
            self._rank_layout = (epoch, self._revision, self.rank, layout)
        return layout

    def _walked(self) -> RankLayout:
        """The current epoch walked window by window from window 0 (the windows are rebuilt, then the live one restored)."""
        saved = (self._live, dict(self._marks), self._opts, self._budgets)
        parts, totals, left_out = [], [], []
        live = self._build(0, 0, ())
        while True:
            if live.end > self._from_row:  # windows before a change of world size ran on other ranks
                parts.append(self._rank_batches(live)[0])
            totals.append(live.timeline.step_totals())
            whole = live.timeline.steps.plan  # the epoch's samples left out, as dataset indices
            ids = live.plan.ids
            assert ids is not None
            left_out.append((ids[whole.skipped], ids[whole.dropped], whole.dropped_batches))
            if live.last:
                break
            live = self._next(live)
        self._live, self._marks, self._opts, self._budgets = saved
        if not parts:  # an epoch of no steps (every batch dropped)
            parts.append(self._rank_batches(live)[0])
        joined = _join(parts, parts[-1], lower_bound=sum(p.lower_bound for p in parts), straggler=None)
        joined.skipped = np.concatenate([s for s, _, _ in left_out])
        joined.dropped = np.concatenate([d for _, d, _ in left_out])
        joined.dropped_batches = sum(k for _, _, k in left_out)
        joined.loss_sizes = self._loss
        samples, units, loss = (np.concatenate([getattr(t, f) for t in totals]) for f in ("samples", "units", "loss_units"))
        return RankLayout(joined, samples, units, self._from_row, loss)

    # ------------------------------------------------------------------ iteration and len()

    def _segment_at(self, row: int) -> Segment:
        return self._segment(self._at(row))

    def _segment_plan(self, seg: Segment) -> tuple[BatchPlan, Segment]:
        live = seg.handle
        if self._live is not None and self._live.plan.index == live.plan.index:  # as re-planned by a change
            live = self._live
        plan, first = self._rank_batches(live)
        return plan, self._segment(live, first)

    def _segment_after(self, seg: Segment) -> Segment:
        return self._segment(self._next(seg.handle))

    @staticmethod
    def _segment(live: Live, first: int | None = None) -> Segment:
        """A window as iteration's segment: its rows from ``first`` (this rank's plan's first
        row, which after a change of world size may follow the window's first step)."""
        return Segment(key=live.plan.index, first=live.first if first is None else first, end=live.end, last=live.last,
                       handle=live)

    def _span(self) -> tuple[int, int]:
        """The steps of the epoch this rank runs (``len()``'s hook): planning in windows, the
        steps of windows not planned yet come from a *census* of their batch counts (once per
        epoch; ``census="collective"``: every rank must call ``len()`` together)."""
        return self._first_row(), self._end()

    def _first_row(self) -> int:
        """The first step this world runs (after a resume on another world size: where it took over)."""
        live = self._current()
        return live.timeline.base if live.plan.ids is None else self._from_row

    def _end(self) -> int:
        """Steps in the epoch as it runs now: the live window's end, then the census's steps.

        Windows that hold saved events (a prefetching loader's, after a resume) are planned to
        count them; the census counts the others with the options in force after them.
        """
        live = self._current()
        ahead = max((int(e[WINDOW_KEY]) for e in self._events if WINDOW_KEY in e), default=-1)
        if ahead > live.plan.index and not live.last:
            saved = (self._live, dict(self._marks), self._opts, self._budgets)
            try:
                while live.plan.index < ahead and not live.last:
                    live = self._next(live)
                return self._end_after(live)
            finally:
                self._live, self._marks, self._opts, self._budgets = saved
        return self._end_after(live)

    def _end_after(self, live: Live) -> int:
        """The epoch's steps when window ``live`` runs with the options in force now."""
        if live.last:
            return live.end
        todo = list(range(live.plan.index + live.span, self.windows().n_windows))
        counts = self._census(todo, self.epoch)
        refit = W.carried_batches(self._column, live.plan.carry, self._opts, self.epoch, todo[0])
        steps = W.window_steps(
            [counts[w] for w in todo], self.num_replicas, self.policy, len(live.plan.carry), refit, self._last(self.epoch)
        )
        return live.end + sum(steps)

    def n_steps(self, epoch: int | None = None) -> int:
        """How many batches this rank runs in the epoch (default: the current one): ``len(plan(epoch))``.

        Planning in windows, without planning the epoch: the windows planned so far, then each
        later window's batch count (the census; collective like ``len()``).

        >>> BudgetBatchSampler([3, 1, 4, 1], 4, strategy="sorted", num_replicas=1, rank=0).n_steps()
        3
        >>> BudgetBatchSampler([5] * 8, 5, window=4, block=1, cost="sum", num_replicas=2, rank=0).n_steps()
        4
        """
        epoch = self._epoch(epoch)
        if epoch == self.epoch:
            return self._end() - self._first_row()
        windows = self.windows(epoch)
        if windows.one:
            return len(self.plan(epoch))
        todo = list(range(windows.n_windows))
        counts = self._census(todo, epoch)
        return sum(W.window_steps([counts[w] for w in todo], self.num_replicas, self.policy, last=self._last(epoch)))

    def _census(self, todo: list[int], epoch: int) -> dict[int, int]:
        """Own batch counts of an epoch's windows ``todo`` under the options in force (once per epoch and options)."""
        known = self._counts.setdefault((epoch, _key(self._opts)), {})
        missing = [w for w in todo if w not in known]
        if missing:
            group = self.census == "collective" and shared_world(self.num_replicas)
            counts = W.census(self._column, self.windows(epoch), self._opts, epoch, missing, self.rank, self.num_replicas, group)
            known.update(zip(missing, counts))
        return known

    # ------------------------------------------------------------------ state

    def _config(self, begun: tuple[PlanOptions, Budgets] | None = None) -> dict[str, Any]:
        out = _options(*(self._begun if begun is None else begun))
        if self.window is not None:
            out.update(window=self.window, block=self.block)
        return out

    def _extra_state(self) -> dict[str, Any]:
        return {NUM_REPLICAS_KEY: self._world0, EVENTS_KEY: copy.deepcopy(self._events)}

    def _sizes_digest(self) -> str:
        if self._digest is None:
            column = self._column
            if column.index is not None and (self.window is not None and self._loss is None):
                self._digest = column.digest  # the index's own: the column is never read whole
            else:
                values = column.values if column.index is None else column.whole().values
                self._digest = sizes_digest(values, self._loss, column.columns)
        return self._digest

    def _window_digest(self, fields: Mapping[str, Any]) -> str:
        """The digest that ties a state's window fields to its epoch, world, events and samples."""
        keys = (EPOCH_KEY, NUM_REPLICAS_KEY, SIZES_DIGEST_KEY, EVENTS_KEY, WINDOW_KEY, WINDOW_STEP_KEY, CARRY_KEY)
        text = json.dumps([fields.get(k) for k in keys], sort_keys=True, default=str)
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def state_dict(self, *, step: int | None = None) -> dict[str, Any]:
        """A JSON-able state: ``epoch``, ``step`` (steps of the epoch already consumed) and the epoch's changes.

        Also ``num_replicas`` (the world the epoch began on), ``options`` (the planning options
        it began with), ``events`` (changes part-way through it, oldest first: ``{"step": k,
        "budget": b}``, ``{"step": k, "cost": {...}}`` or ``{"step": k, "num_replicas": w}``),
        ``n_samples`` and ``sizes_digest`` (a fingerprint of the sizes). Planning in windows,
        also ``window`` (the window the step is in), ``window_step`` (the step of the epoch it
        began at), ``carry`` (batches it was handed), each event's ``window`` (its ``step``
        counts from that window's first), and ``window_digest``, which ties them together: a
        resume plans two windows, and a state whose window fields were edited is refused.

        Args:
            step: steps the training loop completed in this epoch. Defaults to the batches the
                latest iterator handed out; with a ``DataLoader`` that prefetches (workers),
                pass the loop's own count, or use ``torchdata``'s ``StatefulDataLoader``.

        Raises:
            ValueError: ``step`` beyond the epoch's steps (or before the step where this
                world began it).

        >>> sampler = BudgetBatchSampler([3, 1, 4, 1], 8, num_replicas=1, rank=0)
        >>> state = sampler.state_dict(step=1)
        >>> state["epoch"], state["step"], state["events"]
        (0, 1, [])
        """
        if self.window is None:
            return self._save_state(step)
        cursor = self._position if step is None else non_negative_int(STEP_KEY, step)
        live = self._current()
        if not self._from_row <= cursor <= live.end:
            raise ValueError(
                f"step {cursor} is outside the steps of epoch {self.epoch} this sampler knows "
                f"({self._from_row}..{live.end}); pass the steps of the epoch completed"
            )
        w = W.window_of(self._marks, cursor, live)
        first, carried = self._marks[w]
        fields = {
            EPOCH_KEY: self.epoch, STEP_KEY: cursor, NUM_REPLICAS_KEY: self._world0, N_SAMPLES_KEY: len(self._column),
            SIZES_DIGEST_KEY: self._sizes_digest(), OPTIONS_KEY: self._config(), EVENTS_KEY: copy.deepcopy(self._events),
            WINDOW_KEY: w, WINDOW_STEP_KEY: first, CARRY_KEY: carried,
        }
        return self.STATE.envelope(**fields, **{WINDOW_DIGEST_KEY: self._window_digest(fields)})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where ``state`` was taken (see the module docstring).

        The sampler must be built with the options the saved epoch began with
        (``state["options"]``); the changes made during the epoch are replayed from
        ``state["events"]``, after which the sampler has the options in force when the state was
        saved (later epochs plan with them). Planning in windows, the saved window is planned
        (and, when it was handed batches, the one before it), not the epoch.

        Raises:
            ValueError: a state of another kind or version, a value of the wrong type or range,
                other samples (count or ``sizes_digest``), other planning options, a ``step``,
                window or event outside the epoch, window fields that contradict the state, or
                per-rank budgets resumed on another world size.

        >>> sizes = [3, 1, 4, 1, 5, 9, 2, 6]
        >>> state = BudgetBatchSampler(sizes, 12, strategy="sorted", num_replicas=1, rank=0).state_dict(step=2)
        >>> resumed = BudgetBatchSampler(sizes, 12, strategy="sorted", num_replicas=1, rank=0)
        >>> resumed.load_state_dict(state)
        >>> list(resumed)
        [[4, 7], [5]]
        """
        self.STATE.check(state)
        saved_options = state[OPTIONS_KEY]
        if self._auto and self.window is not None and isinstance(saved_options.get("window"), int):
            self.window = saved_options["window"]  # chosen for the world the epoch began on
        world0, saved = int(state[NUM_REPLICAS_KEY]), copy.deepcopy(list(state[EVENTS_KEY]))
        worlds = {world0, *(int(e[NUM_REPLICAS_KEY]) for e in saved if NUM_REPLICAS_KEY in e)}
        if self._budgets is not None and worlds != {self.num_replicas}:
            raise ValueError(
                f"state was saved on {sorted(worlds)} ranks with per-rank budgets, this sampler has "
                f"{self.num_replicas}; resuming per-rank budgets with a different world size is not supported"
            )
        now, begun = (self._opts, self._budgets), self._begun
        epoch, step, is_now = self._check_began(state, self._config(now), self._config(begun))
        w, first, carried = self._window_fields(state)
        self.set_epoch(epoch)
        self._begun, self._world0, self._events = now if is_now else begun, world0, saved
        self._cache, self._marks = None, {}
        n_windows = self.windows().n_windows
        if w >= n_windows or (w == 0 and (carried or first)) or step < first:
            raise ValueError(
                f"state's window {w} (step {first}, carry {carried}) is not in epoch {epoch} of {n_windows} windows at "
                f"step {step}; pass what state_dict() returned, unchanged"
            )
        earlier = any(NUM_REPLICAS_KEY in e and int(e.get(WINDOW_KEY, 0)) < w for e in saved)
        self._from_row = first if earlier else 0
        live = self._rebuild(w, first, carried)
        if live.plan.ids is None or any(NUM_REPLICAS_KEY in e and int(e.get(WINDOW_KEY, 0)) == w for e in saved):
            self._from_row = max(self._from_row, live.first + live.timeline.base)
        check_step(STEP_KEY if self.window is None else f"step {step}", step - first, live.timeline, epoch)
        if live.timeline.world != self.num_replicas:
            self._resume_on(live, w, step - first)
            self._from_row = step
        self._live = live
        self._seek(step)

    def _window_fields(self, state: Mapping[str, Any]) -> tuple[int, int, int]:
        """The state's window, its first step and its carry (0, 0, 0 without windows), checked against its digest."""
        present = [k for k in _WINDOW_FIELDS if k in state]
        if self.window is None:
            return 0, 0, 0  # (a windowed state names other options: refused before this)
        if len(present) != len(_WINDOW_FIELDS):
            raise ValueError(f"state planned in windows lacks {sorted(set(_WINDOW_FIELDS) - set(present))}; pass what state_dict() returned, unchanged")
        if state[WINDOW_DIGEST_KEY] != self._window_digest(state):
            raise ValueError(
                f"state's window fields (window {state[WINDOW_KEY]}, window_step {state[WINDOW_STEP_KEY]}, carry "
                f"{state[CARRY_KEY]}) contradict its epoch, world and events (window_digest differs); pass what "
                "state_dict() returned, unchanged"
            )
        return int(state[WINDOW_KEY]), int(state[WINDOW_STEP_KEY]), int(state[CARRY_KEY])

    def _resume_on(self, live: Live, w: int, step: int) -> None:
        """Window ``live`` (``w``) re-arranged for this world from its ``step`` on (a resume on another world size)."""
        event = {**self._window_of_event(live), STEP_KEY: step, NUM_REPLICAS_KEY: self.num_replicas}
        # events of later windows (a prefetching loader's, past the saved step) name steps of
        # the old world's windows: as in one window, the rest of the epoch runs with the options
        # in force after them, so they move to the resume point
        later = [e for e in self._events if int(e.get(WINDOW_KEY, 0)) > w]
        self._events = [e for e in self._events if int(e.get(WINDOW_KEY, 0)) <= w]
        for change in (event, *({**e, WINDOW_KEY: w, STEP_KEY: step} for e in later)):
            self._apply(live, change, self._generation(live))
            self._events.append(change)
        logger.info(
            "resumed epoch %d at step %d (window %d): the %d samples left re-arranged for %d ranks",
            self.epoch, live.first + step, w, live.timeline.steps.plan.n_samples, self.num_replicas,
        )

    def __repr__(self) -> str:
        where = f"rank={self.rank}/{self.num_replicas}, epoch={self.epoch}"
        shown = "" if self.window is None else f", window={self.window}"
        return (
            f"BudgetBatchSampler(n={len(self._column)}, budget={self.budget:g}, cost={self._opts.cost.name!r}, "
            f"strategy={self._opts.strategy.name!r}{shown}, {where})"
        )


def _key(opts: PlanOptions) -> str:
    """Options as a cache key."""
    return json.dumps(opts.to_dict(), sort_keys=True, default=str)


def _options(opts: PlanOptions, budgets: Budgets) -> dict[str, Any]:
    """The options a state records and compares (with the per-rank budgets, if any)."""
    out = opts.to_dict()
    if budgets is not None:
        out["budgets"] = list(budgets)
    return out


__all__ = ["BudgetBatchSampler"]
