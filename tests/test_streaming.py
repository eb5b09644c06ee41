"""fitbatch.streaming: batches of iterables of unknown length, in bounded memory.

Contracts: ``sequential`` equals the indexed ``sequential`` plan; ``buckets`` yields every item
exactly once within budget and never holds more than ``buffer_size`` items; a resumed stream
yields exactly what the uninterrupted one still had to; workers and ranks see every item once
and stop together.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from contracts import COSTS, run_processes
from hypothesis import given, settings
from hypothesis import strategies as st

import fitbatch
import fitbatch.streaming._plan as SP
from fitbatch._kernels import batches as K
from fitbatch.streaming import (
    BatchStream,
    StreamDataset,
    batch_stream,
    equal_steps,
)

SCRIPTS = Path(__file__).resolve().parent / "streaming_scripts"
SHARED = Path("/work/shared/data")


def real_set(name: str) -> np.ndarray:
    local = Path(__file__).resolve().parent / "data" / f"cpython_stdlib_{name}.npy"
    return np.load(local if local.exists() else SHARED / local.name)


def make_sizes(n: int, seed: int, kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "int":
        return rng.integers(0, 40, n).astype(np.float64)
    if kind == "long":
        return np.round(rng.lognormal(3, 1, n))
    return rng.integers(0, 240, n) / 8.0


def stream_of(sizes: np.ndarray, batch: bool = False, **kw) -> BatchStream:
    """A stream of the indices 0..n-1 (a generator: read once), sized by ``sizes``."""
    items = (i for i in range(sizes.size))
    if batch:
        return batch_stream(items, sizeof_batch=lambda xs: sizes[np.asarray(xs, dtype=np.int64)], **kw)
    values = sizes.tolist()
    return batch_stream(items, sizeof=values.__getitem__, **kw)


def cost_of(model, sizes: np.ndarray, batch: list[int]) -> float:
    s = sizes[np.asarray(batch, dtype=np.int64)]
    return float(model.evaluate(np.array([float(len(s))]), s.max(keepdims=True), s.sum(keepdims=True))[0])


# ---------------------------------------------------------------------------- sequential


@given(
    n=st.one_of(st.integers(0, 60), st.sampled_from([8191, 8192, 8193, 20000])),
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(["int", "long", "dyadic"]),
    cost=st.sampled_from(sorted(COSTS)),
    budget=st.sampled_from([7.0, 40.0, 300.0, 5000.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
    oversized=st.sampled_from(["single", "skip"]),
    batch=st.booleans(),
)
@settings(max_examples=30)
def test_sequential_equals_indexed_plan(n, seed, kind, cost, budget, cap, oversized, batch):
    sizes = make_sizes(n, seed, kind)
    model = COSTS[cost]
    want = fitbatch.plan_batches(
        sizes, budget, cost=model, strategy="sequential", max_batch_size=cap, oversized=oversized
    )
    stream = stream_of(sizes, batch, budget=budget, cost=model, max_batch_size=cap, oversized=oversized)
    assert list(stream) == want.to_lists()
    s = stream.summary
    assert s.finished and s.held == 0 and s.items_read == n
    assert s.skipped == want.stats().skipped and s.batches == len(want)
    assert s.skipped_positions == tuple(want.skipped[:10].tolist())
    if len(want):
        assert s.padding_efficiency == pytest.approx(want.stats().padding_efficiency)


def test_sequential_stream_equals_indexed_plan_at_exact_budget_ties_far_into_the_stream():
    """8,191 sizes of k/8 under a sum budget of 7 (lowered by one part in 1e12, as both planners
    do for fractional sizes): a pair summing to exactly 7 is over it wherever it lies. The
    indexed plan's prefix sums start at the first item, the stream's at its open batch, so a
    test of ``csum[j] <= csum[i] + budget`` rounded differently for each (item 6,076 here)."""
    sizes = make_sizes(8191, 0, "dyadic")
    want = fitbatch.plan_batches(sizes, 7.0, cost="sum", strategy="sequential", oversized="single")
    for batch in (False, True):
        assert list(stream_of(sizes, batch, budget=7.0, cost="sum", oversized="single")) == want.to_lists()


def test_sequential_long_open_batch_uses_the_kernel_carry():
    # a budget far above the stream's total keeps one batch open across many chunks
    sizes = make_sizes(3 * SP.SEQUENTIAL_CHUNK + 17, 1, "int")
    for cost in ("sum", "padded"):
        got = list(stream_of(sizes, budget=1e9, cost=cost, max_batch_size=2 * SP.SEQUENTIAL_CHUNK + 5))
        want = fitbatch.plan_batches(sizes, 1e9, cost=cost, strategy="sequential", max_batch_size=2 * SP.SEQUENTIAL_CHUNK + 5)
        assert got == want.to_lists()


@given(
    n=st.integers(1, 400),
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(["int", "long", "dyadic", "zeros"]),
    budget=st.sampled_from([0.5, 7.0, 40.0, 300.0, 5000.0, 7.0 * (1 - 1e-12)]),
    cap=st.one_of(st.none(), st.integers(1, 12)),
)
@settings(max_examples=60)
def test_sum_starts_equal_the_kernel_both_ways(n, seed, kind, budget, cap):
    # the stream's sum walk (searched at every position, or bisected per batch) is the kernel's
    sizes = np.zeros(n) if kind == "zeros" else make_sizes(n, seed, kind)
    cost = fitbatch.costs.resolve_cost("sum")
    want = K.descending_starts(np.zeros(n, np.uint8), np.zeros(1), sizes, np.zeros(1, np.int64), budget, cost, cap=cap)
    default = K.LONG_BATCH
    try:
        for long_batch in (0, 10**9):
            K.LONG_BATCH = long_batch
            assert K.sum_starts(sizes, budget, cap).tolist() == want.tolist()
    finally:
        K.LONG_BATCH = default


def test_next_and_iter_share_one_position_and_errors_do_not_end_the_stream():
    def sizeof(x):
        if x == 3:
            raise KeyError("boom")
        return 1.0

    c = 4096  # items read per round: buffer_size
    stream = batch_stream(range(2 * c + 100), sizeof=sizeof, budget=4, cost="sum", buffer_size=c)
    with pytest.raises(KeyError, match="stream item 3"):
        next(stream)
    assert next(stream) == [c, c + 1, c + 2, c + 3]  # the failed chunk is lost, as it is read
    it = iter(stream)
    assert next(it) == [c + 4, c + 5, c + 6, c + 7] and next(stream)[0] == c + 8
    batch = next(iter(stream))  # a for loop's first step
    assert batch[0] == c + 12 and stream.summary.batches == 4
    assert stream.summary.items_emitted == 16


def test_batch_stream_does_not_import_torch():
    code = (
        "import sys, fitbatch.streaming as fs\n"
        "assert list(fs.batch_stream([3, 1, 2], sizeof=int, budget=4, cost='sum')) == [[3, 1], [2]]\n"
        "assert 'torch' not in sys.modules, 'batch_stream imported torch'\n"
        "fs.StreamDataset, fs.StreamShard, fs.equal_steps\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_seed_behaviour_and_collate():
    # bionemo's size_aware_batching example: numel per tensor, max_total_size=4, default_collate
    import torch
    from torch.utils.data import default_collate

    data = [torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6]), torch.tensor([7, 8]), torch.tensor([9, 10])]
    out = list(batch_stream(data, sizeof=lambda x: x.numel(), budget=4, cost="sum", collate_fn=default_collate))
    assert [b.tolist() for b in out] == [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10]]]


# ---------------------------------------------------------------------------- buckets


@given(
    n=st.one_of(st.integers(0, 50), st.sampled_from([500, 3000])),
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(["int", "long", "dyadic"]),
    cost=st.sampled_from(sorted(COSTS)),
    budget=st.sampled_from([40.0, 300.0, 5000.0]),
    buffer_size=st.sampled_from([1, 7, 64, 1000]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
    given_edges=st.booleans(),
)
@settings(max_examples=30)
def test_buckets_every_item_once_within_budget_and_buffer(n, seed, kind, cost, budget, buffer_size, cap, given_edges):
    sizes = make_sizes(n, seed, kind)
    model = COSTS[cost]
    strategy = fitbatch.Buckets(boundaries=(3.0, 10.0, 30.0)) if given_edges else "buckets"
    stream = stream_of(sizes, budget=budget, cost=model, strategy=strategy, buffer_size=buffer_size,
                       max_batch_size=cap, oversized="single")
    seen: list[int] = []
    for batch in stream:
        assert stream.summary.held <= buffer_size
        assert batch and (cap is None or len(batch) <= cap)
        assert len(batch) == 1 or cost_of(model, sizes, batch) <= budget * (1 + 1e-12)
        seen.extend(batch)
    assert sorted(seen) == list(range(n))
    assert stream.summary.finished and stream.summary.items_emitted == n


def test_buckets_fit_refits_and_given_open_bucket():
    sizes = make_sizes(100_000, 3, "long")
    stream = stream_of(sizes, budget=4096, strategy="buckets", buffer_size=2000, batch=True)
    seen = sorted(i for b in stream for i in b)
    assert seen == list(range(sizes.size))
    assert stream._planner.next_fit is None  # fitted on the whole reservoir, then fixed
    # given boundaries far below the sizes: everything lands in the open (greedy) bucket
    stream = stream_of(sizes, budget=4096, strategy=fitbatch.Buckets(boundaries=(1.0,)), buffer_size=300)
    assert sorted(i for b in stream for i in b) == list(range(sizes.size))


@pytest.mark.parametrize("name", ["functions", "pytokens"])
def test_buckets_padding_on_real_sets(name, record_property):
    sizes = real_set(name).astype(np.float64)
    sizes = sizes[sizes <= 16384]
    eff = {}
    for strategy in ("sequential", "buckets"):
        stream = stream_of(sizes, budget=16384, strategy=strategy, buffer_size=10_000, batch=True)
        assert sum(len(b) for b in stream) == sizes.size
        eff[strategy] = stream.summary.padding_efficiency
    record_property("padding_efficiency", eff)
    assert eff["buckets"] > eff["sequential"]
    assert eff["buckets"] >= 0.95


# ---------------------------------------------------------------------------- errors and policies


def test_sizeof_arguments():
    with pytest.raises(TypeError, match="exactly one of sizeof"):
        batch_stream([1], budget=4)
    with pytest.raises(TypeError, match="exactly one of sizeof"):
        batch_stream([1], sizeof=len, sizeof_batch=len, budget=4)
    with pytest.raises(TypeError, match="sizeof must be callable"):
        batch_stream([1], sizeof=3, budget=4)
    with pytest.raises(ValueError, match=r"strategies \('sequential', 'buckets'\)"):
        batch_stream([1], sizeof=int, budget=4, strategy=fitbatch.Pooled())
    with pytest.raises(ValueError, match="unknown strategy 'pooled'"):
        batch_stream([1], sizeof=int, budget=4, strategy="pooled")
    with pytest.raises(ValueError, match="buffer_size must be >= 1"):
        batch_stream([1], sizeof=int, budget=4, buffer_size=0)
    with pytest.raises(ValueError, match="unknown oversized"):
        batch_stream([1], sizeof=int, budget=4, oversized="drop")


def test_sizeof_errors_name_the_position():
    def sizeof(x):
        if x == 12345:
            raise KeyError("no length")
        return 1

    with pytest.raises(KeyError, match="stream item 12345"):
        list(batch_stream(range(20000), sizeof=sizeof, budget=10))
    with pytest.raises(ValueError, match="stream item 3"):
        list(batch_stream(["1", "2", "3", "x"], sizeof=float, budget=10))
    with pytest.raises(ValueError, match=r"item 2 \(size -1.0\)"):
        list(batch_stream([1, 2, -1], sizeof=float, budget=10))
    with pytest.raises(ZeroDivisionError, match=r"chunk of stream items 0..2"):
        list(batch_stream([1, 2, 3], sizeof_batch=lambda xs: 1 / 0, budget=10))
    with pytest.raises(ValueError, match=r"returned shape \(2,\)"):
        list(batch_stream([1, 2, 3], sizeof_batch=lambda xs: xs[:2], budget=10))


@pytest.mark.parametrize("strategy", ["sequential", "buckets"])
def test_oversized_policies(strategy, caplog):
    data = [3, 50, 4, 60, 2]
    with pytest.raises(ValueError, match=r"stream item 1 \(cost 50.0\).*oversized='single'.*oversized='skip'"):
        list(batch_stream(data, sizeof=float, budget=10, cost="sum", strategy=strategy))
    single = batch_stream(data, sizeof=float, budget=10, cost="sum", strategy=strategy, oversized="single")
    out = list(single)
    assert [50] in out and [60] in out and single.summary.oversized_batches == 2
    skip = batch_stream(data, sizeof=float, budget=10, cost="sum", strategy=strategy, oversized="skip")
    with caplog.at_level("WARNING", logger="fitbatch.streaming"):
        out = list(skip)
    assert sorted(x for b in out for x in b) == [2, 3, 4]
    assert skip.summary.skipped == 2 and skip.summary.skipped_positions == (1, 3)
    assert "stream ended: 2 oversized items skipped" in caplog.text


@pytest.mark.parametrize("strategy", ["sequential", "buckets"])
def test_streams_and_plans_refuse_oversized_items_with_one_message(strategy):
    data = [3, 50, 4, 60, 2]
    with pytest.raises(ValueError) as planned:
        fitbatch.plan_batches(data, 10, cost="sum")
    with pytest.raises(ValueError) as streamed:
        list(batch_stream(data, sizeof=float, budget=10, cost="sum", strategy=strategy))
    # one rule and one message (fitbatch.plan._rules.screen_oversized); only the names differ
    names = {
        "2 samples": "2 items",
        "index 3 (cost 60.0), index 1 (cost 50.0)": "stream item 3 (cost 60.0), stream item 1 (cost 50.0)",
        "plan's stats": "stream's summary",
    }
    expected = str(planned.value)
    for plan_name, stream_name in names.items():
        assert plan_name in expected
        expected = expected.replace(plan_name, stream_name)
    assert str(streamed.value) == expected


# ---------------------------------------------------------------------------- resume


class Replayable:
    """A source that replays the same items each time it is iterated (like a shard list)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@given(
    strategy=st.sampled_from(["sequential", "buckets", "given"]),
    cost=st.sampled_from(["sum", "padded"]),
    n=st.sampled_from([0, 37, 3000, 20000]),
    stop=st.floats(0, 1),
    seed=st.integers(0, 100),
    oversized=st.sampled_from(["single", "skip"]),
)
@settings(max_examples=25)
def test_resume_equals_uninterrupted(strategy, cost, n, stop, seed, oversized):
    sizes = make_sizes(n, seed, "long")
    values = sizes.tolist()
    strat = fitbatch.Buckets(boundaries=(5.0, 20.0, 60.0)) if strategy == "given" else strategy
    kw = dict(sizeof=values.__getitem__, budget=600, cost=cost, strategy=strat, buffer_size=500, oversized=oversized)
    full = list(batch_stream(Replayable(n), **kw))
    k = int(stop * len(full))
    first = batch_stream(Replayable(n), **kw)
    head = [next(first) for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))
    again = batch_stream(Replayable(n), **kw)
    again.load_state_dict(state)
    assert again.summary.batches == k
    tail = list(again)
    assert head + tail == full
    rest = list(first)
    assert again.summary.items_emitted == first.summary.items_emitted and tail == rest
    assert again.summary.skipped == first.summary.skipped


def test_resume_state_is_small_and_checked():
    values = make_sizes(30000, 0, "long").tolist()
    kw = dict(sizeof=values.__getitem__, budget=600, strategy="buckets", buffer_size=1000)
    stream = batch_stream(Replayable(30000), **kw)
    for _ in range(200):
        next(stream)
    state = stream.state_dict()
    assert len(json.dumps(state)) < 40_000  # O(buffer_size), not O(stream)
    fresh = batch_stream(Replayable(30000), **kw)
    with pytest.raises(ValueError, match="unknown stream state keys"):
        fresh.load_state_dict({**state, "extra": 1})
    with pytest.raises(ValueError, match="version"):
        fresh.load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match="other stream options"):
        batch_stream(Replayable(30000), **{**kw, "budget": 700}).load_state_dict(state)
    with pytest.raises(ValueError, match="replays .* fewer"):
        batch_stream(Replayable(10), **kw).load_state_dict(state)
    with pytest.raises(ValueError, match="before the stream is iterated"):
        stream.load_state_dict(state)
    before = json.dumps(state)
    fresh.load_state_dict(state)
    assert json.dumps(state) == before  # the argument is not mutated


# ---------------------------------------------------------------------------- memory


@pytest.mark.parametrize(("strategy", "cost"), [("buckets", "padded"), ("sequential", "sum")])
def test_memory_bounded_for_10m_items(strategy, cost):
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "memory.py"), strategy, cost, "10000000", "10000"],
        capture_output=True, text=True, timeout=300, check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["items"] == 10_000_000
    assert got["max_held"] <= 10_000
    # 10 M held Python ints and lists would take ~400 MB; the stream grows by next to nothing
    assert got["end_rss_mb"] - got["early_rss_mb"] < 50


# ---------------------------------------------------------------------------- DataLoader workers


def test_dataloader_two_workers_every_item_once():
    from torch.utils.data import DataLoader

    n = 5000
    ds = StreamDataset(range(n), sizeof=lambda i: 1 + i % 50, budget=400, strategy="buckets", buffer_size=300)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    seen = [i for batch in loader for i in batch]
    assert sorted(seen) == list(range(n))


def test_stream_shards_seeds_per_worker_and_epoch():
    from fitbatch.streaming._parallel import current_shard

    a = current_shard(7, 0, 0, 1)
    assert a == current_shard(7, 0, 0, 1)
    assert a.seed != current_shard(7, 1, 0, 1).seed != current_shard(7, 0, 1, 2).seed
    seeds = []
    ds = StreamDataset(lambda shard: (seeds.append(shard.seed), range(shard.index, 20, shard.count))[1],
                       sizeof=lambda i: 1, budget=5, cost="sum")
    assert [i for b in ds for i in b] == list(range(20))
    ds.set_epoch(1)
    list(ds)
    assert seeds[0] != seeds[1]
    assert seeds[0] == current_shard(0, 0, 0, 1).seed


# ---------------------------------------------------------------------------- equal steps


def test_equal_steps_single_process():
    with pytest.raises(TypeError, match="exactly one of sync_every"):
        equal_steps([], sync_every=2, steps=3)
    run = equal_steps(batch_stream(range(100), sizeof=lambda i: 1, budget=7, cost="sum"), sync_every=4)
    out = list(run)
    assert [i for b in out for i in b] == list(range(100))
    assert run.summary.steps == 15 and run.summary.dropped_batches == 0 and run.summary.exhausted
    fixed = equal_steps(iter([[1], [2], [3]]), steps=2)
    assert list(fixed) == [[1], [2]]
    short = equal_steps(iter([[1]]), steps=2)
    next(short)
    with pytest.raises(RuntimeError, match="ended after 1 of steps=2"):
        next(short)


def test_equal_steps_resume_mid_window():
    def make():
        return equal_steps(batch_stream(Replayable(200), sizeof=lambda i: 1 + i % 5, budget=20), sync_every=5)

    full = list(make())
    run = make()
    head = [next(run) for _ in range(7)]
    state = json.loads(json.dumps(run.state_dict()))
    again = make()
    again.load_state_dict(state)
    assert head + list(again) == full


def test_equal_steps_gloo_two_ranks(tmp_path):
    init = tmp_path / "init"
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    run_processes(
        [[sys.executable, str(SCRIPTS / "equal_steps_gloo.py"), str(r), "2", str(init), str(outs[r])] for r in range(2)],
        timeout=120,
    )
    res = [json.loads(o.read_text()) for o in outs]
    assert res[0]["steps"] == res[1]["steps"] == res[0]["batches"] == res[1]["batches"]
    assert res[0]["exhausted"] and not res[1]["exhausted"]  # rank 0's shard is shorter
    assert res[0]["items"] == res[0]["n"]  # the short rank ran everything it had
    assert res[1]["items"] + res[1]["dropped_items"] < res[1]["n"]  # the long rank left a remainder
    assert res[1]["unique"] == res[1]["items"]
    assert res[0]["collectives"] == res[1]["collectives"]


def test_per_chunk_sizes_a_chunk_at_once_and_equals_per_item() -> None:
    sizes = np.array([5, 3, 8, 2, 9, 1, 4], dtype=np.int64)
    calls: list[int] = []

    def chunk(ids: list[int]) -> np.ndarray:
        calls.append(len(ids))
        return sizes[np.asarray(ids, dtype=np.int64)]

    by_chunk = list(batch_stream(range(7), sizeof=fitbatch.streaming.per_chunk(chunk), budget=10, cost="sum"))
    by_item = list(batch_stream(range(7), sizeof=lambda i: int(sizes[i]), budget=10, cost="sum"))
    assert by_chunk == by_item == [[0, 1], [2, 3], [4, 5], [6]]
    assert sum(calls) == 7 and len(calls) < 7


def test_sizeof_batch_is_deprecated_for_per_chunk() -> None:
    with pytest.warns(DeprecationWarning, match=r"sizeof=fitbatch.streaming.per_chunk\(fn\)"):
        stream = batch_stream([3, 4, 5], sizeof_batch=lambda xs: np.asarray(xs), budget=8, cost="sum")
    assert list(stream) == [[3, 4], [5]]
    with pytest.raises(TypeError, match="per_chunk takes a function"):
        fitbatch.streaming.per_chunk(3)


# ---------------------------------------------------------------------------- resume: nothing lost, nothing hangs


def _gloo(tmp_path, mode: str) -> list[dict]:
    """Both ranks of tests/streaming_scripts/equal_steps_resume_gloo.py; a hang fails (timeouts)."""
    init = tmp_path / "init"
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    script = str(SCRIPTS / "equal_steps_resume_gloo.py")
    run_processes([[sys.executable, script, mode, str(r), "2", str(init), str(outs[r])] for r in range(2)], timeout=150)
    return [json.loads(o.read_text()) for o in outs]


def test_equal_steps_resume_inside_the_last_window_keeps_ranks_together_gloo(tmp_path):
    # Saved at step 190, one step into the last (3-batch) window. Restoring used to decide "last
    # window" per rank: rank 0 refetched a 7-batch window, ran on and hung in its next collective.
    res = _gloo(tmp_path, "defect")
    for r in res:
        assert r["head"] + r["tail"] == r["full"]
        assert r["summary"]["steps"] == len(r["full"]) == 192
    assert res[0]["summary"]["dropped_batches"] > 0 and res[1]["summary"]["exhausted"]


def test_equal_steps_resume_at_every_step_boundary_gloo(tmp_path):
    # two ranks of 900 and 800 items; every boundary, inside windows and the last partial one
    res = _gloo(tmp_path, "every")
    for mode, steps in (("sync_every", 192), ("steps", 150)):
        for r in res:
            run = r[mode]
            full = run["full"]
            assert len(full) == steps and len(run["tails"]) == steps + 1
            for k, tail in enumerate(run["tails"]):
                assert full[:k] + tail == full, (mode, r["rank"], k)
                assert run["summaries"][k] == run["summary"], (mode, r["rank"], k)
    assert res[0]["sync_every"]["summary"]["collectives"] == res[1]["sync_every"]["summary"]["collectives"]


def _loader_run(n: int = 200):
    from torch.utils.data import DataLoader

    ds = StreamDataset(range(n), sizeof=lambda i: 1, budget=10, cost="sum")
    return equal_steps(DataLoader(ds, batch_size=None), sync_every=3)


def test_equal_steps_refuses_to_resume_a_source_that_cannot(caplog):
    # A DataLoader has no state: restarting it used to yield the first batches twice (24 of 20).
    run = _loader_run()
    head = [next(run) for _ in range(4)]
    assert len(head) == 4
    with caplog.at_level("WARNING", logger="fitbatch.streaming"):
        state = json.loads(json.dumps(run.state_dict()))
        run.state_dict()
    assert state["resumable"] is False and state["source"] is None
    assert caplog.text.count("loads at step 0 only") == 1  # logged once
    again = _loader_run()
    with pytest.raises(ValueError, match=r"step 4.*DataLoader.*twice.*BatchStream.*StatefulDataLoader"):
        again.load_state_dict(state)
    fresh = _loader_run()
    start = _loader_run().state_dict()  # nothing consumed yet: loads, and the run is a fresh one
    fresh.load_state_dict(start)
    assert len(list(fresh)) == 20 and fresh.summary.steps == 20
    # a state that holds a source's state cannot load into batches without load_state_dict
    stream_state = equal_steps(batch_stream(range(20), sizeof=lambda i: 1, budget=10), sync_every=3).state_dict()
    with pytest.raises(ValueError, match="holds its source's state.*DataLoader"):
        _loader_run().load_state_dict(stream_state)


def _replayable_run(n: int = 200, **kw):
    kw = kw or {"sync_every": 5}
    return equal_steps(batch_stream(Replayable(n), sizeof=lambda i: 1 + i % 5, budget=20), **kw)


def test_equal_steps_state_is_checked():
    run = _replayable_run()
    for _ in range(7):
        next(run)
    state = run.state_dict()
    assert (state["step"], state["window"], state["window_step"], state["final"]) == (7, 5, 2, False)
    before = json.dumps(state)
    cases = [
        ({"step": -1}, ValueError, "'step' must be >= 0"),
        ({"window": "5"}, TypeError, "'window' must be an int"),
        ({"final": 1}, TypeError, "'final' must be True or False"),
        ({"window": 6}, ValueError, "inconsistent equal_steps state"),
        ({"window_step": 6}, ValueError, "inconsistent equal_steps state"),
        ({"final": True}, ValueError, "inconsistent equal_steps state"),  # a full window is not the last
        ({"options": {"sync_every": 4, "steps": None}}, ValueError, "same options"),
        ({"version": 1}, ValueError, "version 1"),
    ]
    for change, kind, message in cases:
        with pytest.raises(kind, match=message):
            _replayable_run().load_state_dict({**state, **change})
    with pytest.raises(ValueError, match="same options"):
        _replayable_run(steps=30).load_state_dict(state)
    with pytest.raises(ValueError, match="fewer than the"):  # the stream's own check: a shorter source
        _replayable_run(20).load_state_dict(state)
    assert json.dumps(state) == before  # never mutated


def test_equal_steps_steps_resumes_exactly_and_counts_collectives():
    full = list(_replayable_run(steps=30))
    for k in (0, 1, 17, 30):
        run = _replayable_run(steps=30)
        head = [next(run) for _ in range(k)]
        again = _replayable_run(steps=30)
        again.load_state_dict(json.loads(json.dumps(run.state_dict())))
        assert head + list(again) == full and again.summary == run.summary.__class__(30, 0, 0, False, 0)


def test_equal_steps_a_failing_rank_stops_every_rank(monkeypatch):
    import fitbatch.streaming._parallel as P

    reduced = []
    monkeypatch.setattr(P, "_all_reduce_min", lambda value, group: reduced.append(value) or value)

    def broken():
        yield [1]
        raise OSError("shard unreadable")

    run = equal_steps(broken(), sync_every=4)
    with pytest.raises(OSError, match="shard unreadable"):
        next(run)
    assert reduced == [-1]  # this rank told the others instead of leaving them in the collective
    monkeypatch.setattr(P, "_all_reduce_min", lambda value, group: -1)  # another rank failed
    run = _replayable_run()
    with pytest.raises(RuntimeError, match="another rank's batches raised.*step 0"):
        next(run)
    with pytest.raises(StopIteration):
        next(run)


# ---------------------------------------------------------------------------- resume: the stream's own checks


def _stream(source, strategy="sequential", sizes=None, **kw):
    sizeof = (lambda i: 1 + (i * 7919) % 50) if sizes is None else sizes.__getitem__
    return batch_stream(source, sizeof=sizeof, **{"budget": 200, "strategy": strategy, "buffer_size": 64, **kw})


@pytest.mark.parametrize("strategy", ["sequential", "buckets"])
def test_stream_refuses_a_state_of_another_source(strategy):
    first = _stream(Replayable(900), strategy)
    for _ in range(20):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))
    other = _stream(range(10_001, 11_001), strategy)  # same options, another shard's items
    with pytest.raises(ValueError, match=r"other items than the state was taken over: stream item \d+ has size"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="fewer than the"):
        _stream(Replayable(10), strategy).load_state_dict(state)
    with pytest.raises(ValueError, match="other stream options"):
        _stream(Replayable(900), strategy, max_batch_size=3).load_state_dict(state)


def test_stream_state_values_are_checked():
    first = _stream(Replayable(900), "buckets")
    for _ in range(20):
        next(first)
    state = first.state_dict()
    read = state["read"]
    cases = [
        ({"read": -1}, ValueError, "'read' must be >= 0"),
        ({"read": "5"}, TypeError, "'read' must be an int"),
        ({"emitted": True}, TypeError, "'emitted' must be an int"),
        ({"real": float("nan")}, ValueError, "'real' must be finite"),
        ({"pending": [[5, 2], [6, 1]]}, ValueError, "non-overlapping"),
        ({"pending": [[5, 0]]}, ValueError, "non-empty"),
        ({"pending": [5, 2]}, TypeError, "runs"),
        ({"pending": [[read, 1]]}, ValueError, "inconsistent stream state"),
        ({"emitted": read}, ValueError, "inconsistent stream state"),
        ({"skipped_positions": [1, 2]}, ValueError, "inconsistent stream state"),
        ({"integral": "yes"}, TypeError, "'integral' must be True or False"),
        ({"buckets": {"tops": None}}, ValueError, "keys"),
        ({"buckets": {"tops": [1, "x"], "next_fit": None}}, TypeError, "edge"),
        ({"last_size": -2.0}, ValueError, "'last_size'"),
    ]
    for change, kind, message in cases:
        with pytest.raises(kind, match=message):
            _stream(Replayable(900), "buckets").load_state_dict({**state, **change})
    seq = _stream(Replayable(900)).state_dict()
    with pytest.raises(ValueError, match="'buckets' key"):
        _stream(Replayable(900)).load_state_dict({**seq, "buckets": {"tops": None, "next_fit": None}})


@pytest.mark.parametrize(
    ("strategy", "sizes"),
    [
        ("sequential", [0.5] + [30.0] * 20 + [20.0] * 30),
        ("buckets", [0.5] + [30.0] * 20 + [20.0] * 30),
        # given buckets: the fraction lowers the counts of the 20- and 30-buckets while they hold items
        (fitbatch.Buckets(boundaries=(10.0, 20.0, 30.0)), [30.0, 20.0, 10.0, 30.0, 30.0, 20.0, 2.5, 30.0]),
    ],
)
def test_resume_keeps_the_lowered_budget_of_fractional_sizes(strategy, sizes):
    # A fractional size lowers the planning budget for the rest of the stream (as the indexed
    # planner does). A restore that measured only the pending items forgot it and cut a batch
    # that fits the budget exactly otherwise; buckets whose counts it lowered emitted their
    # items later than a restored stream, which places everything it holds at once.
    kw = {"cost": "padded", "budget": 60, "buffer_size": 8}
    full = list(_stream(Replayable(len(sizes)), strategy, sizes, **kw))
    for k in range(len(full) + 1):
        first = _stream(Replayable(len(sizes)), strategy, sizes, **kw)
        head = [next(first) for _ in range(k)]
        again = _stream(Replayable(len(sizes)), strategy, sizes, **kw)
        again.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert head + list(again) == full, k


def test_sizeof_returning_a_bool_is_refused():
    with pytest.raises(TypeError, match=r"sizeof returned the bool True for stream item 0; sizes must be numbers"):
        list(batch_stream(["a", "b"], sizeof=lambda x: x == "a", budget=4))
    with pytest.raises(TypeError, match=r"sizeof returned the bool False for stream item 3"):
        list(batch_stream([5, 7, 1, 0], sizeof=lambda x: x if x else False, budget=40))
    with pytest.raises(TypeError, match=r"stream item 2"):
        list(batch_stream([5, 7, 1], sizeof=lambda x: np.bool_(True) if x == 1 else x, budget=40))
    with pytest.raises(TypeError, match=r"sizeof_batch failed on the chunk of stream items 0..1.*booleans"):
        list(batch_stream(["a", "b"], sizeof_batch=lambda xs: np.array([True, False]), budget=4))
    # sizes 0 and 1 that are numbers are fine
    assert list(batch_stream([0, 1, 1], sizeof=int, budget=2, cost="sum")) == [[0, 1, 1]]


def test_stream_sizes_above_2_53_are_refused_naming_the_item() -> None:
    sizes = [5, 2**53 + 2, 1]
    with pytest.raises(ValueError, match=r"at most 2\*\*53.*stream item 1 \(size 9007199254740994"):
        list(batch_stream(range(3), sizeof=lambda i: sizes[i], budget=2**54, cost="sum"))
    assert list(batch_stream(range(3), sizeof=lambda i: [5, 2**53, 1][i], budget=2**54, cost="sum")) == [[0, 1, 2]]


@pytest.mark.parametrize("sizes, budget", [
    ([2.5, 27.002, 27.003, 27.003, 27.003], 66),  # fractional: sort keys fitted to the set
    ([28_000_000, 400_000, 28_000_000], 56_000_717),  # whole numbers past the 16-bit keys
    ([29.002, 29.001, 29.002, 2.5], 43),
])
def test_a_bucket_stream_restored_after_its_source_ended_yields_the_rest(sizes, budget):
    """The final flush is planned exactly sorted (ties by position) and cut from the largest:
    the items a restore re-plans are a prefix of that order and cut the same way (keys
    fitted to the whole held set and to the rest differed)."""
    kw = dict(sizeof=lambda i: sizes[i], budget=budget, cost="padded", strategy="buckets")
    full = list(fitbatch.batch_stream(range(len(sizes)), **kw))
    for k in range(1, len(full)):
        s = fitbatch.batch_stream(range(len(sizes)), **kw)
        head = [next(s) for _ in range(k)]
        state = json.loads(json.dumps(s.state_dict()))
        r = fitbatch.batch_stream(range(len(sizes)), **kw)
        r.load_state_dict(state)
        assert head + list(r) == full, (k, state["done"])
    assert sorted(i for b in full for i in b) == list(range(len(sizes)))


def test_a_source_that_raises_part_way_through_a_chunk_loses_nothing():
    """The items read before the error stay for the next call (they were dropped uncounted)."""

    class Flaky:
        def __init__(self):
            self.i, self.failed = 0, False

        def __iter__(self):
            return self

        def __next__(self):
            if self.i == 5 and not self.failed:
                self.failed = True
                raise ConnectionError("transient")
            if self.i >= 10:
                raise StopIteration
            self.i += 1
            return self.i - 1

    def broken():
        yield from range(5)
        raise ConnectionError("broken shard")

    for source, n in ((Flaky(), 10), (broken(), 5)):
        stream = fitbatch.batch_stream(source, sizeof=lambda x: 1, budget=3, cost="sum")
        out = []
        with pytest.raises(ConnectionError):
            out.extend(stream)
        out.extend(stream)  # goes on after the error
        assert sorted(i for b in out for i in b) == list(range(n))
        assert stream.summary.items_read == stream.summary.items_emitted == n


def test_sizeof_must_return_numbers_as_plan_batches_asks():
    with pytest.raises(TypeError, match=r"sizeof returned str '3' for stream item 0"):
        list(fitbatch.batch_stream(range(4), sizeof=lambda x: "3", budget=10))
    from fitbatch.streaming import per_chunk

    for bad in (["3"] * 4, [3 + 5j] * 4):
        with pytest.raises(TypeError, match="return numbers"):
            list(fitbatch.batch_stream(range(4), sizeof=per_chunk(lambda xs, b=bad: np.array(b[: len(xs)])), budget=10))


def test_sizeof_is_asked_once_per_item():
    """A sizeof may log or count (bionemo's warns on each oversized item): the type check looks
    at the first value it returned instead of asking again."""
    calls = []

    def sizeof(x):
        calls.append(x)
        return 2 + x % 5

    batches = list(fitbatch.batch_stream(range(1000), sizeof=sizeof, budget=20, cost="sum", buffer_size=64))
    assert sorted(calls) == list(range(1000)) and sum(map(len, batches)) == 1000


def test_an_evicted_bucket_is_filled_with_the_largest_items_below_within_the_floor():
    # bucket (18, 20] holds 15 items (count 50) when the buffer of 16 overflows: it is evicted
    # short of its count and takes the held 18 from the bucket below (>= 0.9 x 20), not the 17
    sizes = [20] * 12 + [19] * 3 + [18, 17, 18, 5]
    stream = batch_stream(
        range(len(sizes)), sizeof=sizes.__getitem__, budget=1000,
        strategy=fitbatch.Buckets(boundaries=[18.0, 20.0]), buffer_size=16,
    )
    batches = list(stream)
    assert batches == [list(range(16)), [18, 16, 17]]  # the flush: smallest first
    assert sorted(i for b in batches for i in b) == list(range(len(sizes)))
