"""Strategies: resolution, validation, per-strategy layout properties, bucket fitting, and the
plan-quality targets on the real length sets (resampled to 200k samples)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import reference as R
from contracts import COSTS, repeat_rate, spearman_position_size
from hypothesis import given
from hypothesis import strategies as st

import fitbatch
from fitbatch import _rng
from fitbatch._kernels import sorting as SK
from fitbatch.costs import PaddedCost
from fitbatch.sizes import as_sizes
from fitbatch.strategies import STRATEGIES, Context, strategy_names
from fitbatch.strategies._buckets import fit_buckets


def context(sizes, budget=100.0, cost=None, *, shuffle=True, seed=0, epoch=0, cap=None, multiple=1):
    return Context(as_sizes(sizes), budget, cost or PaddedCost(), cap, multiple, shuffle, seed, epoch)


def test_resolve_strategy():
    assert strategy_names() == ("buckets", "packed", "pooled", "sequential", "sorted")
    for name in strategy_names():
        s = fitbatch.strategies.resolve_strategy(name)
        assert isinstance(s, STRATEGIES[name]) and s.name == name
    pooled = fitbatch.Pooled(pool_size=7)
    assert fitbatch.strategies.resolve_strategy(pooled) is pooled
    with pytest.raises(ValueError) as err:
        fitbatch.strategies.resolve_strategy("random")
    for name in strategy_names():
        assert repr(name) in str(err.value)
    with pytest.raises(TypeError, match="strategy"):
        fitbatch.strategies.resolve_strategy(3)


@pytest.mark.parametrize("make, match", [
    (lambda: fitbatch.Pooled(pool_size=0), "pool_size"),
    (lambda: fitbatch.Packed(pool_size=-1), "pool_size"),
    (lambda: fitbatch.Pooled(pool_size=2.5), "pool_size"),
    (lambda: fitbatch.Buckets(spread=-0.1), "spread"),
    (lambda: fitbatch.Buckets(min_batches=0), "min_batches"),
    (lambda: fitbatch.Buckets(boundaries=(3.0, 2.0)), "boundaries"),
    (lambda: fitbatch.Buckets(boundaries=()), "boundaries"),
    (lambda: fitbatch.Buckets(boundaries=(1.0, float("inf"))), "boundaries"),
    (lambda: fitbatch.Sorted(descending="no"), "descending"),
    (lambda: fitbatch.Pooled(spread="wide"), "spread"),
    (lambda: fitbatch.Pooled(spread=-1.0), "spread"),
    (lambda: fitbatch.plan_batches([1, 2], "-3"), "positive"),
])
def test_strategy_settings_are_validated(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_shuffle_defaults_and_batch_order():
    assert not fitbatch.Sequential.default_shuffle and not fitbatch.Sorted.default_shuffle
    assert fitbatch.Pooled.default_shuffle and fitbatch.Buckets.default_shuffle and fitbatch.Packed.default_shuffle
    ctx = context(np.arange(10.0))
    assert fitbatch.Sequential().batch_order(ctx, 5) is None
    assert fitbatch.Sorted().batch_order(ctx, 5) is None
    perm = fitbatch.Pooled().batch_order(ctx, 50)
    assert sorted(perm.tolist()) == list(range(50)) and perm.tolist() != list(range(50))
    assert fitbatch.Pooled().batch_order(context(np.arange(10.0), shuffle=False), 50) is None


@given(
    name=st.sampled_from(["sequential", "sorted", "pooled", "buckets", "packed"]),
    n=st.integers(0, 600),
    seed=st.integers(0, 2**16),
    shuffle=st.booleans(),
)
def test_results_are_well_formed(name, n, seed, shuffle):
    sizes = np.random.default_rng(seed).integers(1, 60, n).astype(np.float64)
    ctx = context(sizes, 200.0, shuffle=shuffle, seed=seed)
    res = fitbatch.strategies.resolve_strategy(name).plan(ctx)
    assert sorted(res.order.tolist()) == list(range(n))
    assert res.starts.dtype == np.int64 and res.tails.size == res.starts.size
    if n:
        assert res.starts[0] == 0 and np.all(np.diff(res.starts) > 0) and res.starts[-1] < n
        assert res.tails.any(), "some batch closes the last segment"


def test_sorted_batches_ascend_and_descend():
    sizes = np.random.default_rng(1).integers(1, 100, 500)
    up = fitbatch.plan_batches(sizes, 400, strategy="sorted")
    maxima = [int(sizes[b].max()) for b in up]
    assert maxima == sorted(maxima)
    down = fitbatch.plan_batches(sizes, 400, strategy=fitbatch.Sorted(descending=True))
    assert [int(sizes[b].max()) for b in down] == sorted(maxima, reverse=True)


def test_pooled_sorts_within_pools_only():
    sizes = np.random.default_rng(2).integers(1, 100, 300)
    ctx = context(sizes, 400.0, shuffle=False)
    res = fitbatch.Pooled(pool_size=100, randomness=None).plan(ctx)
    for a in range(0, 300, 100):
        part = res.order[a : a + 100]
        assert sorted(part.tolist()) == list(range(a, a + 100)), "pools are consecutive samples without shuffle"
        assert np.all(np.diff(sizes[part]) <= 0), "each pool is sorted by descending size"
    assert set(range(0, 300, 100)) <= set(res.starts.tolist()), "no batch crosses a pool border"


def test_buckets_with_boundaries():
    sizes = np.array([1, 4, 5, 16, 17, 3, 64, 100, 2, 15], dtype=np.float64)
    b = fitbatch.Buckets(boundaries=(4.0, 16.0, 64.0))
    ids, top = b.bucket_ids(context(sizes))
    assert ids.tolist() == [0, 0, 1, 1, 2, 0, 2, 3, 0, 1]  # upper edges are inclusive
    assert top.tolist() == [4.0, 16.0, 64.0, 100.0]


def test_buckets_batches_stay_in_their_bucket():
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 200, 3000).astype(np.float64)
    strategy = fitbatch.Buckets(boundaries=(25.0, 50.0, 100.0))
    plan = fitbatch.plan_batches(sizes, 2000, strategy=strategy, seed=4)
    bucket = np.searchsorted([25.0, 50.0, 100.0], sizes, side="left")
    mixed = [b for b in plan if len(set(bucket[b].tolist())) > 1]
    assert len(mixed) <= 3, "only the re-planned leftovers may mix buckets"
    pure = [b for b in plan if len(set(bucket[b].tolist())) == 1]
    for k, top in enumerate([25.0, 50.0, 100.0, 199.0]):
        counts = {len(b) for b in pure if bucket[b[0]] == k}
        full = int(2000 // top)
        assert max(counts) == full, "a bucket's batches are sized for its largest sample"


@given(
    n=st.integers(0, 300), batch_size=st.integers(1, 40), shuffle=st.booleans(), seed=st.integers(0, 2**16),
    epoch=st.integers(0, 3), cost=st.sampled_from(sorted(COSTS)), two_d=st.booleans(),
)
def test_fixed_reproduces_fixed_size_plan(n, batch_size, shuffle, seed, epoch, cost, two_d):
    """One fixed-count planner: the Fixed strategy is the fixed_size_plan baseline, batch for batch."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 60, (n, 2) if two_d else n).astype(np.float64)
    opts = dict(shuffle=shuffle, seed=seed, epoch=epoch)
    plan = fitbatch.plan_batches(sizes, 500, cost=COSTS[cost], strategy=fitbatch.strategies.Fixed(batch_size), oversized="single", **opts)
    base = fitbatch.plan.fixed_size_plan(sizes, batch_size, budget=500, cost=COSTS[cost], **opts)
    order = _rng.generator(seed, epoch, "fixed-order").permutation(n) if shuffle else range(n)
    assert plan.to_lists() == base.to_lists() == R.fixed_batches(order, batch_size)
    for name in ("order", "offsets", "costs", "real_units", "padded_units"):
        assert np.array_equal(getattr(plan, name), getattr(base, name)), name
    assert dataclasses.replace(plan.stats(), plan_seconds=0.0) == dataclasses.replace(base.stats(), plan_seconds=0.0)
    assert plan.strategy_name == base.strategy_name == f"fixed({batch_size})"


def test_fixed_golden_and_settings():
    # pins the shuffled order (the "fixed-order" key) as it was before Fixed existed
    plan = fitbatch.plan.fixed_size_plan([5, 9, 2, 7, 1, 8, 3, 6, 4], 4, budget=20, seed=4, epoch=2)
    assert plan.to_lists() == [[5, 0, 7, 1], [2, 4, 3, 8], [6]]
    assert plan.costs.tolist() == [36.0, 28.0, 3.0] and plan.lower_bound == 3
    fixed = fitbatch.strategies.Fixed(np.int64(4))
    assert fixed.batch_size == 4 and type(fixed.batch_size) is int
    assert fitbatch.strategies.resolve_strategy(fixed) is fixed and fixed.default_shuffle
    assert fitbatch.plan.PlanOptions.build(20, strategy=fixed).to_dict()["strategy"] == {"kind": "fixed", "batch_size": 4}
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        fitbatch.strategies.Fixed(0)
    for option in ({"max_batch_size": 3}, {"batch_size_multiple": 3}):
        with pytest.raises(ValueError, match=r"Fixed\(batch_size=4\) does not fit max_batch_size"):
            fitbatch.plan_batches([1, 2, 3], 20, strategy=fixed, **option)


@given(n=st.integers(1, 5000), seed=st.integers(0, 2**16), spread=st.sampled_from([0.0, 0.02, 0.3]),
       min_batches=st.sampled_from([1, 4, 16]))
def test_fit_buckets_partitions_the_keys(n, seed, spread, min_batches):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 3000, n).astype(np.float64)
    keys, edges = SK.size_keys(sizes, True)
    lut, top = fit_buckets(keys, edges, 16384.0, PaddedCost(), None, spread, min_batches)
    ids = lut[keys].astype(np.int64)
    assert ids.min() >= 0 and ids.max() == top.size - 1
    order = np.argsort(sizes, kind="stable")
    assert np.all(np.diff(ids[order]) >= 0), "buckets are contiguous ranges of sizes"
    assert np.all(np.diff(top) > 0)
    for k in range(top.size):
        members = sizes[ids == k]
        assert members.size and members.max() <= top[k]
        if top.size > 1:  # each bucket holds at least two full batches (an under-filled
            # smallest bucket joins the one above)
            assert members.size >= 2 * np.floor(16384.0 / top[k])


# --------------------------------------------------------------------------- quality targets

N = 200_000
BUDGET = 16384.0
_CACHE: dict = {}


def quality(set_name: str, continuous: bool, strategy: str, data: dict):
    key = (set_name, continuous, strategy)
    if key not in _CACHE:
        rng = np.random.default_rng(0)
        base = data[set_name]
        sizes = base[rng.integers(0, base.size, N)].astype(np.float64)
        if continuous:
            sizes = sizes + rng.random(N)
        kw = dict(cost="padded", oversized="skip", seed=0)
        p0 = fitbatch.plan_batches(sizes, BUDGET, strategy=strategy, epoch=0, **kw)
        p1 = fitbatch.plan_batches(sizes, BUDGET, strategy=strategy, epoch=1, **kw)
        ref = fitbatch.plan_batches(sizes, BUDGET, strategy="sorted", **kw)
        _CACHE[key] = dict(
            efficiency=p0.stats().padding_efficiency,
            batches=len(p0) / len(ref),
            max_fill=p0.stats().max_fill,
            repeat=repeat_rate(p0, p1, N),
            spearman=abs(spearman_position_size(p0, sizes)),
            skipped=p0.stats().skipped,
        )
    return _CACHE[key]


TARGETS = {"efficiency": (">=", 0.98), "batches": ("<=", 1.02), "max_fill": ("<=", 1.0),
           "repeat": ("<=", 0.15), "spearman": ("<=", 0.1)}

# Measured at 200k samples with the default settings (update with the measured value when the
# code changes; a gap that closes turns its strict xfail into a failure, so remove it then).
# randomness="auto" (issue #18) closed every gap measured before it: the repeat rate of pooled
# (0.15-0.23, now 0.005-0.09) and the padding and batch count of buckets on the functions set.
KNOWN_GAPS: dict[tuple[str, bool, str, str], str] = {}


def _cases():
    for set_name in ("pytokens", "functions"):
        for continuous in (False, True):
            for strategy in ("pooled", "buckets"):
                for metric in TARGETS:
                    key = (set_name, continuous, strategy, metric)
                    marks = []
                    if key in KNOWN_GAPS:
                        marks = [pytest.mark.xfail(strict=True, reason=f"known gap: {KNOWN_GAPS[key]}")]
                    yield pytest.param(*key, marks=marks,
                                       id=f"{set_name}-{'cont' if continuous else 'int'}-{strategy}-{metric}")


@pytest.mark.parametrize("set_name, continuous, strategy, metric", list(_cases()))
def test_quality_target(set_name, continuous, strategy, metric, pytokens, functions):
    got = quality(set_name, continuous, strategy, {"pytokens": pytokens, "functions": functions})
    op, limit = TARGETS[metric]
    if op == ">=":
        assert got[metric] >= limit, f"{metric} = {got[metric]:.4f}"
    else:
        assert got[metric] <= limit + 1e-12, f"{metric} = {got[metric]:.4f}"
    if set_name == "pytokens":
        assert got["skipped"] > 0


def test_packed_sum_is_near_the_lower_bound(functions):
    plan = fitbatch.plan_batches(functions, BUDGET, cost="sum", strategy="packed")
    assert len(plan) <= 1.002 * plan.stats().lower_bound
    assert plan.stats().max_fill <= 1.0
