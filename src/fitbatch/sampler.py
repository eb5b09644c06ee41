"""``BudgetBatchSampler``: budget-planned batches for ``torch.utils.data.DataLoader``.

A subclass of torch's ``BatchSampler`` when torch is importable (a plain iterable otherwise).
It yields lists of int, has an exact ``len()`` (the batches the next iteration yields),
``set_epoch(epoch)``, re-entrant iteration, data-parallel splitting and exact resume:

* every rank plans the same global epoch from ``(seed, epoch)`` and runs its share of
  cost-balanced steps; all ranks yield the same number of batches (see
  :mod:`fitbatch.distributed`);
* ``state_dict()`` is ``{version, epoch, step, ...}``; ``load_state_dict()`` re-plans the epoch
  (no replay of consumed batches) and continues at ``step``; if the world size changed, the rest
  of the epoch is re-arranged for the new world so every remaining sample is seen exactly once.

>>> sampler = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted")
>>> list(sampler)
[[3, 1], [6, 0, 2], [4, 7], [5]]
>>> len(sampler)
4
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fitbatch._validate import check_state, choice, non_negative_int, parse_budget
from fitbatch.distributed import (
    POLICIES,
    Steps,
    arrange,
    arrange_budgets,
    remaining_plan,
    world_info,
)
from fitbatch.plan import BatchPlan, PlanOptions, plan_with
from fitbatch.sizes import SizesLike, as_sizes

logger = logging.getLogger(__name__)

try:  # subclass torch's BatchSampler when torch is there, so DataLoader type checks pass
    from torch.utils.data import BatchSampler as _Base
except ImportError:  # pragma: no cover - exercised only without torch
    _Base = object  # type: ignore[assignment,misc]

STATE_VERSION = 1
_STATE_KEYS = frozenset({"version", "epoch", "step", "num_replicas", "n_samples", "options", "history"})


class BudgetBatchSampler(_Base):  # type: ignore[misc,valid-type]
    """Yield batches of indices whose cost fits a budget.

    Args:
        sizes: one size per sample (array-like, mapping, or callable with ``n=`` in options).
        budget: the most cost one batch may have; a sequence of one budget per rank gives
            ranks with different memory budgets of their own (step counts stay equal).
        cost: cost model (``"padded"``, ``"sum"``, ``"polynomial"``, a ``CostModel``).
        strategy: grouping strategy (``"pooled"`` default; see :mod:`fitbatch.strategies`).
        num_replicas, rank: data-parallel world; read from ``torch.distributed`` when omitted.
        policy: leftover batches that do not divide among ranks: ``"split"`` or ``"drop"``.
        **options: ``max_batch_size``, ``batch_size_multiple``, ``shuffle``, ``seed``,
            ``oversized``, ``drop_last``, ``saturation`` (see :class:`fitbatch.PlanOptions`).
    """

    def __init__(
        self,
        sizes: SizesLike,
        budget: float | str | Sequence[float | str],
        *,
        cost: Any = "padded",
        strategy: Any = "pooled",
        num_replicas: int | None = None,
        rank: int | None = None,
        policy: str = "split",
        **options: Any,
    ) -> None:
        n = options.pop("n", None)
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
        self.epoch = 0
        self._start = 0  # first step of the next iteration (set by load_state_dict)
        self._position = 0  # steps of this epoch handed out by the latest iterator
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
        import dataclasses

        self._opts = dataclasses.replace(self._opts, budget=parse_budget(budget))
        self._cache = None
        logger.info("budget set to %g from epoch %d on", self._opts.budget, self.epoch + 1)

    def set_cost(self, cost: Any) -> None:
        """Change the cost model from the next epoch on (e.g. a memory model refitted after OOM)."""
        import dataclasses

        from fitbatch.costs import resolve_cost

        self._opts = dataclasses.replace(self._opts, cost=resolve_cost(cost))
        self._cache = None
        logger.info("cost model set to %s from epoch %d on", self._opts.cost.to_dict(), self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plans (every rank must call it alike)."""
        epoch = non_negative_int("epoch", epoch)
        if epoch != self.epoch:
            self.epoch = epoch
            self._start = 0
            self._position = 0
            self._resumed = None
            self._history = []

    # ------------------------------------------------------------------ plans

    def steps(self, epoch: int | None = None) -> Steps:
        """The epoch's global arrangement into steps (shared by all ranks)."""
        epoch = self.epoch if epoch is None else non_negative_int("epoch", epoch)
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

    def plan(self, epoch: int | None = None) -> BatchPlan:
        """This rank's batches for the epoch in step order (after a resume on another world size: the rest)."""
        return self.steps(epoch).rank_plan(self.rank)

    def step_totals(self, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per step of the epoch: samples and real size units summed over all ranks."""
        s = self.steps(epoch)
        return s.step_samples, s.step_units

    # ------------------------------------------------------------------ iteration

    def __len__(self) -> int:
        return max(0, self.steps().n_steps - self._start)

    def __iter__(self) -> Iterator[list[int]]:
        plan = self.steps().rank_plan(self.rank)
        self._position = self._start
        return self._generate(plan)

    def _generate(self, plan: BatchPlan) -> Iterator[list[int]]:
        # The resume cursor is taken on the first next(), not in __iter__: a multi-worker
        # DataLoader calls iter() twice per epoch and only runs the second iterator.
        start, self._start = self._start, 0
        order = plan.order
        bounds = plan.offsets.tolist()
        self._position = start
        for k in range(start, len(plan)):
            batch = order[bounds[k] : bounds[k + 1]].tolist()
            self._position = k + 1
            yield batch

    # ------------------------------------------------------------------ state

    def state_dict(self, *, step: int | None = None) -> dict[str, Any]:
        """A JSON-able state: ``epoch`` and ``step`` (steps of the epoch already consumed).

        Args:
            step: steps the training loop completed in this epoch. Defaults to the batches the
                latest iterator handed out; with a ``DataLoader`` that prefetches (workers),
                pass the loop's own count, or use ``torchdata``'s ``StatefulDataLoader``.
        """
        done = self._position if step is None else non_negative_int("step", step)
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "step": done,
            "num_replicas": self.num_replicas,
            "n_samples": len(self._sizes),
            "options": self._opts.to_dict(),
            "history": [list(h) for h in self._history],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where ``state`` was taken (see the module docstring)."""
        check_state("sampler", state, _STATE_KEYS, STATE_VERSION)
        if state["n_samples"] != len(self._sizes):
            raise ValueError(f"state is for {state['n_samples']} samples, this sampler has {len(self._sizes)}")
        if state["options"] != self._opts.to_dict():
            raise ValueError(
                "state was saved with other planning options; build the sampler with the same ones "
                f"(saved: {state['options']!r})"
            )
        epoch = non_negative_int("epoch", state["epoch"])
        chain = [[int(w), int(k)] for w, k in state.get("history", [])]
        chain.append([int(state["num_replicas"]), non_negative_int("step", state["step"])])
        if self._budgets is not None and any(w != self.num_replicas for w, _ in chain):
            raise ValueError("resuming per-rank budgets with a different world size is not supported")
        self.set_epoch(epoch)
        self._resumed, self._history, self._cache = None, [], None
        # Rebuild the arrangement the saved run was in: the fresh one, then each re-arrangement.
        current = self._arrange(epoch, chain[0][0])
        for i, (world, _) in enumerate(chain[1:], start=1):
            current = self._rearrange(current, chain[i - 1][1], world, epoch, i)
        world, step = chain[-1]
        if world == self.num_replicas:
            self._history = chain[:-1]
            self._start = self._position = min(step, current.n_steps)
        else:
            current = self._rearrange(current, step, self.num_replicas, epoch, len(chain))
            self._history = chain
            self._start = self._position = 0
            logger.info(
                "resumed epoch %d at step %d of %d ranks: %d remaining samples re-arranged for %d ranks",
                epoch, step, world, current.plan.n_samples, self.num_replicas,
            )
        if len(chain) > 1 or world != self.num_replicas:
            self._resumed = (epoch, current)

    def _rearrange(self, steps: Steps, done: int, world: int, epoch: int, generation: int) -> Steps:
        rest = remaining_plan(steps, min(done, steps.n_steps))
        return arrange(
            rest, self._sizes, self._opts.cost, world, seed=self._opts.seed, epoch=epoch,
            policy=self.policy, purpose=f"resume-steps-{generation}",
        )

    def __repr__(self) -> str:
        return (
            f"BudgetBatchSampler(n={len(self._sizes)}, budget={self.budget:g}, cost={self._opts.cost.name!r}, "
            f"strategy={self._opts.strategy.name!r}, rank={self.rank}/{self.num_replicas}, epoch={self.epoch})"
        )
