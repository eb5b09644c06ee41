"""``BudgetBatchSampler``: budget-planned batches for ``torch.utils.data.DataLoader``.

A :class:`PlanSampler` (the protocol all fitbatch samplers share: ``len()``, iteration, epochs,
the resume cursor and the state envelope, see :mod:`fitbatch._plan_sampler`), and a subclass of
torch's ``BatchSampler`` when torch is importable (a plain iterable otherwise). It yields lists
of int, has an exact ``len()`` (the batches the next iteration yields), ``set_epoch(epoch)``,
re-entrant iteration, data-parallel splitting and exact resume:

* every rank plans the same global epoch from ``(seed, epoch)`` and runs its share of
  cost-balanced steps; all ranks yield the same number of batches (see
  :mod:`fitbatch.distributed`);
* ``state_dict()`` is ``{version, epoch, step, ...}``; ``load_state_dict()`` re-plans the epoch
  (no replay of consumed batches) and continues at ``step``; if the world size changed, the rest
  of the epoch is re-arranged for the new world so every remaining sample is seen exactly once
  (:func:`fitbatch.resume.continue_epoch`).

>>> sampler = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted")
>>> list(sampler)
[[3, 1], [6, 0, 2], [4, 7], [5]]
>>> len(sampler)
4
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fitbatch._plan_sampler import PlanSampler, RankLayout, torch_class
from fitbatch._validate import choice, parse_budget
from fitbatch.costs import CostModel, resolve_cost
from fitbatch.distributed import POLICIES, Steps, arrange, arrange_budgets, world_info
from fitbatch.options import PlanKeywords, PlanOptions
from fitbatch.plan import plan_with
from fitbatch.resume import (
    EPOCH_KEY,
    N_SAMPLES_KEY,
    NUM_REPLICAS_KEY,
    OPTIONS_KEY,
    STEP_KEY,
    StateSchema,
    continue_epoch,
)
from fitbatch.sizes import SizesLike, as_sizes
from fitbatch.strategies import Strategy

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

#: torch's ``BatchSampler`` (``object`` without torch): the samplers' second base, so that
#: ``DataLoader`` and Lightning type checks pass
TorchBatchSampler = torch_class("BatchSampler")

HISTORY_KEY = "history"


class BudgetBatchSampler(PlanSampler, TorchBatchSampler):  # type: ignore[misc,valid-type]
    """Yield batches of indices whose cost fits a budget.

    ``plan()`` is this rank's batches in step order (after a resume on another world size: the
    rest of the epoch); :meth:`steps` is the arrangement of all ranks.

    Args:
        sizes: one size per sample (array-like, mapping, or a callable with ``n``).
        budget: the most cost one batch may have; a sequence of one budget per rank gives
            ranks with different memory budgets of their own (step counts stay equal).
        cost: cost model (``"padded"``, ``"sum"``, ``"polynomial"``, a ``CostModel``).
        strategy: grouping strategy (``"pooled"`` default; see :mod:`fitbatch.strategies`).
        num_replicas, rank: data-parallel world; read from ``torch.distributed`` when omitted.
        policy: leftover batches that do not divide among ranks: ``"split"`` or ``"drop"``.
        n: the number of samples when ``sizes`` is a callable.
        **options: ``max_batch_size``, ``batch_size_multiple``, ``shuffle``, ``seed``,
            ``oversized``, ``drop_last``, ``saturation``, with the meaning and the defaults of
            the :class:`fitbatch.PlanOptions` attributes (typed:
            :class:`~fitbatch.options.PlanKeywords`).

    Raises:
        ValueError, TypeError: invalid sizes, budget or options (naming the parameter).

    >>> sampler = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted", num_replicas=1, rank=0)
    >>> list(sampler), len(sampler)
    ([[3, 1], [6, 0, 2], [4, 7], [5]], 4)
    """

    STATE = StateSchema(
        "sampler",
        version=1,
        required=(EPOCH_KEY, STEP_KEY, NUM_REPLICAS_KEY, N_SAMPLES_KEY, OPTIONS_KEY),
        optional=(HISTORY_KEY,),  # absent: the epoch ran in one world
    )
    CURSOR_KEY = STEP_KEY
    CONFIG_KEY = OPTIONS_KEY
    CONFIG_NAME = "set of planning options"
    SHARES_PLAN = True

    def __init__(
        self,
        sizes: SizesLike,
        budget: float | str | Sequence[float | str],
        *,
        cost: str | CostModel | Any = "padded",
        strategy: str | Strategy = "pooled",
        num_replicas: int | None = None,
        rank: int | None = None,
        policy: str = "split",
        n: int | None = None,
        **options: Unpack[PlanKeywords],
    ) -> None:
        self._sizes = as_sizes(sizes, n)
        self.num_replicas, self.rank = world_info(num_replicas, rank)
        self._budgets: tuple[float, ...] | None = None
        if isinstance(budget, Sequence) and not isinstance(budget, str):
            if len(budget) != self.num_replicas:
                raise ValueError(f"budget has {len(budget)} per-rank values for {self.num_replicas} ranks")
            self._budgets = tuple(parse_budget(b, "budget") for b in budget)
            budget = min(self._budgets)
        self._opts = PlanOptions.build(budget, cost=cost, strategy=strategy, **options)
        self.policy = choice("policy", policy, POLICIES)
        self._cache: tuple[int, Steps] | None = None
        self._resumed: tuple[int, Steps] | None = None  # re-arranged rest of an epoch
        # earlier arrangements of this epoch, as [num_replicas, steps done], after world changes
        self._history: list[list[int]] = []

    # ------------------------------------------------------------------ configuration

    @property
    def options(self) -> PlanOptions:
        return self._opts

    @property
    def budget(self) -> float:
        return self._opts.budget

    def set_budget(self, budget: float | str) -> None:
        """Change the budget from the next epoch on (e.g. after an out-of-memory error)."""
        self._opts = dataclasses.replace(self._opts, budget=parse_budget(budget))
        self._cache = None
        logger.info("budget set to %g from epoch %d on", self._opts.budget, self.epoch + 1)

    def set_cost(self, cost: Any) -> None:
        """Change the cost model from the next epoch on (e.g. a memory model refitted after OOM)."""
        self._opts = dataclasses.replace(self._opts, cost=resolve_cost(cost))
        self._cache = None
        logger.info("cost model set to %s from epoch %d on", self._opts.cost.to_dict(), self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plans (every rank must call it alike).

        >>> sampler = BudgetBatchSampler([3, 1, 4, 1], 4, num_replicas=1, rank=0)
        >>> sampler.set_epoch(1)
        >>> sampler.epoch, len(sampler)
        (1, 3)
        """
        before = self.epoch
        super().set_epoch(epoch)
        if self.epoch != before:  # a resume applies to its own epoch only
            self._resumed = None
            self._history = []

    # ------------------------------------------------------------------ plans

    def steps(self, epoch: int | None = None) -> Steps:
        """The epoch's global arrangement into steps (shared by all ranks)."""
        epoch = self._epoch(epoch)
        if self._resumed is not None and self._resumed[0] == epoch:
            return self._resumed[1]
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        steps = self._arrange(epoch)
        self._cache = (epoch, steps)
        if self.rank == 0:
            logger.info("epoch %d: %s", epoch, steps.rank_plan(0).stats().summary())
        return steps

    def _arrange(self, epoch: int, world: int | None = None) -> Steps:
        world = self.num_replicas if world is None else world
        if self._budgets is not None:
            return arrange_budgets(self._sizes, self._opts, self._budgets, epoch)
        plan = plan_with(self._sizes, self._opts, epoch)
        return arrange(plan, self._sizes, self._opts.cost, world, seed=self._opts.seed, epoch=epoch, policy=self.policy)

    def _layout(self, epoch: int) -> RankLayout:
        steps = self.steps(epoch)
        return RankLayout(steps.rank_plan(self.rank), steps.step_samples, steps.step_units)

    # ------------------------------------------------------------------ state

    def _config(self) -> dict[str, Any]:
        return self._opts.to_dict()

    def _extra_state(self) -> dict[str, Any]:
        return {HISTORY_KEY: [list(h) for h in self._history]}

    def state_dict(self, *, step: int | None = None) -> dict[str, Any]:
        """A JSON-able state: ``epoch`` and ``step`` (steps of the epoch already consumed).

        Args:
            step: steps the training loop completed in this epoch. Defaults to the batches the
                latest iterator handed out; with a ``DataLoader`` that prefetches (workers),
                pass the loop's own count, or use ``torchdata``'s ``StatefulDataLoader``.

        >>> sampler = BudgetBatchSampler([3, 1, 4, 1], 8, num_replicas=1, rank=0)
        >>> state = sampler.state_dict(step=1)
        >>> state["epoch"], state["step"], state["history"]
        (0, 1, [])
        """
        return self._save_state(step)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where ``state`` was taken (see the module docstring).

        Raises:
            ValueError: a state of another kind, version, sample count or planning options,
                or per-rank budgets resumed on another world size.

        >>> sizes = [3, 1, 4, 1, 5, 9, 2, 6]
        >>> state = BudgetBatchSampler(sizes, 12, strategy="sorted", num_replicas=1, rank=0).state_dict(step=2)
        >>> resumed = BudgetBatchSampler(sizes, 12, strategy="sorted", num_replicas=1, rank=0)
        >>> resumed.load_state_dict(state)
        >>> list(resumed)
        [[4, 7], [5]]
        """
        epoch, step = self._check_state(state)
        saved_world = int(state[NUM_REPLICAS_KEY])
        chain = [*state.get(HISTORY_KEY, []), [saved_world, step]]
        if self._budgets is not None and any(int(w) != self.num_replicas for w, _ in chain):
            raise ValueError("resuming per-rank budgets with a different world size is not supported")
        self.set_epoch(epoch)
        self._resumed, self._history, self._cache = None, [], None
        after = continue_epoch(
            chain,
            self.num_replicas,
            fresh=lambda world: self._arrange(epoch, world),
            rest=lambda plan, world, purpose: arrange(
                plan, self._sizes, self._opts.cost, world, seed=self._opts.seed, epoch=epoch,
                policy=self.policy, purpose=purpose,
            ),
        )
        self._history = after.history
        if after.rearranged:
            self._resumed = (epoch, after.steps)
        self._seek(after.start, after.steps.n_steps)
        if saved_world != self.num_replicas:
            logger.info(
                "resumed epoch %d at step %d of %d ranks: %d remaining samples re-arranged for %d ranks",
                epoch, step, saved_world, after.steps.plan.n_samples, self.num_replicas,
            )

    def __repr__(self) -> str:
        return (
            f"BudgetBatchSampler(n={len(self._sizes)}, budget={self.budget:g}, cost={self._opts.cost.name!r}, "
            f"strategy={self._opts.strategy.name!r}, rank={self.rank}/{self.num_replicas}, epoch={self.epoch})"
        )
