"""The length-histogram packing (``fitbatch._kernels.packing_depth``) and the ``packed`` path
that uses it: every sample once, every batch within the budget and the cap, deterministic."""

from __future__ import annotations

import numpy as np
import pytest
from contracts import check_plan
from hypothesis import given
from hypothesis import strategies as st

import fitbatch
from fitbatch._kernels import packing_depth as PD
from fitbatch._kernels import pattern_layout


def _batches(order: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    return [order[a:b] for a, b in zip(starts, [*starts[1:], order.size])]


@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=300),
    budget=st.integers(40, 64),
    cap=st.one_of(st.none(), st.integers(1, 6)),
    seed=st.one_of(st.none(), st.integers(0, 3)),
)
def test_histogram_pack_every_index_once_within_budget_and_cap(lengths, budget, cap, seed):
    sizes = np.asarray(lengths, dtype=np.int64)
    rng = None if seed is None else np.random.default_rng(seed)
    order, starts = PD.histogram_pack(sizes, budget, cap, rng)
    assert np.array_equal(np.sort(order), np.arange(sizes.size))
    batches = _batches(order, starts)
    assert all(b.size >= 1 for b in batches)
    assert all(int(sizes[b].sum()) <= budget for b in batches)
    if cap is not None:
        assert max(b.size for b in batches) <= cap
    # no worse than the tokens allow by more than first-fit decreasing's classic bound
    assert len(batches) <= max(int(np.ceil(sizes.sum() / budget)) * 17 // 10 + 1, -(-sizes.size // (cap or sizes.size)))


@given(
    counts=st.lists(st.integers(0, 50), min_size=2, max_size=30),
    cap=st.one_of(st.none(), st.integers(2, 5)),
)
def test_patterns_take_every_sample_once(counts, cap):
    counts = np.asarray([0, *counts], dtype=np.int64)
    budget = counts.size - 1 + 7
    got = PD.best_patterns(np.append(counts, np.zeros(7, np.int64)), budget, cap)
    used = np.zeros(budget + 1, np.int64)
    for times, items in got:
        assert times >= 1 and sum(items) <= budget and (cap is None or len(items) <= cap)
        np.add.at(used, list(items), times)
    assert np.array_equal(used[: counts.size], counts)


def test_exact_fills_where_the_lengths_allow():
    # 5+5, 4+3+2+1: two full batches where first-fit by length order needs the same
    order, starts = PD.histogram_pack(np.array([5, 3, 2, 5, 4, 1]), 10, None)
    assert sorted(map(sorted, (b.tolist() for b in _batches(order, starts)))) == [[0, 3], [1, 2, 4, 5]]
    # under a cap of 2: each 7 takes a 3, the 1s pair up
    order, starts = PD.histogram_pack(np.array([7, 7, 3, 3, 1, 1]), 10, 2)
    assert len(starts) == 3


def test_packed_with_a_cap_plans_on_the_histogram_and_keeps_the_contracts():
    sizes = np.random.default_rng(0).integers(1, 300, 5000).astype(np.float64)
    capped = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", max_batch_size=3)
    check_plan(capped, sizes, 512, fitbatch.SumCost(), max_batch_size=3)
    assert max(len(b) for b in capped) <= 3
    again = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", max_batch_size=3)
    assert capped.to_lists() == again.to_lists()
    other = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", max_batch_size=3, epoch=1)
    assert len(other) == len(capped) and other.to_lists() != capped.to_lists()
    # the same patterns as the kernel's, which fills 3-sample batches far tighter than first-fit
    counts = np.bincount(sizes.astype(np.int64), minlength=513)
    assert len(capped) == sum(t for t, _ in PD.best_patterns(counts, 512, 3))


@pytest.mark.parametrize("sizes", [np.array([0.5, 3.0]), np.array([600.0, 3.0]), np.array([1.0, 2.0])])
def test_histogram_applies_only_to_whole_sizes_within_a_small_budget(sizes):
    integral = bool(np.all(sizes == np.round(sizes)))
    assert PD.applies(sizes, 512.0, integral) == (integral and sizes.max() <= 512)
    assert not PD.applies(sizes, 10_000.0, integral)


def test_without_a_cap_the_histogram_is_kept_only_near_the_bound():
    rng = np.random.default_rng(1)
    # 70,000 samples over 80 lengths, in pairs that fill 512 exactly: too few per length for the
    # histogram first fit, so the patterns are tried, and kept (at the bound)
    short = rng.integers(1, 41, 35_000)
    tight = rng.permutation(np.concatenate([short, 512 - short])).astype(np.float64)
    plan = fitbatch.plan_batches(tight, 512, cost="sum", strategy="packed")
    counts = np.bincount(tight.astype(np.int64), minlength=513)
    patterns = PD.best_patterns(counts, 512, None)
    assert PD.near_bound(patterns, counts, 512) and len(plan) == sum(t for t, _ in patterns)
    check_plan(plan, tight, 512, fitbatch.SumCost())
    # lengths no pair of which fits: far from ceil(tokens / budget), not kept
    loose = rng.choice([300.0, 301.0, 302.0], 70_000)
    counts = np.bincount(loose.astype(np.int64), minlength=513)
    assert not PD.near_bound(PD.best_patterns(counts, 512, None), counts, 512)
    check_plan(fitbatch.plan_batches(loose, 512, cost="sum", strategy="packed"), loose, 512, fitbatch.SumCost())


@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=400),
    budget=st.integers(64, 100),
    seed=st.integers(0, 3),
)
def test_quick_patterns_laid_out_place_every_index_once_within_budget(lengths, budget, seed):
    sizes = np.asarray(lengths, dtype=np.int64)
    counts = np.bincount(sizes, minlength=budget + 1)
    patterns = PD.quick_patterns(counts, budget)
    # the "large" rule's patterns, their loose batches packed again by first fit when it saves any
    assert PD._batches(patterns) <= PD._batches(PD.histogram_patterns(counts, budget, None, "large"))
    rng = np.random.default_rng(seed)
    out = pattern_layout.lay_out_drawn(sizes, counts, patterns, rng, rng)
    order, starts = out.order, out.offsets[:-1]
    assert np.array_equal(np.sort(order), np.arange(sizes.size))
    batches = _batches(order, starts)
    assert len(batches) == sum(t for t, _ in patterns)
    assert all(b.size >= 1 and int(sizes[b].sum()) <= budget for b in batches)
    # each batch holds its pattern's lengths, every pattern as many times as it is taken
    held = [tuple(sorted(sizes[b].tolist(), reverse=True)) for b in batches]
    assert held == [patterns[k][1] for k in out.kind.tolist()]
    assert sorted(held) == sorted(items for times, items in patterns for _ in range(times))


def test_lay_out_refuses_patterns_that_do_not_take_every_sample_once():
    with pytest.raises(ValueError, match="patterns"):
        pattern_layout.lay_out_drawn(np.array([2, 2]), np.array([0, 0, 2]), [(1, (2,))], None, None)


def test_uncapped_packed_plans_the_quick_patterns_when_near_the_bound():
    # 100,000 token counts, short and long (too few per length for the histogram first fit, so
    # every rule's patterns run, and the quick ones beside them: the fewest are kept): the "large" rule leaves 20 loose batches at the end, first fit packs
    # their samples into 12, and the plan reaches the bound (first fit alone does too)
    rng = np.random.default_rng(0)
    sizes = np.concatenate([rng.integers(1, 128, 60_000), rng.integers(200, 513, 40_000)])
    sizes = rng.permutation(sizes).astype(np.float64)
    counts = np.bincount(sizes.astype(np.int64), minlength=513)
    patterns = PD.quick_patterns(counts, 512)
    assert PD._batches(PD.histogram_patterns(counts, 512, None, "large")) == 35_308
    assert PD._batches(patterns) == 35_300 == -(-int(sizes.sum()) // 512)
    plan = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed")
    check_plan(plan, sizes, 512, fitbatch.SumCost())
    assert len(plan) == sum(t for t, _ in patterns)
    assert len(plan) <= -(-int(sizes.sum()) // 512) * (1 + PD.NEAR_BOUND)
    again = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed")
    assert plan.to_lists() == again.to_lists()
    other = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", epoch=1)
    assert len(other) == len(plan) and other.to_lists() != plan.to_lists()
    # the same pattern batches hold other samples: partners change between epochs
    pairs = {frozenset(b) for b in plan.to_lists() if len(b) == 2}
    assert len(pairs & {frozenset(b) for b in other.to_lists() if len(b) == 2}) < 0.05 * len(pairs)
    fixed = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", shuffle=False)
    check_plan(fixed, sizes, 512, fitbatch.SumCost())
    assert fixed.to_lists() == fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", shuffle=False).to_lists()


@pytest.mark.parametrize(("seed", "distinct"), [(5, 30), (6, 12)])
def test_many_samples_per_size_pack_on_the_quick_patterns_or_first_fit_whichever_is_fewer(seed, distinct):
    # 70,000 samples over a few lengths: the histogram path applies; the quick patterns are far
    # from ceil(tokens / budget) (many lengths over half the budget) but kept if fewer than first fit
    from fitbatch._kernels.histogram import histogram_plan

    rng = np.random.default_rng(seed)
    values = rng.choice(np.arange(1, 513), distinct, replace=False)
    sizes = rng.choice(values, 70_000).astype(np.float64)
    counts = np.bincount(sizes.astype(np.int64), minlength=513)
    quick = PD._batches(PD.quick_patterns(counts, 512))
    first_fit = int(histogram_plan(np.sort(sizes)[::-1].astype(np.uint16), 512.0)[1].size)
    plan = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed")
    check_plan(plan, sizes, 512, fitbatch.SumCost())
    assert len(plan) == min(quick, first_fit)
    again = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed")
    assert plan.to_lists() == again.to_lists()
    other = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", epoch=1)
    assert len(other) == len(plan) and other.to_lists() != plan.to_lists()
    fixed = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", shuffle=False)
    check_plan(fixed, sizes, 512, fitbatch.SumCost())


@pytest.mark.parametrize(
    ("n", "top", "strategy"),
    [
        (70_000, 30, fitbatch.Packed()),  # one pool, many samples per size: first fit on the histogram
        (30_000, 4000, fitbatch.Packed(pool_size=4096)),  # pools of 16-bit keys, loose ends packed again
        (30_000, 4000, fitbatch.Packed()),  # one pool of keys
    ],
)
def test_packed_sum_measures_are_the_batches_own(n, top, strategy):
    """The packer hands the plan each batch's longest and total (from the histogram's runs or
    the keys in batch order): they are the batches' own, batch for batch."""
    sizes = np.minimum(np.random.default_rng(n + top).geometric(3.0 / top, n), top).astype(np.int64)
    plan = fitbatch.plan_batches(sizes, 16384, cost="sum", strategy=strategy, epoch=1)
    batches = list(plan)
    assert np.array_equal(plan.costs, [float(sizes[b].sum()) for b in batches])
    assert np.array_equal(plan.real_units, plan.costs)
    assert np.array_equal(plan.padded_units, [float(b.size * sizes[b].max()) for b in batches])
