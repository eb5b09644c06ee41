"""Data-parallel plans: equal steps, every sample once, cost balance, per-step totals, resume.

In-process tests build one ``BudgetBatchSampler`` per rank (as every rank of a job does, with no
communication) and check the ranks' batches against each other and the single-process plan;
``hypothesis`` draws the data and the world size (1-64). The multi-process tests start real
ranks (``tests/distributed/dist_train.py``, gloo on CPU, a timeout on every wait) that train a
small model with ``DistributedDataParallel`` over real lengths, stop, resume on the same and on
a different world size, and ``torchrun`` runs the README's example.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fitbatch
from fitbatch import BudgetBatchSampler
from fitbatch.epoch._arrange import FEW_STEPS, straggler_ratio
from fitbatch.epoch._world import shared_seed, world_info
from fitbatch.strategies._recut import greedy_cuts

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "distributed" / "dist_train.py"
EXAMPLE = ROOT / "examples" / "torchrun_ddp.py"
STRATEGIES = ("sequential", "sorted", "pooled", "buckets", "packed")
TIMEOUT = 90  # seconds for any group of processes: a hang fails the test instead of blocking


# --------------------------------------------------------------------------- helpers


def long_tailed(seed: int, n: int, top: int) -> np.ndarray:
    """Seeded log-normal sizes in [1, top] (hypothesis draws the seed, so failures replay)."""
    rng = np.random.default_rng(seed)
    return np.clip(np.ceil(rng.lognormal(math.log(max(top, 2) / 6), 1.0, n)), 1, top).astype(np.int64)


def all_ranks(sizes, budget, world, **kw) -> list[BudgetBatchSampler]:
    return [BudgetBatchSampler(sizes, budget, num_replicas=world, rank=r, **kw) for r in range(world)]


def flat(batches) -> np.ndarray:
    return np.array([i for b in batches for i in b], dtype=np.int64)


def batch_costs(batches, sizes: np.ndarray, cost: str) -> np.ndarray:
    """Each batch's cost from scratch: padded = count x max, sum = sum of sizes."""
    return np.array([len(b) * sizes[b].max() if cost == "padded" else sizes[b].sum() for b in batches], float)


def assert_exactly_once(parts, n: int) -> None:
    """The index arrays in ``parts`` are disjoint and together hold 0..n-1."""
    got = np.sort(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]))
    assert got.size == n and np.array_equal(got, np.arange(n)), "a sample is missing or seen twice"


# --------------------------------------------------------------------------- the rank split


@st.composite
def split_cases(draw):
    world = draw(st.integers(1, 64))
    top = draw(st.integers(1, 300))
    case = {
        "sizes": long_tailed(draw(st.integers(0, 2**31)), draw(st.integers(0, 800)), top),
        "budget": draw(st.integers(max(1, top // 3), 12 * top)),
        "world": world,
        "cost": draw(st.sampled_from(("padded", "sum"))),
        "strategy": draw(st.sampled_from(STRATEGIES)),
        "oversized": draw(st.sampled_from(("single", "skip"))),
        "drop_last": draw(st.booleans()),
    }
    return case, draw(st.sampled_from(("split", "drop")))


@settings(max_examples=100)
@given(split_cases())
def test_rank_split_equal_counts_disjoint_and_complete(case_policy):
    case, policy = case_policy
    sizes, budget, world, cost = case["sizes"], case["budget"], case["world"], case["cost"]
    opts = {k: case[k] for k in ("cost", "strategy", "oversized", "drop_last")}
    # the single-process plan the ranks share: several ranks keep the greedy walk's cuts (one
    # process cuts a few-batch epoch at the least total cost, which also moves drop_last's tail)
    with greedy_cuts() if world > 1 else contextlib.nullcontext():
        single = fitbatch.plan_batches(sizes, budget, seed=7, **opts)
    need = world * math.ceil(len(single) / world)
    if policy == "split" and single.n_samples < need:
        with pytest.raises(ValueError, match="policy='drop'"):
            BudgetBatchSampler(sizes, budget, num_replicas=world, rank=0, seed=7, **opts).steps()
        return
    samplers = all_ranks(sizes, budget, world, seed=7, policy=policy, **opts)
    got = [list(s) for s in samplers]
    n_steps = len(got[0])

    # equal counts, no empty (dummy) batch, len() exact
    assert all(len(g) == n_steps == len(s) for g, s in zip(got, samplers))
    assert all(len(b) > 0 for g in got for b in g)
    # every rank computed the same arrangement on its own
    for s in samplers[1:]:
        assert np.array_equal(s.steps().grid, samplers[0].steps().grid)
    # disjoint ranks, union = all samples but the counted skips and drops
    plan = samplers[0].plan()
    stats = plan.stats()
    assert_exactly_once([flat(g) for g in got] + [plan.skipped, plan.dropped], len(sizes))
    assert stats.skipped == single.stats().skipped
    if policy == "split":
        assert stats.dropped == single.stats().dropped
    else:
        assert stats.dropped_batches - single.stats().dropped_batches == len(single) % world
    # the world size changes the plan only to even out few steps (plan_for_world): otherwise
    # each batch is a single-process batch or a piece of one
    replanned = policy == "split" and not opts["drop_last"] and len(single) % world and len(single) < FEW_STEPS * world
    owner = np.full(len(sizes), -1)
    owner[single.order] = np.repeat(np.arange(len(single)), single.counts)
    assert replanned or all(np.unique(owner[b]).size == 1 for g in got for b in g)
    if world == 1:
        assert got[0] == single.to_lists()
    if len(single) % world == 0:
        assert sorted(map(sorted, (b for g in got for b in g))) == sorted(map(sorted, single.to_lists()))
    # within budget (splitting never grows a batch; only a lone oversized sample may exceed it)
    costs = np.stack([batch_costs(g, sizes, cost) for g in got], axis=1).reshape(n_steps, world)
    multi = np.array([[len(g[k]) > 1 for g in got] for k in range(n_steps)], dtype=bool).reshape(n_steps, world)
    assert np.all(costs[multi] <= budget)
    # per-step totals over all ranks, and the straggler ratio, recomputed from the batches
    step_samples, step_units, step_loss = samplers[world - 1].step_totals()
    lens = np.array([[len(g[k]) for g in got] for k in range(n_steps)], dtype=np.int64).reshape(n_steps, world)
    units = np.array([[sizes[g[k]].sum() for g in got] for k in range(n_steps)], dtype=float).reshape(n_steps, world)
    assert np.array_equal(step_samples, lens.sum(axis=1))
    assert np.array_equal(step_units, units.sum(axis=1))
    assert np.array_equal(step_loss, step_units)  # no loss_sizes: loss units are the real units
    if n_steps and world > 1:
        # balance: each step holds `world` batches adjacent in cost order (no two steps interleave)
        lo, hi = costs.min(axis=1), costs.max(axis=1)
        by_cost = np.lexsort((hi, lo))
        assert np.all(hi[by_cost][:-1] <= lo[by_cost][1:])
        mean = costs.mean(axis=1)
        expect = float(np.mean(costs.max(axis=1)[mean > 0] / mean[mean > 0])) if (mean > 0).any() else 1.0
        assert stats.straggler_ratio == pytest.approx(expect)
        assert stats.straggler_ratio >= 1.0


@given(
    seed=st.integers(0, 2**31),
    world=st.integers(1, 16),
    n=st.integers(1, 300),
    spread=st.floats(1.0, 4.0),
)
def test_per_rank_budgets_equal_counts_each_within_its_own_budget(seed, world, n, spread):
    sizes = long_tailed(seed, n, 50)
    rng = np.random.default_rng(seed)
    budgets = [float(x) for x in np.round(50 * (1 + (spread - 1) * rng.random(world)))]
    try:
        samplers = all_ranks(sizes, budgets, world, seed=seed)
        got = [list(s) for s in samplers]
    except ValueError as e:  # a rank's share has fewer samples than the steps of another
        assert "cannot give every rank a batch" in str(e)
        return
    assert len({len(g) for g in got}) == 1
    assert_exactly_once([flat(g) for g in got], n)
    for g, cap in zip(got, budgets):
        assert np.all(batch_costs(g, sizes, "padded") <= cap)
    step_samples = samplers[0].step_totals().samples
    assert np.array_equal(step_samples, [sum(len(g[k]) for g in got) for k in range(len(got[0]))])


def test_per_rank_budgets_share_work_in_proportion(functions):
    """A rank with twice the memory gets about twice the tokens, in the same number of steps."""
    samplers = all_ranks(functions, [8192, 16384], 2, seed=0)
    got = [list(s) for s in samplers]
    assert len(got[0]) == len(got[1])
    tokens = [sum(int(functions[b].sum()) for b in g) for g in got]
    assert tokens[1] / tokens[0] == pytest.approx(2.0, rel=0.1)
    assert_exactly_once([flat(g) for g in got], len(functions))
    assert samplers[0].plan().stats().straggler_ratio < 1.05  # fills: cost / own budget
    state = samplers[0].state_dict(step=40)
    for r in range(2):  # resume on the same world: exactly the rest
        again = BudgetBatchSampler(functions, [8192, 16384], num_replicas=2, rank=r, seed=0)
        again.load_state_dict(state)
        assert list(again) == got[r][40:]
    with pytest.raises(ValueError, match="different world size"):
        BudgetBatchSampler(functions, [8192, 8192, 8192], num_replicas=3, rank=0, seed=0).load_state_dict(state)


def test_balance_on_real_lengths_beats_round_robin(functions, pytokens):
    """Issue 3 target: straggler ratio <= 1.02 at world size 8, padding within 1 point."""
    for sizes, oversized in ((functions, "error"), (pytokens, "skip")):
        single = fitbatch.plan_batches(sizes, 16384, seed=0, oversized=oversized)
        sampler = BudgetBatchSampler(sizes, 16384, num_replicas=8, rank=5, seed=0, oversized=oversized)
        steps = sampler.steps()
        balanced = steps.straggler_ratio
        assert balanced <= 1.02
        assert sampler.plan().stats().straggler_ratio == balanced
        round_robin = straggler_ratio(steps.plan.costs[np.arange(len(steps.plan)).reshape(-1, 8)])
        assert balanced < round_robin
        assert steps.plan.stats().padding_efficiency >= single.stats().padding_efficiency - 0.01


@pytest.mark.parametrize(("world", "n_steps"), [(8, 5), (8, 9), (64, 2), (64, 4)])
def test_few_steps_meet_the_balance_target(functions, world, n_steps):
    """Issue #18: few steps per epoch, straggler <= 1.02 at 8 ranks and <= 1.05 at 64.

    Five resamples of the real function lengths and of a synthetic long tail, each about
    ``world * n_steps`` batches' worth. The re-plan must bisect down to the lowest budget that
    keeps the batch count (stopping at the first budget that reaches it left one underfilled
    batch beside full ones: 1.030 at 8 x 5 and 1.033 on the long tail).
    """
    target = 1.02 if world == 8 else 1.05
    rng = np.random.default_rng(0)
    tail = np.clip(np.round(rng.lognormal(3.0, 1.0, 200_000)), 2, 16384).astype(np.int64)
    for base in (functions, tail):
        n = int(world * n_steps * 16384 / (1.3 * base.mean()))
        for seed in range(5):
            sizes = base[np.random.default_rng(seed).integers(0, base.size, n)]
            steps = BudgetBatchSampler(sizes, 16384, num_replicas=world, rank=0, seed=seed).steps()
            assert steps.plan.n_samples == n  # every sample once
            assert steps.plan.costs.max() <= 16384
            assert steps.straggler_ratio <= target, (base is tail, seed, steps.straggler_ratio)


def test_planning_work_per_rank_does_not_grow_with_world(monkeypatch, functions):
    """One global plan per rank and epoch whatever the world size; the arrangement is O(batches).

    With fewer than FEW_STEPS steps and a batch count the world does not divide, plan_for_world
    bisects the budget: at most 14 more plans (a 1e-4 relative tolerance), whatever the world.
    """
    import fitbatch.epoch._arrange as planning  # where the sampler plans its epochs

    calls = []
    real = planning.plan_with
    monkeypatch.setattr(planning, "plan_with", lambda *a, **k: calls.append(1) or real(*a, **k))
    for world in (1, 8, 64, 512):
        calls.clear()
        sampler = BudgetBatchSampler(functions, 16384, num_replicas=world, rank=world - 1, seed=0)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            assert sum(1 for _ in sampler) == len(sampler) == sampler.steps().n_steps
        n_batches = len(fitbatch.plan_batches(functions, 16384, seed=0))
        if world == 1 or n_batches >= FEW_STEPS * world:
            assert len(calls) == 2
        else:
            assert 2 < len(calls) <= 2 * (1 + 14)


def test_world_and_rank_validation_and_defaults():
    sampler = BudgetBatchSampler([3, 1, 4, 1, 5], 10)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)  # no process group: one process
    assert world_info(4, 3) == (4, 3)
    with pytest.raises(ValueError, match="rank"):
        BudgetBatchSampler([3, 1, 4], 10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="rank"):
        BudgetBatchSampler([3, 1, 4], 10, rank=1)  # world read as 1
    with pytest.raises(ValueError, match="num_replicas"):
        BudgetBatchSampler([3, 1, 4], 10, num_replicas=0, rank=0)
    with pytest.raises(ValueError, match="policy"):
        BudgetBatchSampler([3, 1, 4], 10, num_replicas=2, rank=0, policy="pad")
    with pytest.raises(ValueError, match="2 per-rank values for 3 ranks"):
        BudgetBatchSampler([3, 1, 4], [10, 20], num_replicas=3, rank=0)


def test_drop_policy_counts_and_logs_once(caplog):
    sizes = long_tailed(1, 500, 60)
    caplog.set_level(logging.INFO, logger="fitbatch.epoch._arrange")
    samplers = all_ranks(sizes, 200, 7, seed=2, policy="drop")
    got = [list(s) for s in samplers]
    from fitbatch.strategies._recut import greedy_cuts

    with greedy_cuts():  # the plan of several ranks: greedy cuts, no batch cut in parts
        single = fitbatch.plan_batches(sizes, 200, seed=2)
    assert len(single) % 7, "the case must leave batches over"
    stats = samplers[0].plan().stats()
    assert stats.dropped_batches == len(single) % 7
    assert stats.dropped == len(sizes) - sum(len(b) for g in got for b in g)
    assert sum("policy='drop'" in r.getMessage() for r in caplog.records) == 7  # once per rank


# --------------------------------------------------------------------------- loss normalisation


def test_step_units_normalise_the_loss_exactly(functions):
    """sum over ranks of (rank token-sum loss / step units) has the gradient of the step's mean loss."""
    sizes = functions[:600]
    samplers = all_ranks(sizes, 2048, 2, seed=4)
    step_units = samplers[0].step_totals().units
    vocab = 16
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 4), torch.nn.Linear(4, vocab)).double()

    def token_loss_sum(idx) -> torch.Tensor:
        batch = fitbatch.pad_collate([(int(i) + torch.arange(int(sizes[i]))) % vocab for i in idx])
        logits = model(batch.values)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), (batch.values + 1) % vocab, reduction="none")
        return (loss * batch.mask).sum()

    def grad(loss) -> torch.Tensor:
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    plans = [s.plan() for s in samplers]
    for k in range(3):
        ranks = [plans[r][k] for r in range(2)]
        # what each rank does alone; an all-reduce sums (DDP's mean times the world size)
        summed = sum(grad(token_loss_sum(ids) / step_units[k]) for ids in ranks)
        union = np.concatenate(ranks)
        assert int(sizes[union].sum()) == step_units[k]
        whole = grad(token_loss_sum(union) / float(sizes[union].sum()))
        assert torch.allclose(summed, whole, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------- resume, in process


def iterate(sampler, k: int):
    it = iter(sampler)
    return [next(it) for _ in range(k)]


@settings(max_examples=60)
@given(
    seed=st.integers(0, 2**31),
    n=st.integers(20, 400),
    worlds=st.tuples(st.integers(1, 12), st.integers(1, 12), st.integers(1, 12)),
    fractions=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    policy=st.sampled_from(("split", "drop")),
    strategy=st.sampled_from(STRATEGIES),
)
def test_resume_equals_uninterrupted_and_survives_world_changes(seed, n, worlds, fractions, policy, strategy):
    sizes = long_tailed(seed, n, 80)
    kw = {"seed": seed, "policy": policy, "strategy": strategy, "max_batch_size": 8}
    w1, w2, w3 = worlds
    try:
        first = all_ranks(sizes, 240, w1, **kw)
        full = [list(s) for s in first]
    except ValueError as e:
        assert "cannot give every rank a batch" in str(e)
        return
    epoch_losses = np.concatenate([first[0].plan().skipped, first[0].plan().dropped])
    k1 = int(fractions[0] * len(full[0]))
    state = json.loads(json.dumps(first[0].state_dict(step=k1)))
    # same world: exactly the rest
    for r in range(w1):
        again = BudgetBatchSampler(sizes, 240, num_replicas=w1, rank=r, **kw)
        again.load_state_dict(state)
        assert len(again) == len(full[r]) - k1
        assert list(again) == full[r][k1:]
    consumed = [flat(g[:k1]) for g in full]
    # another world: the rest of the epoch re-arranged, every remaining sample once
    try:
        second = all_ranks(sizes, 240, w2, **kw)
        for s in second:
            s.load_state_dict(state)
        start2 = second[0].state_dict()["step"]  # steps of the epoch: k1 on any world
        got2 = [list(s) for s in second]
    except ValueError as e:
        assert "cannot give every rank a batch" in str(e)
        return
    assert len({len(g) for g in got2}) == 1
    lost = second[0].plan().dropped
    assert_exactly_once(consumed + [flat(g) for g in got2] + [second[0].plan().skipped, lost], n)
    assert set(epoch_losses.tolist()) <= set(np.concatenate([second[0].plan().skipped, lost]).tolist())
    # a second interruption, resumed on the same world and on a third one
    k2 = int(fractions[1] * len(got2[0]))
    assert start2 == k1
    state2 = second[w2 - 1].state_dict(step=start2 + k2)  # steps of the epoch, all arrangements
    assert state2["num_replicas"] == w1
    assert state2["events"] == ([{"step": k1, "num_replicas": w2}] if w2 != w1 else [])
    for r in range(w2):
        again = BudgetBatchSampler(sizes, 240, num_replicas=w2, rank=r, **kw)
        again.load_state_dict(state2)
        assert list(again) == got2[r][k2:]
    consumed += [flat(g[:k2]) for g in got2]
    try:
        third = all_ranks(sizes, 240, w3, **kw)
        for s in third:
            s.load_state_dict(state2)
        got3 = [list(s) for s in third]
    except ValueError as e:
        assert "cannot give every rank a batch" in str(e)
        return
    assert len({len(g) for g in got3}) == 1
    assert_exactly_once(consumed + [flat(g) for g in got3] + [third[0].plan().skipped, third[0].plan().dropped], n)


def test_state_is_json_and_load_checks_it(functions):
    sampler = BudgetBatchSampler(functions, 16384, num_replicas=4, rank=1, seed=0)
    iterate(sampler, 5)
    state = sampler.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["step"] == 5 and state["num_replicas"] == 4 and state["version"] == 2
    frozen = json.dumps(state)
    other = BudgetBatchSampler(functions, 16384, num_replicas=2, rank=0, seed=0)
    other.load_state_dict(state)
    assert json.dumps(state) == frozen, "load_state_dict must not mutate its argument"
    resumed = other.state_dict()
    assert resumed["step"] == 5 and resumed["num_replicas"] == 4
    assert resumed["events"] == [{"step": 5, "num_replicas": 2}]
    assert len(other) == other.steps().n_steps == len(other.step_totals()[0]) - 5
    with pytest.raises(ValueError, match="unknown"):
        other.load_state_dict({**state, "rank": 1})
    with pytest.raises(ValueError, match="options"):
        BudgetBatchSampler(functions, 8192, num_replicas=4, rank=1, seed=0).load_state_dict(state)
    # a new epoch forgets the resume
    other.set_epoch(1)
    assert len(other) == other.steps().n_steps and other.state_dict()["events"] == []
    assert other.state_dict()["num_replicas"] == 2


class Indexed(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def as_lists(batch) -> list[int]:
    return [int(i) for i in batch]


def test_resume_with_a_plain_dataloader_and_workers(functions):
    """Workers prefetch ahead of the loop: save ``state_dict(step=k)`` with the loop's count."""
    sizes = functions[:4000]
    kw = {"num_replicas": 2, "rank": 1, "seed": 9}
    full = list(BudgetBatchSampler(sizes, 4096, **kw))
    sampler = BudgetBatchSampler(sizes, 4096, **kw)
    loader = DataLoader(Indexed(len(sizes)), batch_sampler=sampler, num_workers=2, collate_fn=as_lists)
    it = iter(loader)
    head = [next(it) for _ in range(7)]
    assert sampler.state_dict()["step"] > 7, "the workers should have prefetched ahead"
    state = sampler.state_dict(step=7)
    del it
    fresh = BudgetBatchSampler(sizes, 4096, **kw)
    fresh.load_state_dict(state)
    loader = DataLoader(Indexed(len(sizes)), batch_sampler=fresh, num_workers=2, collate_fn=as_lists)
    assert len(loader) == len(full) - 7
    assert head + list(loader) == full


def test_resume_with_torchdata_stateful_dataloader(functions):
    stateful = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata's StatefulDataLoader is not installed"
    )
    sizes = functions[:4000]
    kw = {"num_replicas": 3, "rank": 2, "seed": 9}
    full = list(BudgetBatchSampler(sizes, 4096, **kw))

    def loader(sampler):
        return stateful.StatefulDataLoader(Indexed(len(sizes)), batch_sampler=sampler, num_workers=2, collate_fn=as_lists)

    first = loader(BudgetBatchSampler(sizes, 4096, **kw))
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()  # the loader snapshots the sampler as of the batches it yielded
    del it
    second = loader(BudgetBatchSampler(sizes, 4096, **kw))
    second.load_state_dict(state)
    assert head + list(second) == full


# --------------------------------------------------------------------------- real processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _wait_all(procs, logs, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: no exit within {TIMEOUT} s\n" + "\n".join(_tail(log) for log in logs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    assert not failed, f"{what}: ranks {failed} failed\n" + "\n".join(_tail(logs[i]) for i in failed)


def _tail(log: Path) -> str:
    return f"--- {log.name}\n" + log.read_text(errors="replace")[-3000:]


def launch(phase: str, world: int, out: Path, lengths: Path, *extra: str) -> tuple[list[dict], list[np.ndarray]]:
    """Run ``world`` ranks of dist_train.py; return each rank's record and final parameters."""
    out.mkdir(parents=True, exist_ok=True)
    init = f"file://{out}/store"
    procs, logs = [], []
    for r in range(world):
        logs.append(out / f"rank{r}.log")
        args = [sys.executable, str(WORKER), "--init", init, "--world", str(world), "--rank", str(r),
                "--out", str(out), "--phase", phase, "--lengths", str(lengths), "--budget", "8192", *extra]
        with open(logs[-1], "w") as log:
            procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=out))
    _wait_all(procs, logs, f"{phase} on {world} ranks")
    records = [json.loads((out / f"{phase}-rank{r}.json").read_text()) for r in range(world)]
    params = [np.load(out / f"{phase}-rank{r}.npy") for r in range(world)]
    return records, params


@pytest.fixture(scope="module")
def real_lengths(tmp_path_factory, functions) -> Path:
    """12,000 lengths drawn (seed 0, no replacement) from the 58,754 real function lengths."""
    path = tmp_path_factory.mktemp("lengths") / "functions-12k.npy"
    np.save(path, functions[np.random.default_rng(0).choice(functions.size, 12_000, replace=False)])
    return path


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, real_lengths):
    out = tmp_path_factory.mktemp("full2")
    records, params = launch("full", 2, out, real_lengths)
    return records, params, np.load(out / "full-single.npy")


def check_epoch(records, params, world: int) -> None:
    assert [(r["world"], r["rank"]) for r in records] == [(world, i) for i in range(world)]  # from dist
    assert len({r["steps"] for r in records}) == 1, "ranks ran different numbers of steps"
    assert all(r["steps"] == r["n_steps"] - r["first"] for r in records)
    assert all(r["mismatches"] == 0 for r in records), "step totals differ from what the ranks got"
    assert all(r["gathered_seen"] == r["gathered_unique"] for r in records)
    for p in params[1:]:
        assert np.array_equal(p, params[0]), "replicas diverged"


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_epoch_on_real_lengths(world, full_run, real_lengths, tmp_path):
    """One DDP epoch: same step count, every sample once across ranks, identical replicas, and
    the parameters of one process running each step as one big batch (loss normalisation)."""
    n = np.load(real_lengths).size
    if world == 2:
        records, params, single = full_run
    else:
        records, params = launch("full", world, tmp_path, real_lengths)
        single = np.load(tmp_path / "full-single.npy")
    check_epoch(records, params, world)
    assert records[0]["gathered_seen"] == n
    assert_exactly_once([flat(r["batches"]) for r in records], n)
    assert records[0]["straggler_ratio"] < 1.05
    np.testing.assert_allclose(params[0], single, rtol=0, atol=1e-9)


def test_ddp_resume_same_and_other_world(full_run, real_lengths, tmp_path):
    """Stop after k steps (DataLoader with 2 workers), resume in new processes on 2 and 3 ranks."""
    full, full_params, _ = full_run
    n = np.load(real_lengths).size
    k = 23
    ckpt = tmp_path / "ckpt.pt"
    stop, _ = launch("stop", 2, tmp_path / "stop", real_lengths, "--stop-after", str(k), "--checkpoint", str(ckpt))
    assert [r["steps"] for r in stop] == [k, k]
    assert all(r["prefetched_position"] > k for r in stop), "workers prefetched; step=k must be passed"
    assert torch.load(ckpt, weights_only=False)["sampler"]["step"] == k

    same, same_params = launch("resume", 2, tmp_path / "same", real_lengths, "--checkpoint", str(ckpt))
    check_epoch(same, same_params, 2)
    for r in range(2):
        assert stop[r]["batches"] + same[r]["batches"] == full[r]["batches"]
    np.testing.assert_allclose(same_params[0], full_params[0], rtol=0, atol=1e-12)

    other, other_params = launch("resume", 3, tmp_path / "other", real_lengths, "--checkpoint", str(ckpt))
    check_epoch(other, other_params, 3)
    assert all(r["first"] == k for r in other)  # steps of the epoch: the 3 ranks go on from step k
    consumed = [flat(r["batches"]) for r in stop]
    assert_exactly_once(consumed + [flat(r["batches"]) for r in other], n)


def test_torchrun_example_runs(tmp_path):
    """The README's command, with a free port so parallel runs do not collide."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--master_port={_free_port()}",
           "--nproc_per_node=2", str(EXAMPLE)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "world 2: steps 0..161 of 161 per rank" in proc.stdout  # randomness="auto" (issue #18)
    assert "replica weights identical: True" in proc.stdout


def test_seed_none_on_several_ranks_is_shared_or_refused(tmp_path):
    """``seed=None`` draws fresh entropy, another on every rank: plans that disagree (4 ranks of
    1,000 samples yielded 1,084 samples, 740 distinct). Without torch.distributed it is refused;
    under gloo rank 0's draw is broadcast, and every sampler kind takes the same seed."""
    with pytest.raises(ValueError, match=r"seed=None.*4 ranks.*seed=<int>"):
        BudgetBatchSampler(np.ones(100), 10, num_replicas=4, rank=0, seed=None)
    with pytest.raises(ValueError, match="seed=None"):
        BudgetBatchSampler(np.ones(100), 10, window=50, num_replicas=2, rank=1, seed=None)
    with pytest.raises(ValueError, match="seed=None"):
        fitbatch.schedule.ScheduledBatchSampler(np.ones(100), 8, num_replicas=2, rank=0, seed=None)
    assert shared_seed(None, 1) is None and shared_seed(3, 4) == 3  # one rank draws its own
    from contracts import run_processes

    worker = ROOT / "tests" / "distributed" / "seed_worker.py"
    store = f"file://{tmp_path / 'store'}"
    run_processes([[sys.executable, str(worker), "--init", store, "--world", "3", "--rank", str(r),
                    "--out", str(tmp_path)] for r in range(3)], timeout=120)
    runs = [json.loads((tmp_path / f"seed-rank{r}.json").read_text()) for r in range(3)]
    for kind in ("budget", "windowed", "scheduled"):
        assert len({run[kind]["seed"] for run in runs}) == 1, kind
        if kind != "scheduled":  # (its micro-batches are a schedule's; the budget samplers' plans:)
            flat = sorted(i for run in runs for b in run[kind]["batches"] for i in b)
            assert flat == list(range(400)), kind
