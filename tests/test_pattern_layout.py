"""An epoch of histogram patterns laid out (``fitbatch._kernels.pattern_layout``): every sample
once, every batch its pattern's lengths (so within the budget and the cap), as many batches as
the patterns take, a drawn order keyed by the generators, and the compiled loops' plan equal to
numpy's (the shuffles are numpy's ``Generator.shuffle``, draw for draw)."""

from __future__ import annotations

import numpy as np
import pytest
from contracts import check_plan
from contracts import jit_mode as jit
from hypothesis import given
from hypothesis import strategies as st

import fitbatch
from fitbatch._kernels import histogram
from fitbatch._kernels import packing_depth as PD
from fitbatch._kernels import pattern_layout as L


def _loops():  # noqa: ANN202 - the compiled module, or a skip
    pytest.importorskip("numba", reason="the fast extra (numba) is not installed")
    with jit("1"):
        loops = L._loops(0)
    assert loops is not None
    return loops


def _drawn(sizes: np.ndarray, counts: np.ndarray, patterns: list[PD.Pattern], seed: int | None) -> L.Layout:
    if seed is None:
        return L.lay_out_drawn(sizes, counts, patterns, None, None)
    return L.lay_out_drawn(sizes, counts, patterns, np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2]))


def _same(a: L.Layout, b: L.Layout) -> bool:
    arrays = ("order", "offsets", "kind", "count", "longest", "total")
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in arrays) and a.tail == b.tail


@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=400),
    budget=st.integers(40, 64),
    cap=st.one_of(st.none(), st.integers(1, 6)),
    seed=st.one_of(st.none(), st.integers(0, 5)),
)
def test_every_sample_once_each_batch_its_pattern_within_budget_and_cap(lengths, budget, cap, seed):
    sizes = np.asarray(lengths, dtype=np.int64)
    counts = np.bincount(sizes, minlength=budget + 1)
    patterns = PD.best_patterns(counts, budget, cap)
    out = _drawn(sizes, counts, patterns, seed)
    assert np.array_equal(np.sort(out.order), np.arange(sizes.size))
    assert out.offsets[0] == 0 and out.offsets[-1] == sizes.size
    assert out.offsets.size - 1 == PD._batches(patterns)  # the patterns' batches, no more
    for b, k in enumerate(out.kind.tolist()):
        held = sizes[out.order[out.offsets[b] : out.offsets[b + 1]]]
        assert tuple(sorted(held.tolist(), reverse=True)) == patterns[k][1]
        assert held.sum() == out.total[k] <= budget and held.max() == out.longest[k] and held.size == out.count[k]
        assert cap is None or held.size <= cap
    assert np.array_equal(np.bincount(out.kind, minlength=len(patterns)), [t for t, _ in patterns])
    # the tail is the last pattern's last batch
    assert out.kind[out.tail] == len(patterns) - 1
    assert not np.any(out.kind[out.tail + 1 :] == len(patterns) - 1)


@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=600),
    cap=st.one_of(st.none(), st.integers(2, 5)),
    seed=st.one_of(st.none(), st.integers(0, 5)),
)
def test_compiled_loops_lay_out_the_same_plan_as_numpy(lengths, cap, seed):
    _loops()
    sizes = np.asarray(lengths, dtype=np.int64)
    counts = np.bincount(sizes, minlength=33)
    patterns = PD.best_patterns(counts, 32, cap)
    with jit("0"):
        plain = _drawn(sizes, counts, patterns, seed)
    with jit("1"):
        compiled = _drawn(sizes, counts, patterns, seed)
    assert _same(plain, compiled)


def test_without_generators_the_batches_are_in_pattern_order_and_index_order():
    sizes = np.array([5, 1, 3, 5, 2, 1, 5, 1])
    counts = np.bincount(sizes)
    out = L.lay_out_drawn(sizes, counts, [(3, (5, 1)), (1, (3, 2))], None, None)
    assert out.kind.tolist() == [0, 0, 0, 1]
    assert [out.order[a:b].tolist() for a, b in zip(out.offsets[:-1], out.offsets[1:])] == [[0, 1], [3, 5], [6, 7], [2, 4]]


def _pcg64(state: int, inc: int) -> np.random.Generator:
    bit_generator = np.random.PCG64()
    bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0, "uinteger": 0}
    return np.random.Generator(bit_generator)


@given(
    blocks=st.lists(st.integers(0, 40_000), min_size=1, max_size=6),
    state=st.one_of(st.integers(0, 2**128 - 1), st.sampled_from([0, 2**64 - 1, 2**64, 2**128 - 1])),
    inc=st.one_of(st.integers(0, 2**127 - 1), st.sampled_from([0, 2**63 - 1, 2**63, 2**127 - 1])),
    dtype=st.sampled_from([np.int32, np.int64, np.uint16]),
    primed=st.integers(0, 3),
)
def test_the_compiled_shuffle_is_numpys_shuffle_draw_for_draw(blocks, state, inc, dtype, primed):
    """Same swaps from the same draws (numpy's PCG64 run in the loop, from any state: the 128-bit
    arithmetic's carries), and the generator left where numpy's shuffle leaves it."""
    loops = _loops()
    bounds = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
    theirs = np.arange(bounds[-1]).astype(dtype)
    mine = theirs.copy()
    rng, ours = _pcg64(state, 2 * inc + 1), _pcg64(state, 2 * inc + 1)
    for g in (rng, ours):  # 32-bit draws before: numpy may hold a half for its next one
        g.integers(0, 1000, size=primed, dtype=np.uint32)
    for a, b in zip(bounds[:-1], bounds[1:]):
        rng.shuffle(theirs[a:b])
    L._compiled_shuffle(mine, bounds, ours, loops)
    assert np.array_equal(mine, theirs)
    assert ours.bit_generator.state == rng.bit_generator.state
    assert ours.integers(0, 1 << 30, 5).tolist() == rng.integers(0, 1 << 30, 5).tolist()
    assert L._same_shuffle(loops)


def test_the_compiled_shuffle_refuses_another_bit_generator():
    with pytest.raises(ValueError, match="PCG64DXSM"):
        L._compiled_shuffle(np.arange(5), np.array([0, 5]), np.random.Generator(np.random.PCG64DXSM(0)), _loops())


@given(level=st.lists(st.integers(0, 20), max_size=500))
def test_grouped_is_the_stable_sort_by_descending_level_either_way(level):
    loops = _loops()
    level = np.asarray(level, dtype=np.uint16)
    counts = np.bincount(level, minlength=21)
    expected = np.argsort(20 - level.astype(np.int64), kind="stable")
    assert np.array_equal(L._grouped(level, counts, 20, None), expected)
    assert np.array_equal(L._grouped(level, counts, 20, loops), expected)


@given(level=st.lists(st.integers(0, 2**16 - 1), max_size=300), levels=st.sampled_from([1, 7, 2**16, 70_000]))
def test_level_counts_are_bincount(level, levels):
    _loops()
    level = np.asarray(level, dtype=np.uint16)
    with jit("1"):
        got = histogram.level_counts(level, levels)
    expected = np.bincount(level, minlength=levels)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_plans_on_the_patterns_are_keyed_by_seed_and_epoch_and_random_within_lengths():
    # 80,000 token counts: the uncapped histogram path (the quick patterns near the bound)
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 200, 80_000).astype(np.float64)
    counts = np.bincount(sizes.astype(np.int64), minlength=513)
    patterns = PD.quick_patterns(counts, 512)
    plan = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", seed=4, epoch=2)
    check_plan(plan, sizes, 512, fitbatch.SumCost())
    assert len(plan) == PD._batches(patterns)
    assert plan.costs.tolist() == [float(sizes[b].sum()) for b in plan]
    assert plan.counts.tolist() == [b.size for b in plan]
    assert plan.to_lists() == fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", seed=4, epoch=2).to_lists()
    other = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", seed=4, epoch=3)
    assert len(other) == len(plan) and sorted(other.costs) == sorted(plan.costs)
    # the batch order is drawn: the sequence of batch sizes differs, not only the samples in them
    assert other.counts.tolist() != plan.counts.tolist()
    # a length's samples come in a drawn order: where the first ones of the commonest length land
    common = int(np.argmax(counts))
    first = [int(i) for i in plan.order if sizes[i] == common][:50]
    assert first != sorted(first)
    with jit("0"):
        plain = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", seed=4, epoch=2)
    assert plain.to_lists() == plan.to_lists()


def test_drop_last_drops_at_most_the_last_patterns_last_batch():
    rng = np.random.default_rng(8)
    sizes = np.concatenate([np.full(70_000, 256.0), rng.integers(1, 50, 10).astype(np.float64)])
    plan = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", drop_last=True, seed=1)
    check_plan(plan, sizes, 512, fitbatch.SumCost())
    assert plan.dropped_batches <= 1
    assert plan.dropped.size + plan.order.size == sizes.size


@given(
    kind=st.lists(st.integers(0, 9), max_size=200),
    fields=st.integers(1, 3),
    seed=st.integers(0, 3),
)
def test_per_batch_gathers_each_batchs_kind_either_way(kind, fields, seed):
    _loops()
    kind = np.asarray(kind, dtype=np.uint16)
    rng = np.random.default_rng(seed)
    values = rng.random((fields, 10))
    with jit("0"):
        plain = L.per_batch(kind, values)
    with jit("1"):
        compiled = L.per_batch(kind, values)
    for got in (plain, compiled):
        assert np.array_equal(got, values[:, kind]) and got.dtype == np.float64


@pytest.mark.parametrize("seed", range(6))
def test_the_sequence_drawn_in_pieces_holds_every_batch_once_either_way(seed):
    _loops()
    times = np.random.default_rng(seed).integers(0, 40, 9)
    before = L.PIECE
    L.PIECE = 7  # many pieces, a short last one
    try:
        with jit("0"):
            plain = L._sequence(times, np.random.default_rng(seed), L._loops(0))
        with jit("1"):
            compiled = L._sequence(times, np.random.default_rng(seed), L._loops(0))
    finally:
        L.PIECE = before
    assert np.array_equal(plain, compiled)
    assert np.array_equal(np.bincount(plain, minlength=9), times)
    assert plain.tolist() != sorted(plain.tolist()) or times.sum() <= 1


def test_a_histogram_plan_measures_when_read_and_pickles_before_and_after():
    """The counts and padded units are made on first read (from the offsets and the batches'
    patterns): the same as measured from the samples, and a plan pickles whether made or not."""
    import pickle

    sizes = np.clip(np.ceil(np.random.default_rng(4).lognormal(4.0, 0.9, 200_000)), 1, 256).astype(np.int64)
    plan = fitbatch.plan_batches(sizes, 256, cost="sum", strategy="packed", seed=2)
    assert len(plan) == plan.offsets.size - 1 and plan.n_samples == sizes.size
    again = pickle.loads(pickle.dumps(plan))
    lengths = [sizes[b] for b in plan]
    assert plan.counts.tolist() == [b.size for b in lengths]
    assert plan.padded_units.tolist() == [float(b.size * b.max()) for b in lengths]
    assert plan.costs.tolist() == plan.real_units.tolist() == [float(b.sum()) for b in lengths]
    for copy in (again, pickle.loads(pickle.dumps(plan))):
        assert np.array_equal(copy.padded_units, plan.padded_units) and np.array_equal(copy.counts, plan.counts)
        assert np.array_equal(copy.order, plan.order) and copy.stats() == plan.stats()
