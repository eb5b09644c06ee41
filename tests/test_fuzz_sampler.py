"""A state machine over BudgetBatchSampler: what a training job does to its samplers, in any order.

hypothesis runs one sampler per rank (``num_replicas``/``rank``, as every rank of a job builds
its own) through sequences of: run ``k`` steps, save a state (through JSON), change the budget
(what ``OOMGuard`` does), move to another world size (new samplers for the new ranks, loaded from
the state), crash and restore from the last save (new samplers, redoing the work since), and the
next epoch. After every step it checks:

* every rank yields a batch at each step, or none does (equal steps);
* every batch fits the budget it was planned with (a lone oversized sample under ``"single"``);
* at the end of an epoch every sample ran exactly once, or was skipped or dropped and counted;
* a restore that redoes the work since its save yields the batches the crashed samplers yielded;
* until the world size changes, an uninterrupted reference run (never saved, restored or moved)
  yields the same batches, and a new epoch equals a fresh sampler built with the budget in force.
"""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fitbatch import BudgetBatchSampler
from fitbatch.epoch._arrange import TooFewSamples

BUDGET = 120.0


def round_trip(state):
    return json.loads(json.dumps(state))


#: the jobs the machines start: the samples, the world, the options
JOBS = {
    "seed": st.integers(0, 2**16),
    "n": st.integers(20, 160),
    "world": st.integers(1, 4),
    "strategy": st.sampled_from(("sequential", "sorted", "pooled", "buckets", "packed")),
    "policy": st.sampled_from(("split", "drop")),
    "oversized": st.sampled_from(("single", "skip", "error")),
}


class SamplerMachine(RuleBasedStateMachine):
    @initialize(**JOBS)
    def setup(self, seed, n, world, strategy, policy, oversized):
        self.begin(seed, n, world, strategy, policy, oversized)

    def begin(self, seed, n, world, strategy, policy, oversized, **extra):
        rng = np.random.default_rng(seed)
        self.sizes = np.clip(np.ceil(rng.lognormal(math.log(10), 0.9, n)), 1, 60).astype(np.int64)
        self.kw = {"seed": seed, "strategy": strategy, "policy": policy, "oversized": oversized, **extra}
        self.epoch, self.world = 0, world
        try:
            self.ranks = self.build(world)
            self.ref = self.build(world)
        except TooFewSamples:
            assume(False)
        self.start_epoch()

    # ------------------------------------------------------------------ helpers

    def build(self, world, budget=BUDGET):
        return [BudgetBatchSampler(self.sizes, budget, num_replicas=world, rank=r, **self.kw) for r in range(world)]

    def start_epoch(self):
        self.its = [iter(s) for s in self.ranks]
        self.ref_its = None if self.ref is None else [iter(s) for s in self.ref]
        self.consumed: list[int] = []
        self.ran: list[list[list[int]]] = [[] for _ in range(self.world)]  # this world's batches this epoch
        self.log: list[tuple[str, float]] = []  # what happened since the last save
        self.saved = None
        self.done = False

    def planned_budget(self, sampler):
        """The budget the batches now running were planned with (the rest keeps it when a change cannot re-plan it)."""
        return sampler.steps().plan.budget

    def world_event(self, state, world):
        """The event a move to ``world`` ranks at the saved step records."""
        return {"step": state["step"], "num_replicas": world}

    def fits(self, sampler, batch):
        budget = self.planned_budget(sampler)
        cost = len(batch) * int(self.sizes[batch].max())
        lone_oversized = len(batch) == 1 and cost > budget and self.kw["oversized"] == "single"
        return cost <= budget or lone_oversized

    def advance(self, its, k, check=None):
        """Run k steps on every rank: the rows of batches, and whether the epoch ended. With
        ``check`` (the samplers of ``its``), every batch fits the budget its sampler planned it
        with, checked as it is yielded (planning in windows, the window that yields it)."""
        rows = []
        for _ in range(k):
            row = [next(it, None) for it in its]
            assert len({b is None for b in row}) == 1, "ranks ran different numbers of steps"
            if row[0] is None:
                return rows, True
            for r, batch in enumerate(row if check is not None else ()):
                assert self.fits(check[r], batch), f"batch over budget on rank {r}"
            rows.append(row)
        return rows, False

    def run_live(self, k):
        rows, ended = self.advance(self.its, k, check=self.ranks)
        if self.ref_its is not None:  # the uninterrupted reference yields the same and ends alike
            assert self.advance(self.ref_its, len(rows) + ended) == (rows, ended)
        self.take(rows)
        if ended:
            self.finish()
        return rows

    def finish(self):
        self.done = True
        plan = self.ranks[0].plan()
        left_out = plan.skipped.tolist() + plan.dropped.tolist()
        assert sorted(self.consumed + left_out) == list(range(len(self.sizes))), "every sample once per epoch"

    def take(self, rows):
        for row in rows:
            for r, batch in enumerate(row):
                self.ran[r].append(batch)
                self.consumed += batch

    def current_budget(self):
        return self.ranks[0].budget

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: not self.done)
    @rule(k=st.integers(1, 8))
    def run(self, k):
        self.log.append(("steps", len(self.run_live(k))))

    @rule()
    def save(self):
        states = [round_trip(s.state_dict()) for s in self.ranks]
        assert all(s == states[0] for s in states), "every rank saves the same state"
        self.saved = (states[0], [len(r) for r in self.ran])
        self.log = []

    @precondition(lambda self: not self.done)
    @rule(factor=st.sampled_from((0.5, 0.75, 0.9, 1.25, 1.6)))
    def change_budget(self, factor):
        new = min(max(self.current_budget() * factor, 30.0), 400.0)
        assume(new != self.current_budget())
        before = round_trip(self.ranks[0].state_dict())
        outcomes = []
        for s in self.ranks + (self.ref or []):
            try:
                s.set_budget(new)
                outcomes.append(None)
            except ValueError as e:
                outcomes.append(str(e))
        assert len(set(outcomes)) == 1, "every rank takes the same decision"
        if outcomes[0] is not None:  # a remaining sample over the new budget, oversized="error"
            assert "even alone" in outcomes[0] and self.kw["oversized"] == "error"
            assert round_trip(self.ranks[0].state_dict()) == before, "a refused change changes nothing"
            return
        assert self.current_budget() == new
        self.log.append(("budget", new))

    @precondition(lambda self: self.saved is not None)
    @rule()
    def restore(self):
        """A crash: new samplers load the last save and redo what happened since."""
        state, counts = self.saved
        fresh = self.build(self.world, state["options"]["budget"])  # the budget the epoch began with
        for s in fresh:
            s.load_state_dict(state)
        its = [iter(s) for s in fresh]
        done = list(counts)
        for what, value in self.log:
            if what == "budget":
                for s in fresh:
                    s.set_budget(value)
                continue
            rows, _ = self.advance(its, int(value))
            for r in range(self.world):
                got = [row[r] for row in rows]
                assert got == self.ran[r][done[r] : done[r] + len(got)], "a resume yields the uninterrupted batches"
                done[r] += len(got)
        assert done == [len(r) for r in self.ran]
        assert round_trip(fresh[0].state_dict()) == round_trip(self.ranks[0].state_dict())
        if not self.done:  # the restored samplers go on in place of the crashed ones
            self.ranks, self.its = fresh, its

    @precondition(lambda self: not self.done)
    @rule(shift=st.integers(1, 3))
    def change_world(self, shift):
        world = (self.world - 1 + shift) % 4 + 1  # another of 1..4
        state = round_trip(self.ranks[0].state_dict())
        moved = self.build(world, state["options"]["budget"])
        try:
            for s in moved:
                s.load_state_dict(state)
        except TooFewSamples:  # too few samples left to give every new rank a batch: refused
            return
        assert len({len(s) for s in moved}) == 1
        assert moved[0].state_dict()["events"][-1] == self.world_event(state, world)
        assert moved[0].budget == self.current_budget()
        consumed = self.consumed
        self.world, self.ranks, self.ref = world, moved, None
        self.start_epoch()
        self.consumed = consumed

    @rule()
    def next_epoch(self):
        if not self.done:
            self.run_live(10**9)
        budget = self.current_budget()
        self.epoch += 1
        for s in self.ranks:
            s.set_epoch(self.epoch)
        assert self.ranks[0].state_dict()["events"] == []
        assert self.ranks[0].state_dict()["options"]["budget"] == budget
        self.ref = self.build(self.world)  # the next epoch equals fresh samplers given the budget in force
        for s in self.ref:
            s.set_epoch(self.epoch)
            s.set_budget(budget)
        self.start_epoch()

    @invariant()
    def ranks_agree_on_the_epoch(self):
        if hasattr(self, "ranks"):
            assert len({len(s) for s in self.ranks}) == 1
            assert len({s.budget for s in self.ranks}) == 1


# about 30 s on two cores; a longer search: max_examples=600, stateful_step_count=40, derandomize=False
SamplerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestSamplerMachine = SamplerMachine.TestCase


class WindowedSamplerMachine(SamplerMachine):
    """The same job with the epoch planned in windows of 16-64 samples (several windows a epoch)."""

    @initialize(**{**JOBS, "n": st.integers(40, 200)}, window=st.integers(16, 64))
    def setup(self, seed, n, world, strategy, policy, oversized, window):
        self.begin(seed, n, world, strategy, policy, oversized, window=window)

    def world_event(self, state, world):
        """The move's event names the window it happened in (the one running at the save), and
        its step counts from that window's first."""
        live = self.ranks[0]._current()
        return {"step": state["step"] - live.first, "num_replicas": world, **self.ranks[0]._window_of_event(live)}


WindowedSamplerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestWindowedSamplerMachine = WindowedSamplerMachine.TestCase
