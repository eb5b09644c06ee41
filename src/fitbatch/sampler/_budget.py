"""``BudgetBatchSampler``: budget-planned batches for ``torch.utils.data.DataLoader``.

A :class:`PlanSampler` (the protocol all fitbatch samplers share: ``len()``, iteration, epochs,
the resume cursor and the state envelope, see :mod:`fitbatch.sampler._protocol`), and a subclass of
torch's ``BatchSampler`` when torch is importable (a plain iterable otherwise). It yields lists
of int, has an exact ``len()`` (the batches the next iteration yields), ``set_epoch(epoch)``,
re-entrant iteration, data-parallel splitting and exact resume:

* every rank plans the same global epoch from ``(seed, epoch)`` and runs its share of
  cost-balanced steps; all ranks yield the same number of batches (see
  :mod:`fitbatch.epoch._arrange`);
* ``set_budget``/``set_cost`` part-way through an epoch re-plan the samples of the steps not yet
  handed out (the running iteration takes them at its next batch) and are saved as *events*;
* ``state_dict()`` is ``{version, epoch, step, events, ...}``; ``load_state_dict()`` re-plans the
  epoch (no replay of consumed batches), replays its events and continues at ``step``; if the
  world size changed, the rest of the epoch is re-arranged for the new world so every
  remaining sample is seen exactly once (:mod:`fitbatch.epoch._timeline`).

>>> sampler = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted")
>>> list(sampler)
[[3, 1], [6, 0, 2], [4, 7], [5]]
>>> len(sampler)
4
"""

from __future__ import annotations

import copy
import logging
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
    events,
    integer,
    mapping,
)
from fitbatch._validate import choice, parse_budget, positive_int
from fitbatch._validate import loss_sizes as check_loss_sizes
from fitbatch.costs import CostModel
from fitbatch.epoch._arrange import POLICIES, Steps
from fitbatch.epoch._timeline import (
    Budgets,
    Planner,
    Timeline,
    budget_change,
    changed,
    check_step,
    cost_change,
    screen,
)
from fitbatch.epoch._world import shared_seed, world_info
from fitbatch.plan._options import PlanKeywords, PlanOptions
from fitbatch.sampler._protocol import PlanSampler, RankLayout, torch_class
from fitbatch.sizes import SizesLike, as_sizes
from fitbatch.strategies import Strategy

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

#: torch's ``BatchSampler`` (``object`` without torch): the samplers' second base, so that
#: ``DataLoader`` and Lightning type checks pass
TorchBatchSampler = torch_class("BatchSampler")


class BudgetBatchSampler(PlanSampler, TorchBatchSampler):  # type: ignore[misc,valid-type]
    """Yield batches of indices whose cost fits a budget.

    ``plan()`` is this rank's batches in step order (after a resume on another world size: from
    the step the new ranks took over); :meth:`steps` is the arrangement of all ranks (after a
    change part-way through the epoch: that of its rest). :meth:`set_budget` and
    :meth:`set_cost` apply from the next batch; the state records them (see ``state_dict``).

    Args:
        sizes: one size per sample (array-like, mapping, or a callable with ``n``).
        budget: the most cost one batch may have; a sequence of one budget per rank gives
            ranks with different memory budgets of their own (step counts stay equal).
        cost: cost model (``"padded"``, ``"sum"``, ``"polynomial"``, a ``CostModel``).
        strategy: grouping strategy (``"pooled"`` default; see :mod:`fitbatch.strategies`).
        num_replicas: data-parallel world size; read from ``torch.distributed`` when omitted.
        rank: this process's rank in it; read from ``torch.distributed`` when omitted.
        policy: leftover batches that do not divide among ranks: ``"split"`` or ``"drop"``.
        n: the number of samples when ``sizes`` is a callable.
        window: ``"auto"`` (default): above :data:`fitbatch.epoch._windows.AUTO_ABOVE` samples (2**25),
            with one budget, no ``loss_sizes``, ``drop_last`` or ``max_shapes``, the sampler
            built is a :class:`~fitbatch.sampler.WindowedBatchSampler` that plans the epoch a window of
            about a million samples at a time; an int plans in windows of that many samples at
            any size; ``None`` never does.
        loss_sizes: optional, per sample, the tokens that carry loss (labels != -100): they do
            not change the batches; ``step_totals().loss_units`` sums them per step over all
            ranks, and they are part of the state's ``sizes_digest``.
        **options: ``max_batch_size``, ``batch_size_multiple``, ``shuffle``, ``seed``,
            ``oversized``, ``drop_last``, ``saturation``, ``max_shapes`` (see :attr:`shapes`),
            with the meaning and the defaults of the :class:`fitbatch.plan.PlanOptions` attributes (typed:
            :class:`~fitbatch.plan._options.PlanKeywords`).

    Raises:
        ValueError, TypeError: invalid sizes, budget or options (naming the parameter).

    >>> sampler = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted", num_replicas=1, rank=0)
    >>> list(sampler), len(sampler)
    ([[3, 1], [6, 0, 2], [4, 7], [5]], 4)
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
            EVENTS_KEY: events,  # changes of budget, cost or world size during the epoch
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

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # window="auto" (or a window size): a BudgetBatchSampler over very many samples is a
        # WindowedBatchSampler (fitbatch.sampler._windowed), which plans the epoch a window at a time
        if cls is BudgetBatchSampler and (args or "sizes" in kwargs):
            windowed, window = _window_for(args, kwargs)
            if windowed:
                from fitbatch.sampler._windowed import WindowedBatchSampler

                rest = {k: v for k, v in kwargs.items() if k != "window"}
                return WindowedBatchSampler(*args, window=window, **rest)
        return super().__new__(cls)

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
        **options: Unpack[PlanKeywords],
    ) -> None:
        if window not in ("auto", None):
            raise TypeError(f"window={window!r} plans in windows, which {type(self).__name__} does not; use fitbatch.sampler.WindowedBatchSampler")
        self._sizes = as_sizes(sizes, n)
        self._loss = check_loss_sizes(loss_sizes, len(self._sizes), self._sizes.values)
        self.num_replicas, self.rank = world_info(num_replicas, rank)
        self._budgets: tuple[float, ...] | None = None
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
        self._cache: tuple[int, Steps] | None = None  # another epoch's arrangement
        # the current epoch: what it began with, its changes (events) and its steps as they run
        self._begun: tuple[PlanOptions, Budgets] = (self._opts, self._budgets)
        self._world0 = self.num_replicas
        self._events: list[dict[str, Any]] = []
        self._timeline: Timeline | None = None
        self._rank_layout: tuple[int, int, RankLayout] | None = None  # (epoch, revision, layout)

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
        the samples of the steps not yet handed out are planned again with the new budget and
        arranged for the ranks: a running iteration takes them at its next batch, every sample of
        the epoch still runs once, ``len()`` and :meth:`step_totals` describe the epoch as it now
        runs, and the state records the change as an event (``{"step": k, "budget": b}``), so a
        resume rebuilds the same batches. Later epochs are planned with the new budget.

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
        event = {STEP_KEY: self._position, **change}
        opts, budgets = changed(self._opts, self._budgets, event, () if model is None else (model,))
        screen(self._sizes, opts)  # fail here, not when the next epoch is planned
        planner = Planner(self._sizes, self.policy, self.epoch, self._loss)
        if self._position == 0 and not self._events:  # the epoch has not begun: it begins with the change
            self._timeline, self._begun = planner.start(opts, budgets, self._world0), (opts, budgets)
            logger.info("epoch %d planned with %s", self.epoch, change)
        else:
            generation = len(self._events) + 1
            self._timeline, _, _ = planner.apply(self._current(), event, generation, self._opts, self._budgets, (opts.cost,))
            self._events.append(event)
            logger.info("epoch %d: %s from step %d on; the rest re-planned", self.epoch, change, self._position)
        self._opts, self._budgets, self._cache = opts, budgets, None
        self._revision += 1

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
            self._events, self._timeline = [], None
            self._revision += 1

    # ------------------------------------------------------------------ plans

    def steps(self, epoch: int | None = None) -> Steps:
        """The epoch's global arrangement into steps (shared by all ranks).

        For the current epoch after a change part-way through it (budget, cost, world size):
        the arrangement of the rest of the epoch, from the step of the last change on.
        """
        epoch = self._epoch(epoch)
        if epoch == self.epoch:
            return self._current().steps
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, Planner(self._sizes, self.policy, epoch, self._loss).arrange(self._opts, self._budgets, self.num_replicas))
        return self._cache[1]

    def _current(self) -> Timeline:
        """The current epoch's steps as they run (planned on first use)."""
        if self._timeline is None:
            self._timeline = Planner(self._sizes, self.policy, self.epoch, self._loss).start(*self._begun, self._world0)
            if self.rank == 0:
                logger.info("epoch %d: %s", self.epoch, self._timeline.steps.rank_plan(0).stats().summary())
        return self._timeline

    def _layout(self, epoch: int) -> RankLayout:
        if epoch != self.epoch:
            steps = self.steps(epoch)
            return RankLayout(steps.rank_plan(self.rank), steps.step_samples, steps.step_units, 0, steps.step_loss_units)
        if self._rank_layout is None or self._rank_layout[:2] != (epoch, self._revision):
            timeline = self._current()
            samples, units, loss = timeline.step_totals()
            layout = RankLayout(timeline.rank_plan(self.rank, self._sizes), samples, units, timeline.base, loss)
            self._rank_layout = (epoch, self._revision, layout)
        return self._rank_layout[2]

    # ------------------------------------------------------------------ state

    def _config(self) -> dict[str, Any]:
        return _options(*self._begun)

    def _extra_state(self) -> dict[str, Any]:
        return {NUM_REPLICAS_KEY: self._world0, EVENTS_KEY: copy.deepcopy(self._events)}

    def state_dict(self, *, step: int | None = None) -> dict[str, Any]:
        """A JSON-able state: ``epoch``, ``step`` (steps of the epoch already consumed) and the epoch's changes.

        Also ``num_replicas`` (the world the epoch began on), ``options`` (the planning options
        it began with), ``events`` (changes part-way through it, oldest first: ``{"step": k,
        "budget": b}``, ``{"step": k, "cost": {...}}`` or ``{"step": k, "num_replicas": w}``),
        ``n_samples`` and ``sizes_digest`` (a fingerprint of the sizes).

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
        return self._save_state(step)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where ``state`` was taken (see the module docstring).

        The sampler must be built with the options the saved epoch began with
        (``state["options"]``); the changes made during the epoch are replayed from
        ``state["events"]``, after which the sampler has the options in force when the state was
        saved (later epochs plan with them).

        Raises:
            ValueError: a state of another kind or version, a value of the wrong type or range,
                other samples (count or ``sizes_digest``), other planning options, a ``step``
                or event outside the epoch, or per-rank budgets resumed on another world size.

        >>> sizes = [3, 1, 4, 1, 5, 9, 2, 6]
        >>> state = BudgetBatchSampler(sizes, 12, strategy="sorted", num_replicas=1, rank=0).state_dict(step=2)
        >>> resumed = BudgetBatchSampler(sizes, 12, strategy="sorted", num_replicas=1, rank=0)
        >>> resumed.load_state_dict(state)
        >>> list(resumed)
        [[4, 7], [5]]
        """
        self.STATE.check(state)
        world0, saved = int(state[NUM_REPLICAS_KEY]), copy.deepcopy(list(state[EVENTS_KEY]))
        worlds = {world0, *(int(e[NUM_REPLICAS_KEY]) for e in saved if NUM_REPLICAS_KEY in e)}
        if self._budgets is not None and worlds != {self.num_replicas}:
            raise ValueError(
                f"state was saved on {sorted(worlds)} ranks with per-rank budgets, this sampler has "
                f"{self.num_replicas}; resuming per-rank budgets with a different world size is not supported"
            )
        now = (self._opts, self._budgets)
        epoch, step, is_now = self._check_began(state, _options(*now), _options(*self._begun))
        base = now if is_now else self._begun
        opts, budgets = base
        planner = Planner(self._sizes, self.policy, epoch, self._loss)
        timeline = planner.start(opts, budgets, world0)
        for generation, event in enumerate(saved, 1):
            timeline, opts, budgets = planner.apply(timeline, event, generation, opts, budgets, (self._opts.cost,))
        check_step(STEP_KEY, step, timeline, epoch)
        if timeline.world != self.num_replicas:
            saved.append({STEP_KEY: step, NUM_REPLICAS_KEY: self.num_replicas})
            timeline, _, _ = planner.apply(timeline, saved[-1], len(saved), opts, budgets)
            logger.info(
                "resumed epoch %d at step %d: the %d samples left re-arranged for %d ranks",
                epoch, step, timeline.steps.plan.n_samples, self.num_replicas,
            )
        self.set_epoch(epoch)
        self._begun, self._world0 = base, world0
        self._opts, self._budgets, self._cache = opts, budgets, None
        self._events, self._timeline = saved, timeline
        self._seek(step)

    def __repr__(self) -> str:
        return (
            f"BudgetBatchSampler(n={len(self._sizes)}, budget={self.budget:g}, cost={self._opts.cost.name!r}, "
            f"strategy={self._opts.strategy.name!r}, rank={self.rank}/{self.num_replicas}, epoch={self.epoch})"
        )


def _window_for(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[bool, int | None]:
    """Whether a ``BudgetBatchSampler(*args, **kwargs)`` plans in windows, and the
    ``WindowedBatchSampler``'s ``window`` (``None``: its own choice).

    >>> _window_for(([1, 2, 3], 4), {}), _window_for(([1, 2, 3], 4), {"window": 2})
    ((False, None), (True, 2))
    """
    from fitbatch.epoch import _windows as W

    window = kwargs.get("window", "auto")
    if window is None:
        return False, None
    if isinstance(window, numbers.Integral) and not isinstance(window, bool):
        return True, int(positive_int("window", window) or 0)
    if window != "auto":
        raise ValueError(f"window must be 'auto', None or a number of samples >= 1, got {window!r}")
    sizes = args[0] if args else kwargs.get("sizes")
    budget = args[1] if len(args) > 1 else kwargs.get("budget")
    n = kwargs.get("n") if callable(sizes) else len(sizes) if hasattr(sizes, "__len__") else None  # type: ignore[arg-type]
    blocked = kwargs.get("loss_sizes") is not None or kwargs.get("drop_last") or kwargs.get("max_shapes")
    per_rank = isinstance(budget, Sequence) and not isinstance(budget, str)
    if not isinstance(n, int) or n <= W.AUTO_ABOVE or blocked or per_rank:
        return False, None
    logger.info("%d samples: planned in windows (pass window=None for one global plan)", n)
    return True, None  # the windowed sampler's own choice (fitbatch.epoch._windows.auto_window)


def _options(opts: PlanOptions, budgets: Budgets) -> dict[str, Any]:
    """The options a state records and compares (with the per-rank budgets, if any)."""
    out = opts.to_dict()
    if budgets is not None:
        out["budgets"] = list(budgets)
    return out
