"""BudgetBatchSampler planning in windows (``window=N``; ``WindowedBatchSampler``, its deprecated
name, in the older tests) and the windows it plans (fitbatch.epoch._windows).

The guarantees of the plan samplers, for an epoch planned a window at a time: every sample once,
equal steps on every rank, within budget, exact ``len()``, exact resume (also on another world
size and after a budget change), a collective census on real gloo ranks, and quality within
0.5 % of the global plan at windows of 2**20 on real lengths.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from contracts import run_processes
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz_sampler import BUDGET, SamplerMachine

import fitbatch
from fitbatch import BudgetBatchSampler
from fitbatch.costs import resolve_cost
from fitbatch.epoch import _windows as W
from fitbatch.epoch._arrange import TooFewSamples
from fitbatch.plan._options import PlanOptions
from fitbatch.sampler import WindowedBatchSampler

pytestmark = pytest.mark.filterwarnings("ignore:fitbatch.sampler.WindowedBatchSampler is deprecated:DeprecationWarning")

DATA = Path(__file__).parent / "data"
FUNCTIONS = np.load(DATA / "cpython_stdlib_functions.npy")
PYTOKENS = np.load(DATA / "cpython_stdlib_pytokens.npy")


def samplers(sizes, budget, world, **kw):
    return [WindowedBatchSampler(sizes, budget, num_replicas=world, rank=r, **kw) for r in range(world)]


def cost_of(sizes, batch, cost):
    b = np.asarray(batch)
    return float(resolve_cost(cost).evaluate(np.array([b.size], float), np.array([sizes[b].max()], float), np.array([sizes[b].sum()], float))[0])


# ---------------------------------------------------------------- windows


def test_exact_batches_and_hand_on():
    """Windows of 5 samples, 2 ranks, one sample per batch: window 0's odd batch runs in window 1."""
    ranks = samplers([5] * 14, 5, 2, window=5, block=1, cost="sum", strategy="sequential")
    # window 0 plans [0] .. [4]: two steps, and [1] (the keyed pick) is handed on; window 1 runs it
    # beside its own [5] .. [9] in three steps; window 2, the last (4 samples), runs [10] .. [13]
    assert [list(s) for s in ranks] == [
        [[0], [4], [5], [6], [9], [10], [13]],
        [[3], [2], [8], [7], [1], [12], [11]],
    ]
    assert [len(s) for s in ranks] == [7, 7]
    with pytest.raises(ValueError, match=r"largest: index 5 \(cost 9.0\)"):  # refused when built
        WindowedBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 8, window=4, block=2, cost="sum", strategy="sequential", num_replicas=1, rank=0)


@given(n=st.integers(1, 3000), window=st.integers(1, 700), block=st.integers(1, 300), seed=st.integers(0, 99), shuffle=st.booleans())
def test_windows_partition_the_samples(n, window, block, seed, shuffle):
    windows = W.Windows.keyed(n, window=window, block=block, seed=seed, epoch=1, shuffle=shuffle)
    ids = [windows.ids(w) for w in range(windows.n_windows)]
    assert sorted(np.concatenate(ids).tolist()) == list(range(n))
    # every window is full but the last, which holds the rest: up to 1.5 windows and a block
    assert all(i.size == windows.window for i in ids[:-1])
    assert ids[-1].size < 1.5 * windows.window + windows.block or len(ids) == 1
    if not shuffle:
        assert np.concatenate(ids).tolist() == list(range(n))


def test_windows_are_keyed_by_seed_and_epoch():
    ids = lambda seed, epoch: W.Windows.keyed(10_000, window=1000, block=100, seed=seed, epoch=epoch, shuffle=True).ids(0)  # noqa: E731
    assert np.array_equal(ids(0, 0), ids(0, 0))
    assert not np.array_equal(ids(0, 0), ids(0, 1)) and not np.array_equal(ids(0, 0), ids(1, 0))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(50, 2000), window=st.integers(16, 600), world=st.integers(1, 6), seed=st.integers(0, 999),
    strategy=st.sampled_from(("sequential", "sorted", "pooled", "buckets", "packed")), policy=st.sampled_from(("split", "drop")),
)
def test_census_steps_equal_the_built_windows(n, window, world, seed, strategy, policy):
    """window_steps (len() without planning the batches) gives the steps build_window arranges."""
    sizes = np.random.default_rng(seed).integers(1, 60, n)
    column, opts = W.Column.of(sizes), PlanOptions.build(200, strategy=strategy, seed=seed)
    windows = W.Windows.keyed(n, window=window, block=8, seed=seed, epoch=0, shuffle=True)
    counts = [len(W.own_plan(column, windows, w, opts, 0)[2]) for w in range(windows.n_windows)]
    carry, built = (), []
    try:
        for w in range(windows.n_windows):
            plan = W.build_window(column, windows, w, opts, world=world, epoch=0, carry_in=carry, policy=policy)
            built.append(plan.steps.n_steps)
            carry = plan.carry
    except TooFewSamples:
        return
    assert built == W.window_steps(counts, world, policy)


# ---------------------------------------------------------------- the sampler's guarantees


@pytest.mark.parametrize("world", [1, 3, 8])
@pytest.mark.parametrize("strategy, cost", [("pooled", "padded"), ("sorted", "padded"), ("buckets", "padded"), ("packed", "sum"), ("sequential", "sum")])
def test_every_sample_once_equal_steps_within_budget_exact_len(world, strategy, cost):
    sizes = FUNCTIONS[:30000]
    ranks = samplers(sizes, 8192, world, window=8192, block=256, strategy=strategy, cost=cost, seed=5)
    lens = [len(s) for s in ranks]
    runs = [list(s) for s in ranks]
    assert {len(r) for r in runs} == {lens[0]} and len(set(lens)) == 1
    flat = sorted(i for r in runs for b in r for i in b)
    assert flat == list(range(sizes.size))
    assert max(cost_of(sizes, b, cost) for r in runs for b in r) <= 8192
    assert [list(s) for s in ranks] == runs  # a second iteration runs the same epoch
    whole = ranks[0].plan()
    assert whole.to_lists() == runs[0] and ranks[0].step_totals().samples.sum() == sizes.size


def test_epochs_differ_and_repeat():
    s = WindowedBatchSampler(FUNCTIONS[:20000], 8192, window=8192, block=256, num_replicas=2, rank=1, seed=1)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    s.set_epoch(0)
    assert list(s) == e0 and e0 != e1


def test_size_index_is_read_through_its_memory_map(tmp_path):
    sizes = PYTOKENS[np.random.default_rng(1).integers(0, PYTOKENS.size, 40000)].astype(np.int32)
    index = fitbatch.SizeIndex.create(tmp_path / "idx", np.array_split(sizes, 7))
    kw = {"window": 8192, "block": 512, "num_replicas": 2, "rank": 0, "oversized": "skip"}
    from_index = WindowedBatchSampler(index, 65536, **kw)
    assert list(from_index) == list(WindowedBatchSampler(sizes, 65536, **kw))
    assert index._sizes is None, "the windowed sampler never converts the whole column"
    state = from_index.state_dict(step=3)
    assert state["sizes_digest"] == index.stats["digest"]


def test_quality_within_half_a_percent_of_the_global_plan():
    """At windows of 2**20 on real lengths (4M samples resampled), 8 ranks: batches and padding."""
    sizes = FUNCTIONS[np.random.default_rng(0).integers(0, FUNCTIONS.size, 4_000_000)]
    glob = BudgetBatchSampler(sizes, 16384, num_replicas=8, rank=0, window=None).steps()
    win = WindowedBatchSampler(sizes, 16384, num_replicas=8, rank=0)
    live, batches, real, pad = win._current(), 0, 0.0, 0.0
    while True:
        plan = live.timeline.steps.plan
        batches, real, pad = batches + len(plan), real + plan.real_units.sum(), pad + plan.padded_units.sum()
        if live.last:
            break
        live = win._next(live)
    g_eff = glob.plan.real_units.sum() / glob.plan.padded_units.sum()
    assert batches <= 1.005 * len(glob.plan)
    assert real / pad >= g_eff - 0.005


# ---------------------------------------------------------------- resume


@pytest.mark.parametrize("world", [1, 4])
def test_resume_anywhere_equals_uninterrupted(world):
    sizes = FUNCTIONS[:15000]
    kw = {"window": 2048, "block": 128, "seed": 9}
    full = [list(s) for s in samplers(sizes, 8192, world, **kw)]
    for stop in (0, 1, 40, len(full[0]) // 2, len(full[0]) - 1, len(full[0])):
        for r in range(world):
            s = WindowedBatchSampler(sizes, 8192, num_replicas=world, rank=r, **kw)
            it = iter(s)
            head = [next(it) for _ in range(stop)]
            state = json.loads(json.dumps(s.state_dict()))
            again = WindowedBatchSampler(sizes, 8192, num_replicas=world, rank=r, **kw)
            again.load_state_dict(state)
            assert len(again) == len(full[r]) - stop
            assert head + list(again) == full[r]


def test_state_of_an_earlier_step_with_prefetch():
    """state_dict(step=k) for a step in a window the iterator has passed (a prefetching loader)."""
    sizes = FUNCTIONS[:15000]
    kw = {"window": 2048, "block": 128, "num_replicas": 2, "rank": 1}
    full = list(WindowedBatchSampler(sizes, 8192, **kw))
    s = WindowedBatchSampler(sizes, 8192, **kw)
    it = iter(s)
    for _ in range(len(full) - 5):
        next(it)
    state = s.state_dict(step=12)
    assert state["window"] < s.state_dict()["window"]
    again = WindowedBatchSampler(sizes, 8192, **kw)
    again.load_state_dict(state)
    assert list(again) == full[12:]


@pytest.mark.parametrize("old, new", [(4, 3), (2, 5), (3, 1)])
def test_resume_on_another_world_size(old, new):
    sizes = FUNCTIONS[:20000]
    kw = {"window": 8192, "block": 256, "seed": 2}
    ranks = samplers(sizes, 8192, old, **kw)
    its = [iter(s) for s in ranks]
    seen = [i for _ in range(40) for it in its for i in next(it)]
    state = ranks[0].state_dict()
    assert all(s.state_dict() == state for s in ranks)
    moved = samplers(sizes, 8192, new, **kw)
    for s in moved:
        s.load_state_dict(json.loads(json.dumps(state)))
    lens = [len(s) for s in moved]
    rest = [list(s) for s in moved]
    assert len(set(lens)) == 1 and [len(r) for r in rest] == lens
    assert sorted(seen + [i for r in rest for b in r for i in b]) == list(range(sizes.size))
    assert moved[0].state_dict()["events"][-1]["num_replicas"] == new


def test_set_budget_part_way_replans_the_window_and_resumes():
    sizes = FUNCTIONS[:20000]
    kw = {"window": 4096, "block": 256, "num_replicas": 2, "rank": 0, "cost": "padded"}
    s = WindowedBatchSampler(sizes, 8192, **kw)
    it = iter(s)
    head = [next(it) for _ in range(60)]
    with pytest.raises(ValueError, match=r"largest: index 15983 \(cost 4911.0\)"):  # refused: nothing changes
        s.set_budget(2048)
    assert s.state_dict()["events"] == []
    s = WindowedBatchSampler(sizes, 8192, **kw, oversized="single")
    it = iter(s)
    head = [next(it) for _ in range(60)]
    s.set_budget(2048)
    after_change = s.state_dict()
    middle = [next(it) for _ in range(200)]  # into later windows, with batches handed on
    later = s.state_dict()
    tail = list(it)
    assert all(cost_of(sizes, b, "padded") <= 2048 or len(b) == 1 for b in middle + tail)
    kw["oversized"] = "single"
    again = WindowedBatchSampler(sizes, 8192, **kw)
    again.load_state_dict(after_change)
    assert list(again) == middle + tail
    again = WindowedBatchSampler(sizes, 8192, **kw)
    again.load_state_dict(later)
    assert list(again) == tail and later["events"] == after_change["events"]
    (event,) = later["events"]
    assert event["budget"] == 2048.0 and event["window"] < later["window"]
    other = WindowedBatchSampler(sizes, 8192, **{**kw, "rank": 1})
    other_it = iter(other)
    theirs = [next(other_it) for _ in range(60)]
    other.set_budget(2048)
    theirs += list(other_it)
    assert sorted(i for b in head + middle + tail + theirs for i in b) == list(range(sizes.size))


def test_refuses_bad_states_and_options():
    sizes = FUNCTIONS[:5000]
    s = WindowedBatchSampler(sizes, 8192, window=1024, num_replicas=1, rank=0)
    state = s.state_dict()
    with pytest.raises(ValueError, match="window"):
        WindowedBatchSampler(sizes, 8192, window=2048, num_replicas=1, rank=0).load_state_dict(state)
    with pytest.raises(ValueError, match="window fields .* contradict"):  # an edited window: the digest refuses it
        WindowedBatchSampler(sizes, 8192, window=1024, num_replicas=1, rank=0).load_state_dict({**state, "window": 99})
    with pytest.raises(ValueError, match="events"):
        s.load_state_dict({**state, "events": [{"window": "0", "step": 1, "budget": 9.0}]})
    with pytest.raises(ValueError, match="window fields .* contradict"):
        s.load_state_dict({**state, "events": [{"step": 1, "budget": 9.0}]})
    # options that mean something of the whole epoch make it one window (tests/test_one_engine.py)
    for whole in ({"drop_last": True}, {"max_shapes": 4}):
        assert WindowedBatchSampler(sizes, 8192, **whole).window is None
    assert BudgetBatchSampler(sizes, [8192, 8192], window=1024, num_replicas=2, rank=0).window is None
    with pytest.raises(ValueError, match="census"):
        WindowedBatchSampler(sizes, 8192, census="sometimes")
    with pytest.raises(ValueError, match="fewer than 2 x num_replicas=8 samples"):
        WindowedBatchSampler(sizes, 8192, window=15, num_replicas=8, rank=0)


def test_budget_sampler_plans_in_windows_above_the_threshold(monkeypatch):
    sizes = FUNCTIONS[:5000]
    assert BudgetBatchSampler(sizes, 8192, num_replicas=1, rank=0).window is None
    assert BudgetBatchSampler(sizes, 8192, window=1024, num_replicas=1, rank=0).window == 1024
    monkeypatch.setattr(W, "AUTO_ABOVE", 4000)
    auto = BudgetBatchSampler(sizes, 8192, num_replicas=1, rank=0)
    assert type(auto) is BudgetBatchSampler and auto.window == W.WINDOW
    assert BudgetBatchSampler(sizes, 8192, window=None, num_replicas=1, rank=0).window is None
    # loss_sizes plan in windows too; options of the whole epoch keep one window under "auto"
    assert BudgetBatchSampler(sizes, 8192, loss_sizes=sizes, num_replicas=1, rank=0).window == W.WINDOW
    assert BudgetBatchSampler(sizes, [8192, 8192], num_replicas=2, rank=0).window is None


# ---------------------------------------------------------------- gloo: the collective census


def test_collective_census_on_gloo(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent / "windowed_scripts"))
    import census_worker as CW

    world = 2
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    script = Path(__file__).parent / "windowed_scripts" / "census_worker.py"
    run_processes([[sys.executable, str(script), str(r), str(world), str(tmp_path / "init"), str(outs[r])] for r in range(world)], timeout=120)
    got = [json.loads(o.read_text()) for o in outs]
    local = [WindowedBatchSampler(CW.sizes(), 8192, num_replicas=world, rank=r, census="local", **CW.KW) for r in range(world)]
    for r in range(world):
        assert got[r]["len"] == len(local[r]) == len(got[r]["batches"])
        assert got[r]["batches"] == list(local[r])
    assert got[0]["counts"] == got[1]["counts"]
    assert {int(k): v for k, v in got[0]["counts"].items()} == next(iter(local[0]._counts.values()))


# ---------------------------------------------------------------- stateful fuzzing


class WindowedMachine(SamplerMachine):
    """The sampler state machine of test_fuzz_sampler, over windows of 8-64 samples."""

    def build(self, world, budget=BUDGET):
        rng = np.random.default_rng(self.kw["seed"])
        window, block = int(rng.choice([8, 16, 32, 64])), int(rng.choice([1, 4, 8]))
        return [
            WindowedBatchSampler(self.sizes, budget, num_replicas=world, rank=r, window=window, block=block, **self.kw)
            for r in range(world)
        ]

    def planned_budget(self, sampler):
        live = sampler._current()
        return max(live.timeline.steps.plan.budget, live.plan.steps.plan.budget)

    def world_event(self, state, world):
        return {"window": state["window"], "step": state["step"] - state["window_step"], "num_replicas": world}


WindowedMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestWindowedMachine = WindowedMachine.TestCase


def test_auto_window_holds_two_batches_per_rank_and_a_resume_adopts_it():
    sizes = FUNCTIONS[:20000]
    wide = WindowedBatchSampler(sizes, 131072, num_replicas=400, rank=0)
    assert wide.window == W.auto_window(W.Column.of(sizes), wide.options, 400) > W.WINDOW
    assert WindowedBatchSampler(sizes, 131072, num_replicas=2, rank=0).window == W.WINDOW
    state = wide.state_dict()
    moved = WindowedBatchSampler(sizes, 131072, num_replicas=2, rank=1)
    moved.load_state_dict(state)
    assert moved.window == wide.window and len(moved) == len(list(moved))


def test_n_steps_counts_without_planning_the_epoch():
    sizes = FUNCTIONS[:20000]
    s = WindowedBatchSampler(sizes, 8192, window=4096, block=256, num_replicas=3, rank=2, seed=4)
    assert s.n_steps() == len(s) == len(list(s)) == len(s.plan())
    assert s.n_steps(1) == len(s.plan(1)) and s._live.plan.index == s.windows().n_windows - 1


# ------------------------------------------------- changes part-way, resumes and len() (review)

SEQ = dict(block=1, census="local", seed=0, shuffle=False, strategy="sequential")


def test_len_counts_handed_on_batches_a_smaller_budget_plans_again():
    """A batch handed on to the next window that a new budget no longer holds is planned again
    there, into more batches: ``len()`` counts them (it said 3 for an epoch of 4 steps)."""
    sizes = [66, 93, 52, 74, 35, 49, 37, 83, 28]
    ranks = [WindowedBatchSampler(sizes, 200, window=5, num_replicas=2, rank=r, **SEQ) for r in range(2)]
    its = [iter(s) for s in ranks]
    done = [[next(it)] for it in its]
    for s in ranks:
        s.set_budget(150)
    predicted = [len(s) for s in ranks]
    rest = [list(it) for it in its]
    assert predicted == [1 + len(r) for r in rest] == [len(list(s)) for s in ranks]
    ran = [i for d, r in zip(done, rest) for b in d + r for i in b]
    assert sorted(ran) == list(range(len(sizes)))


def _prefetched_state(sizes, window, budget, new_budget, handed):
    """The state a prefetching loop saves: ``handed`` batches out, a budget change, step 0 done."""
    s = WindowedBatchSampler(sizes, budget, window=window, num_replicas=1, rank=0, **SEQ)
    it = iter(s)
    done = [next(it) for _ in range(handed)]
    s.set_budget(new_budget)
    return json.loads(json.dumps(s.state_dict(step=0))), done + list(it)


def test_a_resume_counts_the_events_of_later_windows():
    sizes = [85, 95, 63, 16, 12, 4, 35, 86]
    state, uninterrupted = _prefetched_state(sizes, 3, 200, 150, 3)
    assert state["window"] == 0 and state["events"][0]["window"] == 1
    r = WindowedBatchSampler(sizes, 200, window=3, num_replicas=1, rank=0, **SEQ)
    r.load_state_dict(state)
    assert len(r) == len(uninterrupted) and list(r) == uninterrupted


def test_a_resume_on_more_ranks_runs_later_windows_events_from_the_resume_point():
    """Events of windows after the saved one name steps of the old world's windows: on a new
    world the rest of the epoch runs with the options in force after them (as the global
    sampler does); it raised ``IndexError`` (window 1 laid out for the old world)."""
    sizes = [2, 43, 74, 71, 96, 32, 24, 57, 13, 35]
    state, _ = _prefetched_state(sizes, 4, 200, 150, 4)
    assert state["window"] == 0 and state["events"][0]["window"] == 1
    ranks = [WindowedBatchSampler(sizes, 200, window=4, num_replicas=2, rank=r, **SEQ) for r in range(2)]
    for r in ranks:
        r.load_state_dict(state)
    got = [list(r) for r in ranks]
    assert [len(r) for r in ranks] == [len(g) for g in got] and len(got[0]) == len(got[1])
    assert sorted(i for g in got for b in g for i in b) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in b) <= 150 for g in got for b in g)  # sequential: sum of 2 or 3 fits
    assert ranks[0].state_dict(step=0)["events"] == [
        {"window": 0, "step": 0, "num_replicas": 2}, {"window": 0, "step": 0, "budget": 150.0}]


def test_an_oversized_sample_is_refused_when_the_windowed_sampler_is_built():
    """Not eight batches into the epoch, at the window that holds it (the global sampler refuses
    it before its first batch)."""
    sizes = [10] * 99 + [500]
    with pytest.raises(ValueError, match=r"largest: index 99 \(cost 500.0\).*oversized='single'"):
        WindowedBatchSampler(sizes, 100, window=20, num_replicas=1, rank=0, census="local")
    with pytest.raises(ValueError, match="largest: index 99"):
        BudgetBatchSampler(sizes, 100, window=20, num_replicas=1, rank=0)


@pytest.mark.parametrize("make, match", [
    (lambda s: BudgetBatchSampler(s, 12, window=0, num_replicas=1, rank=0), "window must be >= 1"),
    (lambda s: BudgetBatchSampler(s, 12, window="wide", num_replicas=1, rank=0), "window must be 'auto'"),
    (lambda s: BudgetBatchSampler(s, 12, window=1, num_replicas=1, rank=0), r"window=1 holds fewer than 2 x num_replicas"),
])
def test_the_window_argument_is_checked(make, match):
    with pytest.raises(ValueError, match=match):
        make([3, 1, 4, 1, 5, 9, 2, 6])


def test_the_window_argument_takes_numpy_ints_and_keyword_sizes():
    sizes = [3, 1, 4, 1, 5, 9, 2, 6]
    for sampler in (BudgetBatchSampler(sizes, 12, window=np.int64(4), num_replicas=1, rank=0),
                    BudgetBatchSampler(sizes=sizes, budget=12, window=4, num_replicas=1, rank=0)):
        assert type(sampler) is BudgetBatchSampler and sampler.window == 4
        assert sorted(i for b in sampler for i in b) == list(range(8))


def test_a_state_of_another_window_is_named_as_such():
    """One schema: a state planned in windows and one planned whole differ in their options."""
    sizes = list(range(1, 41))
    windowed = BudgetBatchSampler(sizes, 100, window=10, num_replicas=1, rank=0)
    whole = BudgetBatchSampler(sizes, 100, window=None, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"block: saved 4096, this sampler None; window: saved 10, this sampler None"):
        whole.load_state_dict(windowed.state_dict(step=2))
    with pytest.raises(ValueError, match=r"window: saved None, this sampler 10"):
        windowed.load_state_dict(whole.state_dict(step=2))
