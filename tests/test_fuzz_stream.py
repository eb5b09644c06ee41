"""Stateful fuzzing of stream resume: read, save, restore, read on, in any order (hypothesis).

A :class:`hypothesis.stateful.RuleBasedStateMachine` drives a ``BatchStream`` (alone, or inside
``equal_steps`` in a world of one, with ``sync_every`` or ``steps``) over a replayable source: it
(seeded or not) reads a few batches, saves the state through JSON, restores it into a fresh object over the same
source, corrupts a copy of it or offers it to a stream over another source, and reads on. At
every step: the batches so far are a prefix of the uninterrupted run's (so each item runs once and
resume equals the uninterrupted run), every batch fits the budget (or is a lone oversized item),
a restored object's summary and state equal the saved ones, and a foreign or corrupted state is
refused with ``TypeError``/``ValueError`` before anything is restored.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from contracts import COSTS
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import fitbatch
from fitbatch.streaming import batch_stream, equal_steps


class Replayable:
    """Items 0..n-1, the same ones each time it is iterated (a fixed shard list)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def make_sizes(n: int, kind: str, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 60, n).astype(np.float64)
    if kind == "halves":
        sizes = rng.integers(0, 120, n) / 2.0
    elif kind in ("late-fraction", "ties"):  # batches exactly at the budget, which a fraction lowers
        sizes = rng.choice([5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 50.0], n)
        if n:
            sizes[rng.integers(0, n if kind == "late-fraction" else max(1, n // 4))] = 2.5
    return sizes.tolist()


configs = st.fixed_dictionaries({
    "n": st.one_of(st.integers(0, 40), st.integers(100, 400)),
    "kind": st.sampled_from(["ints", "halves", "late-fraction", "ties"]),
    "seed": st.integers(0, 1000),
    "cost": st.sampled_from(["sum", "padded"]),
    "strategy": st.sampled_from(["sequential", "buckets", "given"]),
    "buffer_size": st.sampled_from([1, 4, 16, 64]),
    "max_batch_size": st.one_of(st.none(), st.integers(1, 6)),
    "oversized": st.sampled_from(["single", "skip"]),
    "budget": st.sampled_from([50.0, 60.0, 100.0]),
    "wrap": st.sampled_from(["stream", "sync_every", "steps"]),
    "every": st.integers(1, 5),
    "steps_fraction": st.floats(0, 1),
    "shuffle": st.sampled_from([False, False, 3, 11]),  # a seeded stream: shuffle buffer + emission order
    "shuffle_buffer": st.sampled_from([None, 2, 8]),
})


class StreamResume(RuleBasedStateMachine):
    @initialize(config=configs)
    def setup(self, config: dict[str, Any]) -> None:
        self.config = config
        self.sizes = make_sizes(config["n"], config["kind"], config["seed"])
        full_stream = list(self.stream(self.sizes))
        self.steps = int(config["steps_fraction"] * len(full_stream))
        self.full = full_stream[: self.steps] if config["wrap"] == "steps" else full_stream
        self.obj = self.make()
        self.got: list[list[int]] = []
        self.ended = False

    # ------------------------------------------------------------------ building

    def stream(self, sizes: list[float], **change: Any) -> Any:
        c = {**self.config, **change}
        strategy = fitbatch.Buckets(boundaries=(10.0, 25.0, 40.0)) if c["strategy"] == "given" else c["strategy"]
        return batch_stream(
            Replayable(len(sizes)), sizeof=sizes.__getitem__, budget=c["budget"], cost=c["cost"],
            strategy=strategy, buffer_size=c["buffer_size"], max_batch_size=c["max_batch_size"],
            oversized=c["oversized"], seed=c["shuffle"],
            shuffle_buffer=None if c["shuffle"] is False else c["shuffle_buffer"],
        )

    def make(self, sizes: list[float] | None = None, **change: Any) -> Any:
        stream = self.stream(self.sizes if sizes is None else sizes, **change)
        wrap = self.config["wrap"]
        if wrap == "stream":
            return stream
        if wrap == "steps":
            return equal_steps(stream, steps=max(self.steps, 1))
        return equal_steps(stream, sync_every=self.config["every"])

    def saved(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.obj.state_dict()))

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: not self.ended)
    @rule(k=st.integers(1, 8))
    def read(self, k: int) -> None:
        for _ in range(k):
            if self.config["wrap"] == "steps" and len(self.got) == self.steps:
                self.ended = True  # steps=n ends after n steps (no read past: the source may be short)
                return
            batch = next(self.obj, None)
            if batch is None:
                self.ended = True
                return
            self.check_batch(batch)
            self.got.append(batch)

    @rule()
    def save_and_restore(self) -> None:
        state = self.saved()
        again = self.make()
        again.load_state_dict(state)
        assert again.summary == self.obj.summary
        assert json.loads(json.dumps(again.state_dict())) == state
        self.obj = again

    @rule(data=st.data())
    def foreign_or_corrupt_state_is_refused(self, data: st.DataObject) -> None:
        state = self.saved()
        inner = state["source"] if "source" in state else state
        choice = data.draw(st.sampled_from(["other source", "other options", "bad value", "unknown key"]))
        if choice == "other source":  # the same options over items of other sizes
            if inner is None or inner["read"] == 0 or inner["last_size"] is None:
                return
            other = self.make([s + 1.0 for s in self.sizes])
            message = "other items"
        elif choice == "other options":
            other = self.make(budget=self.config["budget"] + 1.0)
            message = "other stream options"
        else:
            other = self.make()
            key = data.draw(st.sampled_from(sorted(k for k in state if k != "version")))
            state = {**state, key: "x"} if choice == "bad value" else {**state, "surplus": 1}
            message = "" if choice == "bad value" else "unknown"
        try:
            other.load_state_dict(state)
        except (TypeError, ValueError) as exc:
            assert message in str(exc)
        else:
            raise AssertionError(f"{choice}: the state loaded")

    # ------------------------------------------------------------------ checks

    def check_batch(self, batch: list[int]) -> None:
        assert batch, "an empty batch"
        c = self.config
        cap = c["max_batch_size"]
        assert cap is None or len(batch) <= cap
        s = np.asarray([self.sizes[i] for i in batch])
        cost = float(COSTS[c["cost"]].evaluate(np.array([float(s.size)]), s.max(keepdims=True), s.sum(keepdims=True))[0])
        assert len(batch) == 1 or cost <= c["budget"] * (1 + 1e-12)

    @invariant()
    def resume_equals_the_uninterrupted_run(self) -> None:
        assert self.got == self.full[: len(self.got)]
        if self.ended:
            assert self.got == self.full

    def teardown(self) -> None:
        if not hasattr(self, "obj"):
            return
        if not self.ended:
            self.read(10**6)
        assert self.got == self.full
        items = [i for b in self.got for i in b]
        assert len(items) == len(set(items))  # each item at most once
        if self.config["wrap"] != "steps":
            skipped = self.obj.summary.skipped if self.config["wrap"] == "stream" else None
            if skipped == 0 or self.config["oversized"] == "single":
                assert sorted(items) == list(range(self.config["n"]))  # and every item, once


# ~20 s on one core: 400 derandomized programs of up to 20 rules each
StreamResume.TestCase.settings = settings(max_examples=400, stateful_step_count=20, deadline=None)
TestStreamResume = StreamResume.TestCase
