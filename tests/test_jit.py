"""The optional compiled loops (``fitbatch._kernels.jit``, the ``fast`` extra) give the numpy kernels' results.

Every comparison runs the same call twice, with ``FITBATCH_JIT=0`` (numpy) and ``FITBATCH_JIT=1``
(numba, loaded at once), and checks the compiled one against the reference oracle too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest
import reference as R
from contracts import COSTS
from contracts import jit_mode as jit
from hypothesis import given
from hypothesis import strategies as st
from test_kernels import descending_case, make_sizes, ns, ref_carry

import fitbatch
from fitbatch._kernels import batches as K
from fitbatch._kernels import jit as _jit
from fitbatch._kernels import packing
from fitbatch._kernels.batches import sum_starts
from fitbatch._kernels.packing import batch_loads, first_fit_keys, first_fit_laid, first_fit_starts
from fitbatch.strategies._base import Context, _pooled_order, _shuffled_by_level
from fitbatch.streaming import batch_stream
from fitbatch.streaming._plan import plan_starts

numba = pytest.importorskip("numba", reason="the fast extra (numba) is not installed")

COMPILED = ("sum", "padded", "polynomial")




def both(fn):  # noqa: ANN001, ANN202 - a test helper
    with jit("0"):
        plain = fn()
    with jit("1"):
        compiled = fn()
    return plain, compiled


def test_enabled_follows_the_environment():
    with jit("0"):
        assert not _jit.enabled()
        assert _jit.greedy(np.ones(3), 2.0, COSTS["sum"], np.inf, None, 0, 0.0, 0.0) is None
    with jit("1"):
        assert _jit.enabled()
        assert _jit.greedy(np.ones(3), 2.0, COSTS["sum"], np.inf, None, 0, 0.0, 0.0) is not None


def test_a_numba_that_fails_falls_back_to_numpy(monkeypatch, caplog):
    monkeypatch.setattr(_jit, "_module", None)
    monkeypatch.setattr(_jit, "_tried", False)

    def broken(module):  # noqa: ANN001, ANN202
        raise RuntimeError("cannot cache function: no locator available")

    monkeypatch.setattr(_jit, "_probe", broken)
    sizes = np.array([3.0, 4.0, 5.0, 1.0])
    with jit("1"), caplog.at_level("WARNING", logger="fitbatch._kernels.jit"):
        assert not _jit.enabled()
        got, _ = K.greedy_starts(sizes, 8.0, COSTS["sum"])
    assert got.tolist() == [0, 2]
    assert "could not be compiled (RuntimeError: cannot cache function" in caplog.text


@pytest.mark.parametrize(
    ("sizes", "cost"),
    [
        (np.ones(4), COSTS["function"]),  # a user's function: only numpy can call it
        (np.ones((4, 2)), COSTS["padded"]),  # several dimensions
        (np.ones(4), type("Mine", (fitbatch.PaddedCost,), {})()),  # a subclass may change evaluate
    ],
)
def test_other_costs_and_shapes_stay_in_numpy(sizes, cost):
    with jit("1"):
        assert _jit.greedy(sizes, 2.0, cost, np.inf, None, 0, 0.0, 0.0) is None
        got, _ = K.greedy_starts(sizes, 2.0, cost)
    with jit("0"):
        want, _ = K.greedy_starts(sizes, 2.0, cost)
    assert got.tolist() == want.tolist()


@given(
    kind=st.sampled_from(("int", "dyadic", "equal", "zeros", "dup")),
    n=ns,
    seed=st.integers(0, 2**16),
    cost=st.sampled_from(COMPILED),
    budget=st.sampled_from([1.0, 7.0, 13.5, 40.0, 100.0, 1000.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
    force_rate=st.sampled_from([0.0, 0.02, 0.3]),
    carried=st.integers(0, 4),
)
def test_greedy_matches_numpy_and_reference(kind, n, seed, cost, budget, cap, force_rate, carried):
    sizes = make_sizes(kind, n, seed)
    model = COSTS[cost]
    force = np.random.default_rng(seed + 1).random(n) < force_rate if force_rate else None
    before = make_sizes(kind, carried, seed + 7)
    carry = K.OpenBatch(carried, before.max(), before.sum()) if carried else None
    (plain, plain_open), (compiled, compiled_open) = both(
        lambda: K.greedy_starts(sizes, budget, model, cap=cap, force=force, carry=carry)
    )
    assert compiled.dtype == np.int64
    assert compiled.tolist() == plain.tolist()
    assert compiled_open.count == plain_open.count
    assert float(compiled_open.max_size) == float(plain_open.max_size)
    assert float(compiled_open.sum_size) == float(plain_open.sum_size)  # exact: integers and eighths
    forced = [] if force is None else np.flatnonzero(force).tolist()
    want, want_open = R.greedy_starts(
        R.as_python(sizes), budget, R.model_cost(model), cap=cap, forced=forced,
        carry=ref_carry(carry, False),
    )
    assert compiled.tolist() == want
    assert compiled_open.count == want_open[0]


@given(seed=st.integers(0, 2**16), length=st.integers(65, 400), carried=st.integers(0, 3))
def test_greedy_adds_fractional_sizes_in_the_compiled_order(seed, length, carried):
    """Fractional sizes in batches longer than a window: the numpy walk adds ``sum + x[0] + x[1]
    ...`` as the compiled loop does (a window's ``cumsum + sum`` rounds otherwise, and a budget
    at a sequential sum then cut the batches elsewhere). The walk is the path of few batches;
    the lock-step path of many adds prefix sums and may still differ at such a tie (documented
    in ``_jit_kernels``), so the numpy side here is the walk itself."""
    from fitbatch._kernels.greedy import _Greedy, _walk_windows

    rng = np.random.default_rng(seed)
    sizes = np.round(rng.random(3 * length) * 0.3, 3)
    before = sizes[:carried]
    carry = K.OpenBatch(carried, before.max(), before.sum()) if carried else None
    total = float(before.sum()) if carried else 0.0
    for x in sizes[carried:carried + length].tolist():  # the budget: a sum added in order
        total += x
    rest = sizes[carried:]
    with jit("1"):
        compiled, compiled_open = K.greedy_starts(rest, total, COSTS["sum"], carry=carry)
    state = carry if carry is not None else K.OpenBatch(0, np.float64(0.0), np.float64(0.0))
    plain, plain_open, _ = _walk_windows(_Greedy(rest, total, COSTS["sum"], np.inf, None), 1, state)
    assert compiled.tolist() == plain.tolist()
    assert float(compiled_open.sum_size) == float(plain_open.sum_size)


def test_greedy_grows_its_starts_across_chunks():
    """Every sample alone (each starts a batch): the compiled greedy's starts grow chunk by chunk."""
    sizes = make_sizes("int", 20_000, 3)
    force = np.zeros(sizes.size, dtype=bool)
    force[::777] = True
    for budget, cap in ((1e-9, None), (40.0, 3), (1e9, None)):
        (plain, _), (compiled, _) = both(lambda b=budget, c=cap: K.greedy_starts(sizes, b, COSTS["padded"], cap=c, force=force))
        assert compiled.tolist() == plain.tolist() and compiled.size >= force.sum()


@given(
    n=st.integers(0, 3000),
    seed=st.integers(0, 2**16),
    budget=st.sampled_from([1.0, 5.0, 40.0, 600.0, 1e6]),  # short batches, long ones (bisect path)
    cap=st.one_of(st.none(), st.integers(1, 50)),
    dyadic=st.booleans(),
)
def test_prefix_sum_starts_matches_numpy(n, seed, budget, cap, dyadic):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 30, n) / (8.0 if dyadic else 1.0)
    plain, compiled = both(lambda: plan_starts(sizes, budget, COSTS["sum"], cap).tolist())
    assert compiled == plain == sum_starts(sizes, budget, cap).tolist()
    # and both are the indexed planner's sequential plan (the greedy over a sum)
    want, _ = R.greedy_starts(R.as_python(sizes), budget, R.model_cost(COSTS["sum"]), cap=cap)
    assert compiled == want


@given(n=st.integers(1, 400), seed=st.integers(0, 2**16), cost=st.sampled_from(COMPILED), cuts=st.integers(1, 40))
def test_run_totals_match_numpy(n, seed, cost, cuts):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 50, n).astype(np.float64)
    bounds = np.unique(np.concatenate([[0, n], rng.integers(0, n, cuts)])).astype(np.int64)
    base = (3, 10, 100.0, 150.0, 1)
    with jit("1"):
        e, r, p, o = _jit.run_totals(sizes, bounds, COSTS[cost], 60.0, base)
    real = np.add.reduceat(sizes, bounds[:-1])
    top = np.maximum.reduceat(sizes, bounds[:-1])
    counts = np.diff(bounds)
    over = COSTS[cost].evaluate(counts.astype(np.float64), top, real) > 60.0
    assert e.tolist() == (10 + np.cumsum(counts)).tolist()
    assert r.tolist() == (100.0 + np.cumsum(real)).tolist()
    assert p.tolist() == (150.0 + np.cumsum(counts * top)).tolist()
    assert o.tolist() == (1 + np.cumsum(over)).tolist()


@given(n=st.integers(1, 400), seed=st.integers(0, 2**16), cuts=st.integers(0, 40), ordered=st.booleans())
def test_batch_reduce_matches_numpy(n, seed, cuts, ordered):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 2**40, n).astype(np.float64)
    order = rng.permutation(n) if ordered else None
    bounds = np.unique(np.concatenate([[0, n], rng.integers(0, n, cuts)])).astype(np.int64)
    with jit("1"):
        mx, sm = _jit.batch_reduce(sizes, order, bounds)
    _, want_mx, want_sm = K.batch_reduce(sizes, bounds, order)
    assert mx.tobytes() == want_mx.tobytes() and sm.tobytes() == want_sm.tobytes()


@pytest.mark.parametrize("sizes", [[1.0, 2.0**53], [3.0, -0.0, 1.0]])
def test_batch_reduce_leaves_inexact_sums_to_numpy(sizes):
    with jit("1"):
        assert _jit.batch_reduce(np.array(sizes), None, np.array([0, len(sizes)])) is None
        assert _jit.batch_reduce(np.array(sizes), None, np.array([0, 0, len(sizes)])) is None  # an empty batch


@given(
    kind=st.sampled_from(("int", "dyadic", "equal", "zeros", "dup", "floats")),
    n=ns,
    seed=st.integers(0, 2**16),
    n_segments=st.integers(1, 5),
    budget=st.sampled_from([1.0, 7.0, 13.5, 40.0, 100.0, 1000.0, 1e9]),
    cap=st.one_of(st.none(), st.integers(1, 9), st.sampled_from([2**40, 2**70])),  # caps over n never bind
)
def test_first_fit_matches_the_python_loop(kind, n, seed, n_segments, budget, cap):
    sizes, seg, _, _ = descending_case("int" if kind == "floats" else kind, n, seed, n_segments)
    if kind == "floats":  # rooms that round: the compiled subtractions must round as Python's do
        sizes = np.sort(np.random.default_rng(seed).random(n) * 10)[::-1].copy()
    (plain_order, plain_starts), (order, starts) = both(lambda: first_fit_starts(sizes, seg, budget, cap))
    assert order.dtype == starts.dtype == np.int64
    assert order.tolist() == plain_order.tolist()
    assert starts.tolist() == plain_starts.tolist()
    assert R.batches_from_starts(order.tolist(), starts.tolist()) == R.first_fit_batches(
        R.as_python(sizes), seg.tolist(), budget, cap
    )


@given(
    kind=st.sampled_from(("int", "dyadic", "equal", "zeros", "dup")),
    n=ns,
    seed=st.integers(0, 2**16),
    n_segments=st.integers(1, 5),
    budget=st.sampled_from([1.0, 7.0, 13.5, 100.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
)
def test_first_fit_in_place_rearranges_like_the_gathers(kind, n, seed, n_segments, budget, cap):
    """Compiled, first_fit_laid moves the sizes and positions along the permutation's cycles;
    without numba it gathers them: the same positions, starts and sizes either way."""
    sizes, seg, _, _ = descending_case(kind, n, seed, n_segments)
    positions = np.random.default_rng(seed).permutation(n).astype(np.int64)
    (a_pos, a_starts, a_laid), (b_pos, b_starts, b_laid) = both(
        lambda: first_fit_laid(sizes.copy(), positions.copy(), seg, budget, cap)
    )
    inner, starts = first_fit_starts(sizes, seg, budget, cap)
    for got_pos, got_starts, got_laid in ((a_pos, a_starts, a_laid), (b_pos, b_starts, b_laid)):
        assert got_pos.tolist() == positions[inner].tolist()
        assert got_starts.tolist() == starts.tolist()
        assert got_laid.tolist() == sizes[inner].tolist()


@given(
    kind=st.sampled_from(("int", "equal", "zeros", "wide")),
    n=ns,
    seed=st.integers(0, 2**16),
    n_segments=st.integers(1, 5),
    budget=st.sampled_from([1.0, 7.0, 13.5, 100.0, 70_000.0]),
    cap=st.one_of(st.none(), st.integers(1, 9)),
)
def test_first_fit_keys_packs_like_the_float_sizes(kind, n, seed, n_segments, budget, cap):
    """The 16-bit keys of whole sizes pack as their float64 sizes do (same positions and
    starts), compiled and not; compiled, keys and positions are rearranged in place."""
    sizes, seg, _, _ = descending_case("int" if kind == "wide" else kind, n, seed, n_segments)
    if kind == "wide":  # keys up to 65535
        sizes = np.minimum(sizes * 2260, 65535.0)
    keys = sizes.astype(np.uint16)
    positions = np.random.default_rng(seed).permutation(n).astype(np.int64)
    inner, starts = first_fit_starts(sizes, seg, budget, cap)
    for got_pos, got_starts, got_keys in both(lambda: first_fit_keys(keys.copy(), positions.copy(), seg, budget, cap)):
        assert got_pos.dtype == got_starts.dtype == np.int64
        assert got_keys.dtype == np.uint16
        assert got_pos.tolist() == positions[inner].tolist()
        assert got_starts.tolist() == starts.tolist()
        assert got_keys.tolist() == keys[inner].tolist()
    with jit("1"):
        moved, held = keys.copy(), positions.copy()
        got_pos, _, got_keys = first_fit_keys(moved, held, seg, budget, cap)
    assert got_pos is held
    assert got_keys is moved


@pytest.mark.parametrize("chunk", [1, 5, 64, 1 << 18])
def test_batch_loads_are_the_float_sums(monkeypatch, chunk):
    """Widened a few batches at a time, the keys' sums are numpy's over the float64 sizes."""
    monkeypatch.setattr(packing, "LOAD_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    keys = rng.integers(0, 65536, 1000).astype(np.uint16)
    starts = np.unique(np.concatenate([[0], rng.integers(1, 1000, 300)])).astype(np.int64)
    assert batch_loads(keys, starts).tolist() == np.add.reduceat(keys.astype(np.float64), starts).tolist()
    assert batch_loads(keys, np.zeros(1, np.int64)).tolist() == [float(keys.astype(np.int64).sum())]
    assert batch_loads(keys[:0], np.zeros(0, np.int64)).tolist() == []


@pytest.mark.parametrize("cap", [None, 7])
@pytest.mark.parametrize("whole", [False, True])  # whole sizes: first fit over the 16-bit keys
def test_packed_sum_plans_are_the_same(cap, whole):
    sizes = np.minimum(np.random.default_rng(3).lognormal(5, 1.2, 50_000).round() + 1, 4000.0)
    if not whole:
        sizes[::7] += 0.25  # fractional sizes too: the budget is planned a hair lower

    def run():
        plan = fitbatch.plan_batches(sizes, 4096, cost="sum", strategy=fitbatch.Packed(pool_size=4096), max_batch_size=cap)
        return plan.order.tolist(), plan.offsets.tolist()

    plain, compiled = both(run)
    assert compiled == plain


@pytest.mark.parametrize(("top", "dtype"), [(0, np.uint16), (5, np.int64), (311, np.uint16), (65535, np.uint16), (1 << 16, np.int64)])
def test_shuffle_by_level_matches_numpy(top, dtype):
    n = 70_000 + top % 7  # over 2**16 positions: the radix-sorted shuffle
    rng = np.random.default_rng(top)
    level = np.minimum(rng.geometric(0.02, n) - 1, top).astype(dtype)  # skewed: long runs of one level
    plain, compiled = both(lambda: _shuffled_by_level(n, np.random.default_rng(9), level, top))
    assert compiled.dtype == np.int64
    assert compiled.tolist() == plain.tolist()
    assert np.all(np.diff(top - level[compiled].astype(np.int64)) >= 0)


@pytest.mark.parametrize(("pool", "n"), [(1, 65_537), (4096, 70_001), (65_536, 200_000), (1 << 40, 80_000)])
def test_shuffle_in_pools_matches_numpy(pool, n):
    rng = np.random.default_rng(pool % 1000)
    sizes = np.minimum(rng.geometric(0.01, n), 5000).astype(np.float64)  # many ties, long runs
    ctx = Context(sizes=fitbatch.as_sizes(sizes), budget=1e4, cost=COSTS["sum"], cap=None, multiple=1,
                  shuffle=True, seed=7, epoch=1)
    (plain, plain_starts), (compiled, starts) = both(lambda: _pooled_order(ctx, pool))
    assert compiled.dtype == np.int64
    assert compiled.tolist() == plain.tolist()
    assert starts.tolist() == plain_starts.tolist()


def test_laid_keys_are_the_keys_in_pool_order():
    n = 70_001
    sizes = np.minimum(np.random.default_rng(2).geometric(0.01, n), 5000).astype(np.float64)
    ctx = Context(sizes=fitbatch.as_sizes(sizes), budget=1e4, cost=COSTS["sum"], cap=None, multiple=1,
                  shuffle=True, seed=7, epoch=1)
    plain_keys, compiled_keys = np.full(n, 7, np.uint16), np.full(n, 7, np.uint16)
    with jit("0"):
        plain, _ = _pooled_order(ctx, 4096, plain_keys)
    with jit("1"):
        compiled, _ = _pooled_order(ctx, 4096, compiled_keys)
    keys = ctx.keys()[0]
    assert compiled.tolist() == plain.tolist()
    assert np.array_equal(plain_keys, keys[plain]) and np.array_equal(compiled_keys, keys[compiled])
    assert np.array_equal(compiled_keys, sizes[compiled])  # integers under 2**16: each key is its size


@pytest.mark.parametrize("strategy", [fitbatch.Packed(pool_size=8192), fitbatch.Pooled(pool_size=8192, randomness=None)])
@pytest.mark.parametrize("cost", ["sum", "padded"])
def test_pooled_layout_plans_are_the_same(strategy, cost):
    sizes = np.minimum(np.random.default_rng(5).lognormal(4, 1.3, 100_000).round() + 1, 4000.0)

    def run():
        plan = fitbatch.plan_batches(sizes, 4096, cost=cost, strategy=strategy, seed=3, epoch=2)
        return plan.order.tolist(), plan.offsets.tolist()

    plain, compiled = both(run)
    assert compiled == plain


@pytest.mark.parametrize("strategy", ["pooled", "buckets"])
@pytest.mark.parametrize(("epoch", "shuffle"), [(0, True), (3, True), (0, False)])
def test_level_mixing_plans_are_the_same(strategy, epoch, shuffle):
    sizes = np.minimum(np.random.default_rng(4).lognormal(4, 1.3, 100_000).round() + 1, 4000.0)

    def run():
        plan = fitbatch.plan_batches(sizes, 4096, strategy=strategy, epoch=epoch, shuffle=shuffle, seed=2)
        return plan.order.tolist(), plan.offsets.tolist()

    plain, compiled = both(run)
    assert compiled == plain


@given(
    values=st.lists(
        st.one_of(st.integers(0, 10**6).map(float), st.floats(0, 1e6), st.sampled_from([np.inf, np.nan, 0.5, 2.0**53])),
        max_size=40,
    )
)
def test_all_integral_matches_numpy(values):
    sizes = np.asarray(values, dtype=np.float64)
    plain, compiled = both(lambda: _jit.all_integral(sizes))
    assert compiled == plain == bool(np.all(sizes == np.floor(sizes)))


@pytest.mark.parametrize(
    ("strategy", "cost", "oversized"),
    [("sequential", "sum", "single"), ("sequential", "padded", "skip"), ("sequential", "polynomial", "single"),
     ("buckets", "padded", "single")],
)
def test_streams_are_the_same_batches(strategy, cost, oversized):
    sizes = np.random.default_rng(5).integers(0, 700, 30_000).astype(np.float64)
    model = COSTS[cost]

    def run():
        stream = batch_stream(
            range(sizes.size), sizeof_batch=lambda ids: sizes[ids], budget=600.0, cost=model,
            strategy=strategy, buffer_size=2000, oversized=oversized,
        )
        return list(stream), stream.summary

    (plain, plain_summary), (compiled, compiled_summary) = both(run)
    assert compiled == plain
    assert compiled_summary == plain_summary


def _in_fresh_process(code: str, mode: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FITBATCH_JIT"}
    if mode is not None:
        env["FITBATCH_JIT"] = mode
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE = """
import json, sys
import numpy as np
from fitbatch import plan_batches
from fitbatch._kernels import jit as _jit
sizes = np.random.default_rng(0).integers(1, 50, {n}).astype(float)
for _ in range({plans}):
    plan_batches(sizes, 200, strategy="sequential")
_jit.settle()  # a background load under way finishes
print(json.dumps({{"numba": "numba" in sys.modules, "loaded": _jit._module is not None}}))
"""


@pytest.mark.parametrize(
    ("n", "plans", "mode", "loaded"),
    [(1000, 2, None, False), (_jit.LOAD_AT + 1, 1, None, False), (_jit.LOAD_AT + 1, 2, None, True),
     (_jit.LOAD_AT // 2 + 1, 2, None, True), (1000, 1, "1", True), (_jit.LOAD_AT + 1, 2, "0", False)],
)
def test_numba_is_imported_only_for_large_work(n, plans, mode, loaded):
    """Loaded after LOAD_AT samples over LOAD_PLANS plans (a single plan never waits for it)."""
    got = _in_fresh_process(PROBE.format(n=n, plans=plans), mode)
    assert got == {"numba": loaded, "loaded": loaded}


@pytest.mark.parametrize("compact_at", [0, 1 << 40])
def test_both_compiled_shuffles_match_numpy(compact_at, monkeypatch):
    """The compiled shuffles for large sets (one int64 array, 32-bit positions in its halves) and
    for smaller ones (two uint64 arrays) give numpy's stable orders, pools and levels alike."""
    import fitbatch._kernels.jit as jit_module

    monkeypatch.setattr(jit_module, "COMPACT_AT", compact_at)
    n = 70_003
    rng = np.random.default_rng(5)
    sizes = np.minimum(rng.geometric(0.01, n), 5000).astype(np.float64)
    level = np.minimum(rng.geometric(0.05, n) - 1, 40).astype(np.uint16)
    ctx = Context(sizes=fitbatch.as_sizes(sizes), budget=1e4, cost=COSTS["sum"], cap=None, multiple=1,
                  shuffle=True, seed=3, epoch=2)
    for pool in (4096, n):
        plain_keys, compiled_keys = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
        with jit("0"):
            plain, _ = _pooled_order(ctx, pool, plain_keys)
        with jit("1"):
            compiled, _ = _pooled_order(ctx, pool, compiled_keys)
        assert compiled.tolist() == plain.tolist()
        assert compiled_keys.tolist() == plain_keys.tolist()
    plain, compiled = both(lambda: _shuffled_by_level(n, np.random.default_rng(9), level, 40))
    assert compiled.tolist() == plain.tolist()
    # one level of more than 2**16 positions (sorted in place, after the others in buffers)
    heavy = np.where(rng.random(n) < 0.97, 3, level).astype(np.uint16)
    assert np.bincount(heavy).max() > 1 << 16
    plain, compiled = both(lambda: _shuffled_by_level(n, np.random.default_rng(9), heavy, 40))
    assert compiled.tolist() == plain.tolist()


def test_compiled_walk_over_runs_matches_python():
    """The compiled walk over runs of one level gives the Python walk's starts (many segments,
    cut-back batches, an empty last segment)."""
    from fitbatch._kernels import batches as K

    rng = np.random.default_rng(11)
    for multiple in (1, 3):
        n = 5_000
        seg = np.append(np.sort(rng.choice(np.arange(1, n), 40, replace=False)), n)
        seg = np.concatenate([[0], seg]).astype(np.int64)
        level = np.concatenate([np.sort(rng.integers(0, 50, b - a))[::-1] for a, b in zip(seg[:-1], seg[1:])]).astype(np.uint16)
        edges = np.linspace(1.0, 400.0, 50)
        sizes = edges[level]
        plain, compiled = both(
            lambda lv=level, e=edges, x=sizes, sg=seg, m=multiple: K.descending_starts(lv, e, x, sg, 2000.0, COSTS["padded"], multiple=m)
        )
        assert compiled.tolist() == plain.tolist()


class _NoMachineCode:
    """A compiled loop as numba shows it on a fresh install: no signature, an empty cache index."""

    signatures: list[object] = []

    class _cache:  # noqa: N801 - numba's attribute names
        class _cache_file:  # noqa: N801
            @staticmethod
            def _load_index() -> dict[object, object]:
                return {}


def test_a_loop_without_machine_code_runs_numpy_then_compiles_after_the_plan(monkeypatch):
    """A fresh install: the loop is not compiled inside the plan (numpy's form, the same
    result), but in the background once the plan is done; FITBATCH_JIT=1 compiles it at once."""
    assert _jit.enabled()
    monkeypatch.setattr(_jit, "_later", {})
    monkeypatch.setattr(_jit, "_compiling", set())
    fake, compiled = type("M", (), {"loop": _NoMachineCode()})(), []
    with jit("1"):
        assert _jit._cached(fake, "loop", compiled.append)
    with jit("auto"):
        with _jit.planning():
            assert not _jit._cached(fake, "loop", compiled.append)
            assert list(_jit._later) == ["loop"] and not compiled
        _jit._compile_thread.join(60)
        assert compiled == [_jit._module] and not _jit._later
        assert not _jit._cached(fake, "loop", compiled.append) and not _jit._later  # compiling already


@pytest.mark.parametrize("n", [70_001, 300_000])
def test_plans_are_the_same_while_loops_wait_for_machine_code(n, monkeypatch):
    sizes = np.minimum(np.random.default_rng(n).geometric(0.002, n), 16000)
    with jit("0"):
        plain = fitbatch.plan_batches(sizes, 16384, cost="sum", strategy="packed", epoch=1)
    monkeypatch.setattr(_jit, "_cached", lambda module, name, compile_it: False)
    with jit("auto"):
        assert _jit.enabled()
        fresh = fitbatch.plan_batches(sizes, 16384, cost="sum", strategy="packed", epoch=1)
    assert np.array_equal(plain.order, fresh.order) and np.array_equal(plain.offsets, fresh.offsets)


def test_a_companion_load_never_waits_for_another_ones_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh install compiles a companion module for seconds in its loader: loading another
    module meanwhile goes on (each module has its own lock)."""
    monkeypatch.setattr(_jit, "_companions", {})
    monkeypatch.setattr(_jit, "_companion_threads", {})
    monkeypatch.setattr(_jit, "_companion_loads", {})
    compiling, done = threading.Event(), threading.Event()

    def slow(module: Any) -> None:
        compiling.set()
        done.wait(30)

    first = threading.Thread(target=_jit._load_companion, args=("steps", slow), daemon=True)
    first.start()
    assert compiling.wait(30)
    second = threading.Thread(target=_jit._load_companion, args=("compiled_histogram", None), daemon=True)
    second.start()
    second.join(30)
    finished_while_first_compiles = not second.is_alive() and not done.is_set()
    done.set()
    first.join(30)
    assert finished_while_first_compiles  # (with one lock for all, it waited for the first)
    assert _jit._companions["compiled_histogram"] is not None
    assert _jit._companions["steps"] is not None
