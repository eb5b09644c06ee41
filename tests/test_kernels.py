"""The planning kernels against the slow oracle in reference.py (STYLE 14).

Sizes are built by numpy from a few hypothesis-drawn parameters (n, seed, kind) so that large
inputs (n up to ~3000, which exercises the lock-step chunking and seam repair) stay fast and a
failure still shrinks to a small (n, seed). Float sizes are multiples of 1/8 where results are
compared exactly: their sums are exact, so the prefix sums of the kernels and the running sums
of the oracle agree to the bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference as R
from contracts import COSTS
from hypothesis import given
from hypothesis import strategies as st

from fitbatch._kernels import batches as K
from fitbatch._kernels import greedy as G
from fitbatch._kernels import sorting as SK
from fitbatch._kernels.packing import first_fit_starts

KINDS = ("int", "dyadic", "equal", "zeros", "dup", "2d")
ns = st.one_of(st.integers(0, 80), st.sampled_from([63, 64, 65, 127, 129, 640, 1000, 2500, 3000]))


@pytest.fixture(autouse=True)
def numpy_kernels(monkeypatch):
    """The numpy forms under test: once numba is loaded (by an earlier test module, or past
    ``LOAD_AT`` samples) the built-in costs would run the compiled loops, which test_jit.py
    compares with these."""
    monkeypatch.setenv("FITBATCH_JIT", "0")


def make_sizes(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "int":
        return rng.integers(0, 30, n).astype(np.float64)
    if kind == "dyadic":
        return rng.integers(0, 240, n) / 8.0
    if kind == "equal":
        return np.full(n, float(rng.integers(1, 6)))
    if kind == "zeros":
        return np.where(rng.random(n) < 0.6, 0.0, rng.integers(1, 20, n).astype(np.float64))
    if kind == "dup":
        return rng.choice(np.array([1.0, 7.0, 7.5, 20.0]), n)
    return rng.integers(0, 6, (n, 2)).astype(np.float64)


def ref_carry(carry: K.OpenBatch | None, two_d: bool):
    if carry is None:
        return None
    conv = (lambda a: tuple(float(x) for x in np.asarray(a))) if two_d else float
    return (carry.count, conv(carry.max_size), conv(carry.sum_size))


@given(
    kind=st.sampled_from(KINDS),
    n=ns,
    seed=st.integers(0, 2**16),
    cost=st.sampled_from(sorted(COSTS)),
    budget=st.sampled_from([1.0, 7.0, 13.5, 40.0, 100.0, 1000.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
    multiple=st.sampled_from([1, 1, 2, 3, 4]),
    force_rate=st.sampled_from([0.0, 0.02, 0.3]),
)
def test_greedy_starts_matches_reference(kind, n, seed, cost, budget, cap, multiple, force_rate):
    sizes = make_sizes(kind, n, seed)
    model = COSTS[cost]
    force = None
    if force_rate:
        force = np.random.default_rng(seed + 1).random(n) < force_rate
    got, open_batch = K.greedy_starts(sizes, budget, model, cap=cap, multiple=multiple, force=force)
    forced = [] if force is None else np.flatnonzero(force).tolist()
    want, want_open = R.greedy_starts(
        R.as_python(sizes), budget, R.model_cost(model), cap=cap, forced=forced, multiple=multiple
    )
    assert got.dtype == np.int64
    assert got.tolist() == want
    assert open_batch.count == want_open[0]
    if n:
        assert got[0] == 0
        last = sizes[got[-1] :]
        np.testing.assert_array_equal(open_batch.max_size, last.max(axis=0))
        np.testing.assert_array_equal(open_batch.sum_size, last.sum(axis=0))


@given(
    kind=st.sampled_from(KINDS),
    n=ns,
    seed=st.integers(0, 2**16),
    cost=st.sampled_from(sorted(COSTS)),
    budget=st.sampled_from([7.0, 13.5, 40.0, 100.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
    multiple=st.sampled_from([1, 2, 3]),
    carried=st.integers(0, 4),
)
def test_greedy_starts_with_carry_matches_reference(kind, n, seed, cost, budget, cap, multiple, carried):
    sizes = make_sizes(kind, n, seed)
    model = COSTS[cost]
    before = make_sizes(kind, carried, seed + 7)
    if carried:
        carry = K.OpenBatch(carried, before.max(axis=0), before.sum(axis=0))
    else:
        carry = G._empty_state(sizes)
    got, open_batch = K.greedy_starts(sizes, budget, model, cap=cap, multiple=multiple, carry=carry)
    want, want_open = R.greedy_starts(
        R.as_python(sizes), budget, R.model_cost(model), cap=cap, multiple=multiple,
        carry=ref_carry(carry, sizes.ndim == 2),
    )
    assert got.tolist() == want
    assert open_batch.count == want_open[0]


@given(
    kind=st.sampled_from(("int", "dyadic", "equal", "2d")),
    n=ns,
    seed=st.integers(0, 2**16),
    cost=st.sampled_from(sorted(COSTS)),
    budget=st.sampled_from([7.0, 40.0, 100.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
    cut=st.floats(0, 1),
)
def test_greedy_starts_in_two_calls_equals_one(kind, n, seed, cost, budget, cap, cut):
    """Streaming: planning a prefix, then the rest with the open batch carried, is one plan."""
    sizes = make_sizes(kind, n, seed)
    model = COSTS[cost]
    k = int(cut * n)
    whole, whole_open = K.greedy_starts(sizes, budget, model, cap=cap)
    first, carry = K.greedy_starts(sizes[:k], budget, model, cap=cap)
    second, last_open = K.greedy_starts(sizes[k:], budget, model, cap=cap, carry=carry)
    assert np.concatenate([first, k + second]).tolist() == whole.tolist()
    assert last_open.count == whole_open.count


@given(
    n=st.sampled_from([300, 2000, 5000]),
    long_share=st.floats(0, 1),
    seed=st.integers(0, 2**16),
    cost=st.sampled_from(sorted(COSTS)),
    carried=st.integers(0, 3),
    force_rate=st.sampled_from([0.0, 0.001]),
)
def test_greedy_starts_walks_long_batches_then_chunks_short_ones(n, long_share, seed, cost, carried, force_rate):
    """Mostly long batches (sizes 0-1) are few, so they are walked a batch at a time; the short
    ones after them (sizes 20-40) outnumber what the walk expected, and it hands the rest, at a
    batch start, to the chunked scan (with fewer long batches all goes to the chunks): the
    reference's starts and open batch every way, the carried batch and forced starts included."""
    rng = np.random.default_rng(seed)
    k = int(long_share * n)
    sizes = np.concatenate([rng.integers(0, 2, k), rng.integers(20, 41, n - k)]).astype(np.float64)
    model = COSTS[cost]
    force = rng.random(n) < force_rate if force_rate else None
    before = rng.integers(0, 2, carried).astype(np.float64)
    carry = K.OpenBatch(carried, before.max(initial=0.0), before.sum()) if carried else None
    got, open_batch = K.greedy_starts(sizes, 400.0, model, force=force, carry=carry)
    forced = [] if force is None else np.flatnonzero(force).tolist()
    want, want_open = R.greedy_starts(
        R.as_python(sizes), 400.0, R.model_cost(model), forced=forced, carry=ref_carry(carry, False)
    )
    assert got.tolist() == want
    assert open_batch.count == want_open[0]
    assert float(open_batch.sum_size) == want_open[2]


@given(
    n=st.sampled_from([1, 2, 65, 300, 2000]),
    run_share=st.floats(0, 0.5),
    seed=st.integers(0, 2**16),
    cost=st.sampled_from(["padded", "polynomial"]),
    cap=st.one_of(st.none(), st.integers(1, 600)),
    force_rate=st.sampled_from([0.0, 0.01]),
    carried=st.integers(0, 3),
    block=st.sampled_from([1, 7, 1 << 16]),
    levels=st.one_of(st.none(), st.integers(1, 9)),
)
def test_chain_of_lifted_batch_ends_is_the_greedy(n, run_share, seed, cost, cap, force_rate, carried, block, levels):
    """A cost of count and padded length: every start's batch end by binary lifting over 1-9
    window widths (or as many as the sizes call for), in blocks of 1, 7 or 2**16 starts,
    chained from the first batch. Runs of sizes 0-1 among sizes 20-40 make batches longer
    than the lifted windows reach (walked where the chain meets them); count caps, forced
    starts and a carried batch cut the rest. The reference's starts and open batch every way."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(20, 41, n).astype(np.float64)
    for at in rng.choice(n, size=int(run_share * 8) + 1):
        sizes[at : at + int(rng.integers(1, 300))] = rng.integers(0, 2)
    force = rng.random(n) < force_rate if force_rate else None
    before = rng.integers(0, 2, carried).astype(np.float64)
    carry = K.OpenBatch(carried, before.max(initial=0.0), before.sum()) if carried else G._empty_state(sizes)
    model = COSTS[cost]
    if levels is None:
        levels = G._lift_levels(model.sample_cost(sizes), 400.0)
    g = G._Greedy(sizes, 400.0, model, math.inf if cap is None else float(cap), force)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(G, "LIFT_BLOCK", block)
        got, open_batch = G._chain_starts(g, carry, levels)
    forced = [] if force is None else np.flatnonzero(force).tolist()
    want, want_open = R.greedy_starts(
        R.as_python(sizes), 400.0, R.model_cost(model), cap=cap, forced=forced,
        carry=ref_carry(carry if carried else None, False),
    )
    assert got.tolist() == want
    assert (open_batch.count, float(open_batch.max_size), float(open_batch.sum_size)) == want_open


@pytest.mark.parametrize("n", [64 * 7 + 3, 1000, 2500, 4099])
@pytest.mark.parametrize("budget", [3.0, 5.0, 7.0, 13.0])
@pytest.mark.parametrize("cost", ["sum", "padded"])
def test_greedy_starts_chunks_that_never_resynchronise(n, budget, cost):
    """All-equal sizes with a budget that does not divide the chunk: every chunk's local chain
    is out of phase with the true one, so the seam repair must walk every chunk to its end."""
    sizes = np.ones(n)
    chunk = min(4096, max(64, math.isqrt(n)))
    assert chunk % int(budget) != 0
    got, _ = K.greedy_starts(sizes, budget, COSTS[cost])
    assert got.tolist() == list(range(0, n, int(budget)))


def test_greedy_starts_lone_oversized_and_zero_sizes():
    sizes = np.array([0.0, 0.0, 50.0, 0.0, 3.0, 9.0, 0.0, 0.0])
    got, _ = K.greedy_starts(sizes, 10.0, COSTS["sum"])
    assert got.tolist() == [0, 2, 3, 5]  # the oversized 50 is a batch of its own
    got, _ = K.greedy_starts(sizes, 10.0, COSTS["padded"])
    assert got.tolist() == [0, 2, 3, 5, 6]  # 9 pads the zeros after it: 2 x 9 > 10


def test_greedy_starts_multiple_cut_rules():
    ones = np.ones(10)
    # budget 7 closes batches at 7 samples; cut back to 6, the 7th starts the next batch
    got, _ = K.greedy_starts(ones, 7.0, COSTS["sum"], multiple=3)
    assert got.tolist() == [0, 6]
    # a forced start ends a batch without a cut
    force = np.zeros(10, dtype=bool)
    force[5] = True
    got, _ = K.greedy_starts(ones, 7.0, COSTS["sum"], multiple=3, force=force)
    assert got.tolist() == [0, 5]
    # the last batch is never cut
    got, _ = K.greedy_starts(ones[:5], 7.0, COSTS["sum"], multiple=3)
    assert got.tolist() == [0]
    # a carried batch that is already a multiple closes at position 0
    carry = K.OpenBatch(3, np.float64(1.0), np.float64(3.0))
    got, open_batch = K.greedy_starts(ones[:6], 5.0, COSTS["sum"], multiple=3, carry=carry)
    assert got.tolist() == [0, 3]
    assert open_batch.count == 3


# --------------------------------------------------------------------------- descending


def descending_case(kind: str, n: int, seed: int, n_segments: int):
    """Sizes non-increasing within random segments, with exact levels (edges[level] == size)."""
    sizes = make_sizes(kind, n, seed)
    rng = np.random.default_rng(seed + 3)
    cuts = rng.integers(1, max(n, 2), n_segments - 1) if n else np.zeros(0, np.int64)
    seg = np.unique(np.concatenate([[0], cuts])).astype(np.int64) if n else np.zeros(0, np.int64)
    for a, b in zip(seg.tolist(), seg[1:].tolist() + [n], strict=False):  # n == 0: no segment
        sizes[a:b] = np.sort(sizes[a:b])[::-1]
    edges = np.unique(sizes) if n else np.zeros(1)
    level = np.searchsorted(edges, sizes).astype(np.int64)
    return sizes, seg, level, edges


@given(
    kind=st.sampled_from(("int", "dyadic", "equal", "zeros", "dup")),
    n=ns,
    seed=st.integers(0, 2**16),
    n_segments=st.integers(1, 6),
    cost=st.sampled_from(sorted(COSTS)),
    budget=st.sampled_from([1.0, 7.0, 13.5, 40.0, 100.0, 1000.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
    multiple=st.sampled_from([1, 1, 2, 3, 4]),
)
def test_descending_starts_matches_reference(kind, n, seed, n_segments, cost, budget, cap, multiple):
    sizes, seg, level, edges = descending_case(kind, n, seed, n_segments)
    model = COSTS[cost]
    got = K.descending_starts(level, edges, sizes, seg, budget, model, cap=cap, multiple=multiple)
    want, _ = R.greedy_starts(
        R.as_python(sizes), budget, R.model_cost(model), cap=cap, forced=seg.tolist(), multiple=multiple
    )
    assert got.dtype == np.int64
    assert got.tolist() == want


@given(
    n=ns,
    seed=st.integers(0, 2**16),
    n_segments=st.integers(1, 4),
    cost=st.sampled_from(sorted(COSTS)),
    budget=st.sampled_from([7.0, 40.0, 100.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
)
def test_descending_starts_with_size_keys(n, seed, n_segments, cost, budget, cap):
    """Continuous sizes binned by size_keys: the planning max of a batch is the edge of its
    first sample's key. Batches fit with the true sizes and are maximal for the planning max."""
    rng = np.random.default_rng(seed)
    values = rng.random(n) * 20.0 + rng.integers(0, 2, n) * 0.001
    keys, edges = SK.size_keys(values, integral=False)
    seg = np.arange(0, n, max(1, -(-n // n_segments)), dtype=np.int64)
    order = np.arange(n, dtype=np.int64)
    down = np.uint16(SK.KEY_LEVELS - 1) - keys
    if n:
        order = SK.sort_within_segments(down, max(1, -(-n // n_segments)))
    sizes, level = values[order], keys[order]
    model = COSTS[cost]
    starts = K.descending_starts(level, edges, sizes, seg, budget, model, cap=cap)
    cost_fn = R.model_cost(model)
    bounds = starts.tolist() + [n]
    seg_set = set(seg.tolist()) | {n}
    assert set(seg.tolist()) <= set(starts.tolist())
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        true = cost_fn(b - a, float(sizes[a:b].max()), float(sizes[a:b].sum()))
        planned_max = float(edges[level[a]])
        assert planned_max >= float(sizes[a:b].max())
        if b - a > 1:
            assert true <= budget * (1 + 1e-12)
            assert cap is None or b - a <= cap
        if b not in seg_set:  # maximal: one more sample would not fit the planning max
            more = cost_fn(b - a + 1, planned_max, float(sizes[a : b + 1].sum()))
            assert more > budget * (1 - 1e-12) or (cap is not None and b - a + 1 > cap)


# --------------------------------------------------------------------------- two-ended packing


@given(
    kind=st.sampled_from(("int", "dyadic", "equal", "zeros", "dup")),
    n=ns,
    seed=st.integers(0, 2**16),
    n_segments=st.integers(1, 5),
    budget=st.sampled_from([1.0, 7.0, 13.5, 40.0, 100.0, 1000.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
)
def test_first_fit_starts_matches_reference(kind, n, seed, n_segments, budget, cap):
    sizes, seg, _, _ = descending_case(kind, n, seed, n_segments)
    order, starts = first_fit_starts(sizes, seg, budget, cap)
    got = R.batches_from_starts(order.tolist(), starts.tolist())
    assert got == R.first_fit_batches(R.as_python(sizes), seg.tolist(), budget, cap)
    check_first_fit(sizes, seg, budget, cap, order, starts, slack=0.0)


@given(n=ns, seed=st.integers(0, 2**16), n_segments=st.integers(1, 5), budget=st.sampled_from([5.0, 17.0, 60.0]),
       cap=st.one_of(st.none(), st.integers(1, 9)))
def test_first_fit_starts_valid_for_any_floats(n, seed, n_segments, budget, cap):
    rng = np.random.default_rng(seed)
    sizes = np.round(rng.random(n) * 10, 2)
    seg = np.arange(0, n, max(1, -(-n // n_segments)), dtype=np.int64)
    for a, b in zip(seg.tolist(), seg[1:].tolist() + [n], strict=False):  # n == 0: no segment
        sizes[a:b] = np.sort(sizes[a:b])[::-1]
    order, starts = first_fit_starts(sizes, seg, budget, cap)
    check_first_fit(sizes, seg, budget, cap, order, starts, slack=1e-12 * budget)


def check_first_fit(sizes, seg, budget, cap, order, starts, slack):
    n = sizes.size
    assert sorted(order.tolist()) == list(range(n)), "every position exactly once"
    bounds = starts.tolist() + [n]
    seg_of = np.searchsorted(seg, np.arange(n), side="right") - 1 if n else np.zeros(0, np.int64)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        batch = order[a:b]
        assert b > a
        assert len(set(seg_of[batch].tolist())) == 1, "a batch never mixes segments"
        assert cap is None or b - a <= cap
        if b - a > 1:
            assert float(sizes[batch].sum()) <= budget + slack
        # placed in order: the head is the batch's first position, the rest follow it
        assert batch.tolist() == sorted(batch.tolist())


def test_first_fit_fills_room_with_the_largest_that_fits():
    sizes = np.array([9.0, 8.0, 6.0, 5.0, 3.0, 2.0, 1.0, 1.0])
    order, starts = first_fit_starts(sizes, np.zeros(1, np.int64), 10.0)
    assert R.batches_from_starts(order.tolist(), starts.tolist()) == [[0, 6], [1, 5], [2, 4, 7], [3]]


def test_first_fit_reaches_the_bound_where_largest_then_smallest_did_not():
    """6 + 4, 5 + 5 and 4 + 3 + 3 in batches of 10: the bound, ceil(30 / 10) = 3. Taking the
    largest samples and then the smallest (the walk before first fit) made 6 + 3, 5 + 5, 4 + 4
    and 3: four batches."""
    sizes = np.array([6.0, 5, 5, 4, 4, 3, 3])
    order, starts = first_fit_starts(sizes, np.zeros(1, np.int64), 10.0)
    assert R.batches_from_starts(order.tolist(), starts.tolist()) == [[0, 3], [1, 2], [4, 5, 6]]


def test_first_fit_gives_an_oversized_sample_a_batch_of_its_own():
    order, starts = first_fit_starts(np.array([12.0, 5.0, 5.0]), np.zeros(1, np.int64), 10.0)
    assert R.batches_from_starts(order.tolist(), starts.tolist()) == [[0], [1, 2]]


def test_first_fit_empty():
    order, starts = first_fit_starts(np.zeros(0), np.zeros(0, np.int64), 10.0)
    assert order.size == 0 and starts.size == 0


# --------------------------------------------------------------------------- helpers


@given(n=st.integers(0, 3000), seed=st.integers(0, 2**16), integral=st.booleans(), scale=st.sampled_from([1.0, 1e3, 1e6]))
def test_size_keys_are_monotone_and_bounded(n, seed, integral, scale):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, int(scale) + 1, n).astype(np.float64) if integral else rng.random(n) * scale
    keys, edges = SK.size_keys(values, integral)
    assert keys.dtype == np.uint16 and keys.shape == values.shape
    assert edges.size == SK.KEY_LEVELS and np.all(np.diff(edges) >= 0)
    if n:
        o = np.argsort(values, kind="stable")
        assert np.all(np.diff(keys[o].astype(np.int64)) >= 0), "sorting by key sorts by value"
        assert np.all(values <= edges[keys]), "edges[key] bounds every value of the key"
    if integral and n and values.max() < SK.KEY_LEVELS:
        np.testing.assert_array_equal(keys, values.astype(np.uint16))


@given(n=st.integers(0, 500), seg_len=st.integers(1, 70), seed=st.integers(0, 2**16), chunk=st.sampled_from([1, 64, 1 << 20]))
def test_sort_within_segments(n, seg_len, seed, chunk):
    keys = np.random.default_rng(seed).integers(0, 5, n).astype(np.uint16)
    saved, SK.SEGMENT_CHUNK = SK.SEGMENT_CHUNK, chunk  # a few segments at a time, or all at once
    try:
        pos = SK.sort_within_segments(keys, seg_len)
    finally:
        SK.SEGMENT_CHUNK = saved
    expected = []
    for a in range(0, n, seg_len):
        part = list(range(a, min(n, a + seg_len)))
        expected += sorted(part, key=lambda i: (keys[i], i))
    assert pos.tolist() == expected


@given(n=st.integers(0, 300), seed=st.integers(0, 2**16), two_d=st.booleans())
def test_batch_reduce(n, seed, two_d):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 50, (n, 3) if two_d else n).astype(np.float64)
    starts = np.flatnonzero(rng.random(n) < 0.2)
    starts = np.unique(np.concatenate([[0], starts])) if n else np.zeros(0, np.int64)
    offsets = np.append(starts, n).astype(np.int64)
    counts, mx, sm = K.batch_reduce(sizes, offsets)
    bounds = offsets.tolist()
    assert counts.tolist() == [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        np.testing.assert_array_equal(mx[k], sizes[a:b].max(axis=0))
        np.testing.assert_array_equal(sm[k], sizes[a:b].sum(axis=0))


@given(n=st.integers(1, 300), seed=st.integers(0, 2**16), two_d=st.booleans(), gather=st.integers(1, 40))
def test_batch_reduce_gathers_in_chunks(n, seed, two_d, gather):
    rng = np.random.default_rng(seed)
    sizes = rng.random((n, 2) if two_d else n) * 100  # fractional: the sums must add the same way
    order = rng.permutation(n)
    offsets = np.unique(np.concatenate([[0, n], rng.integers(0, n, 30)])).astype(np.int64)
    saved, K.GATHER = K.GATHER, gather
    try:
        counts, mx, sm = K.batch_reduce(sizes, offsets, order)
    finally:
        K.GATHER = saved
    want = K.batch_reduce(sizes[order], offsets)
    assert counts.tolist() == want[0].tolist()
    assert mx.tobytes() == want[1].tobytes() and sm.tobytes() == want[2].tobytes()


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 6)), max_size=20))
def test_concat_ranges(pairs):
    firsts = np.array([f for f, _ in pairs], dtype=np.int64)
    lengths = np.array([m for _, m in pairs], dtype=np.int64)
    got = K._concat_ranges(firsts, lengths)
    assert got.tolist() == [i for f, m in pairs for i in range(f, f + m)]


@pytest.mark.parametrize("cost", ["padded", "polynomial"])
@pytest.mark.parametrize("cap", [None, 5])
def test_level_counts_is_the_largest_fitting_count(cost, cap):
    model = COSTS[cost]
    edges = np.array([0.0, 0.5, 1.0, 3.0, 7.0, 16.0, 17.0, 1000.0])
    budget = 100.0
    counts = K.level_counts(edges, budget, model, cap)
    cost_fn = R.model_cost(model)
    for e, c in zip(edges.tolist(), counts.tolist(), strict=True):
        assert c >= 1
        if cost_fn(1, e, e) <= budget:
            assert cost_fn(c, e, c * e) <= budget
            if (cap is None or c < cap) and c < 2**62:  # 2**62: no limit (zero size)
                assert cost_fn(c + 1, e, (c + 1) * e) > budget
        else:
            assert c == 1
        assert cap is None or c <= cap
    assert K.level_counts(edges, budget, COSTS["sum"], cap) is None


@pytest.mark.parametrize("cost", ["sum", "function", "padded", "polynomial"])
@pytest.mark.parametrize("cap", [None, 5])
@pytest.mark.parametrize("budget", [0.25, 100.0, 4321.5])
def test_edge_counts_match_the_reference(cost, cap, budget):
    """Bucket batch lengths (streams): closed form, or the one bisection for costs using the sum."""
    model = COSTS[cost]
    edges = np.array([0.5, 1.0, 3.0, 7.0, 16.0, 17.0, 1000.0])
    got = K.edge_counts(edges, budget, model, cap)
    assert got.dtype == np.int64
    assert got.tolist() == [R.largest_count(e, budget, R.model_cost(model), cap) for e in edges.tolist()]


def test_descending_search_path_does_not_cut_a_segments_last_batch():
    """Sum costs take the searched path: a batch that runs to its segment's end is not cut."""
    sizes = np.ones(9)
    level = np.zeros(9, dtype=np.int64)
    edges = np.ones(1)
    seg = np.array([0, 5], dtype=np.int64)
    got = K.descending_starts(level, edges, sizes, seg, 17.0, COSTS["sum"], multiple=2)
    assert got.tolist() == [0, 5]
    got = K.descending_starts(level, edges, sizes, seg, 3.0, COSTS["sum"], multiple=2)
    assert got.tolist() == [0, 2, 5, 7]  # [2, 5) runs to the segment end: not cut


@pytest.mark.parametrize("budget", [7.0 * (1 - 1e-12), 7.0, 6.875])
def test_sum_counts_compare_the_exact_difference_far_into_an_order(budget):
    """Sizes of k/8 add exactly; 200,000 sizes of 1000 before them make the prefix sums large,
    where ``csum[i] + budget`` rounds. The count is still the last j with
    ``csum[j] - csum[i] <= budget``, as a brute force finds it."""
    tail = np.random.default_rng(3).integers(0, 57, 600) / 8.0
    sizes = np.concatenate([np.full(200_000, 1000.0), tail])
    csum = K._prefix_sums(sizes)
    got = K._sum_counts(csum, budget, sizes.size)[200_000:]
    want = []
    for i in range(200_000, sizes.size):
        j = i + 1
        while j < sizes.size and csum[j + 1] - csum[i] <= budget:
            j += 1
        want.append(j - i)
    assert got.tolist() == want
