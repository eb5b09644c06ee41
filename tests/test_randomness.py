"""randomness= on Pooled and Buckets (issue #18): every plan contract holds for the new
options, and the knob trades padding for fresh batch partners on real length sets."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from contracts import COSTS, check_plan, repeat_rate
from hypothesis import given, settings
from hypothesis import strategies as st

import fitbatch
from fitbatch import BudgetBatchSampler
from fitbatch.strategies import _base, _lattice, _mixing

KNOBS = (0.02, 0.3, 1.0, "auto", None)


def _strategy(kind: str, randomness):
    if kind == "pooled":
        return fitbatch.Pooled(pool_size=64, randomness=randomness)
    return fitbatch.Buckets(randomness=randomness)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 90), min_size=0, max_size=400),
    frac=st.booleans(),
    kind=st.sampled_from(["pooled", "buckets"]),
    randomness=st.sampled_from(KNOBS),
    cost=st.sampled_from(sorted(COSTS)),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 3),
)
def test_contract_holds_for_every_randomness(sizes, frac, kind, randomness, cost, seed, epoch):
    values = np.asarray(sizes, dtype=np.float64)
    if frac:
        values = values + np.random.default_rng(seed).random(values.size)
    strategy = _strategy(kind, randomness)
    kw = dict(cost=COSTS[cost], strategy=strategy, seed=seed, epoch=epoch, oversized="single")
    plan = fitbatch.plan_batches(values, 100.0, **kw)
    check_plan(
        plan, values, 100.0, COSTS[cost], oversized="single"
    )  # each sample once, every batch within budget
    again = fitbatch.plan_batches(values, 100.0, **kw)
    assert again.to_lists() == plan.to_lists(), "same (seed, epoch) -> same plan"


@pytest.mark.parametrize("kind", ["pooled", "buckets"])
@pytest.mark.parametrize("k", [0, 3])
def test_resume_with_randomness(kind, k):
    sizes = np.random.default_rng(4).integers(1, 200, 900)
    kw = dict(strategy=_strategy(kind, 0.1), seed=5, num_replicas=1, rank=0)
    sampler = BudgetBatchSampler(sizes, 1000, **kw)
    sampler.set_epoch(1)
    full = list(sampler)
    it = iter(sampler)
    assert [next(it) for _ in range(k)] == full[:k]
    state = json.loads(json.dumps(sampler.state_dict()))
    fresh = BudgetBatchSampler(sizes, 1000, **kw)
    fresh.load_state_dict(state)
    assert list(fresh) == full[k:]


@pytest.mark.parametrize(
    "bad, err", [(0.0, ValueError), (1.5, ValueError), ("high", TypeError), (True, TypeError)]
)
@pytest.mark.parametrize("cls", [fitbatch.Pooled, fitbatch.Buckets])
def test_randomness_is_validated(cls, bad, err):
    with pytest.raises(err, match="randomness"):
        cls(randomness=bad)


def _quality(sizes, strategy):
    p0 = fitbatch.plan_batches(sizes, 16384.0, strategy=strategy, epoch=0, oversized="skip")
    p1 = fitbatch.plan_batches(sizes, 16384.0, strategy=strategy, epoch=1, oversized="skip")
    return p0.stats().padding_efficiency, repeat_rate(p0, p1, sizes.size), p0.stats().max_fill


@pytest.mark.parametrize("kind", ["pooled", "buckets"])
def test_knob_trades_padding_for_randomness(functions, kind):
    sizes = functions[np.random.default_rng(0).integers(0, functions.size, 20_000)].astype(
        np.float64
    )
    points = [
        _quality(sizes, _strategy(kind, r) if kind == "buckets" else fitbatch.Pooled(randomness=r))
        for r in (None, 0.3, 0.05)
    ]
    effs, repeats, fills = zip(*points)
    assert repeats[0] > 0.3, (
        "randomness=None (narrowest levels) composes the same batches often at 20k"
    )
    assert repeats[0] > repeats[1] > repeats[2], repeats
    assert effs[1] > effs[2], (
        effs
    )  # (buckets' None is the older min_batches fitting, not the tightest)
    assert repeats[2] < 0.1 and max(fills) <= 1.0


def test_auto_beats_lhotse_point_on_functions_20k(functions):
    """lhotse DynamicBucketingSampler (30 buckets), same sizes: eff 0.905, repeat 0.228, 1.185x."""
    sizes = functions[np.random.default_rng(0).integers(0, functions.size, 20_000)].astype(
        np.float64
    )
    eff, rep, fill = _quality(sizes, "buckets")
    ref = len(fitbatch.plan_batches(sizes, 16384.0, strategy="sorted"))
    n = len(fitbatch.plan_batches(sizes, 16384.0, strategy="buckets"))
    assert eff >= 0.905 and rep <= 0.228 and n <= 1.05 * ref and fill <= 1.0


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=60), seed=st.integers(0, 99))
def test_repeat_rate_counts_pairs_like_brute_force(sizes, seed):
    kw = dict(strategy=fitbatch.Pooled(randomness=0.3), seed=seed)
    a = fitbatch.plan_batches(sizes, 40, **kw)
    b = fitbatch.plan_batches(sizes, 40, epoch=1, **kw)
    together_b = {
        frozenset((i, j)) for batch in b.to_lists() for i in batch for j in batch if i < j
    }
    pairs_a = [frozenset((i, j)) for batch in a.to_lists() for i in batch for j in batch if i < j]
    want = sum(p in together_b for p in pairs_a) / len(pairs_a) if pairs_a else 0.0
    assert fitbatch.plan.repeat_rate(a, b) == pytest.approx(want, abs=1e-12)
    assert fitbatch.plan.epoch_repeat_rate(sizes, 40, **kw) == pytest.approx(want, abs=1e-12)


def test_epoch_repeat_rate_refuses_epoch():
    with pytest.raises(TypeError, match="epochs="):
        fitbatch.plan.epoch_repeat_rate([1, 2, 3], 4, epoch=2)


def test_epoch_repeat_rate_averages_consecutive_pairs(functions):
    """pairs=k is the mean of the pairs (a, b), (a + 1, b + 1), ...; one pair by default."""
    sizes = functions[:8000]
    kw = dict(strategy=fitbatch.Pooled(randomness=0.05), seed=3)
    plans = [fitbatch.plan_batches(sizes, 16384, epoch=e, **kw) for e in range(2, 7)]
    each = [fitbatch.plan.repeat_rate(plans[k], plans[k + 1]) for k in range(4)]
    assert fitbatch.plan.epoch_repeat_rate(sizes, 16384, epochs=(2, 3), pairs=4, **kw) == pytest.approx(np.mean(each), abs=1e-12)
    assert fitbatch.plan.epoch_repeat_rate(sizes, 16384, epochs=(2, 3), **kw) == pytest.approx(each[0], abs=1e-12)


@pytest.mark.parametrize("pairs", [0, -1, 1.5, True, "2"])
def test_epoch_repeat_rate_refuses_bad_pairs(pairs):
    with pytest.raises(ValueError, match="pairs must be a whole number >= 1"):
        fitbatch.plan.epoch_repeat_rate([1, 2, 3], 4, pairs=pairs)


# ------------------------------------------------- level boundaries that move every epoch


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    cuts=st.sets(st.integers(1, 39), max_size=8),
    shift=st.floats(0.0, 0.999),
)
def test_shifted_levels_stay_contiguous_and_in_order(counts, cuts, shift):
    """Moving the boundaries keeps levels contiguous runs of keys in size order and moves each
    boundary at most half a level either way."""
    from fitbatch.strategies._mixing import shift_levels

    keys = np.repeat(np.arange(len(counts), dtype=np.uint16), counts)
    if keys.size == 0:
        return
    edges = np.arange(1, len(counts) + 1, dtype=np.float64)
    level = np.searchsorted(np.array(sorted(c for c in cuts if c < len(counts))), np.arange(len(counts)), "right")
    lut = level.astype(np.uint16)
    tops = np.zeros(int(level.max()) + 1)
    np.maximum.at(tops, level[keys], edges[keys])
    new, new_tops = shift_levels(keys, edges, lut, tops, shift)
    present = np.flatnonzero(np.bincount(keys))
    old_l, new_l = lut[present].astype(int), new[present].astype(int)
    assert np.all(np.diff(new_l) >= 0), "levels stay in size order"
    # a cut between keys that no sample has makes an empty level (a fit never does): count
    # moves over the levels that hold samples
    rank = {level: r for r, level in enumerate(np.unique(old_l).tolist())}
    assert set(new_l.tolist()) <= set(rank), "keys move to levels that held samples"
    moved = np.array([rank[b] for b in new_l.tolist()]) - np.array([rank[a] for a in old_l.tolist()])
    assert np.all(np.abs(moved) <= 1), "a key moves at most one level"
    weight = np.bincount(keys)[present]
    for k in np.unique(old_l):
        own = weight[old_l == k].sum()
        assert weight[(old_l == k) & (new_l != k)].sum() <= own / 2 + weight.max(), "at most half a level leaves"
    for k in np.unique(new_l):
        assert new_tops[k] == edges[present[new_l == k]].max()


def test_boundaries_turn_by_the_golden_ratio_each_epoch():
    from fitbatch.strategies._mixing import TURN, level_shift

    shifts = [level_shift(7, e) for e in range(6)]
    steps = np.diff(shifts) % 1.0
    assert np.allclose(steps, TURN)
    assert level_shift(7, 0) != level_shift(8, 0), "the start is keyed by the seed"


@pytest.mark.parametrize("continuous", [False, True])
def test_few_batches_still_mix(functions, continuous):
    """An epoch of ~20 batches (3,000 real function lengths) gets levels of 0.6 of a batch that the
    moving boundaries mix: the same batches no longer come back every epoch, for one batch more
    at most."""
    rng = np.random.default_rng(0)
    sizes = functions[rng.integers(0, functions.size, 3000)].astype(np.float64)
    if continuous:
        sizes += rng.random(sizes.size)
    narrow = _quality(sizes, fitbatch.Pooled(randomness=None))
    auto = _quality(sizes, fitbatch.Pooled())
    assert narrow[1] > 0.9, narrow
    assert auto[1] < 0.6 * narrow[1], (auto, narrow)
    ref = len(fitbatch.plan_batches(sizes, 16384.0, strategy="sorted"))
    assert len(fitbatch.plan_batches(sizes, 16384.0)) <= ref + 1 and auto[2] <= 1.0
    assert auto[0] >= narrow[0] - 0.05


@pytest.mark.parametrize("target", [0.1, 0.02])
def test_measured_repeat_lands_near_the_knob(pytokens, target):
    sizes = pytokens[np.random.default_rng(0).integers(0, pytokens.size, 20_000)].astype(np.float64)
    rep = _quality(sizes[sizes <= 16384], fitbatch.Pooled(randomness=target))[1]
    assert 0.6 * target <= rep <= 1.2 * target, rep


@pytest.mark.parametrize("n", [20_000, 200_000])
def test_auto_spends_more_batches_on_smaller_sets(pytokens, n):
    """Under 100,000 samples "auto" buys a lower repeat rate with up to 5 % more batches than exact
    sorting (a small set is seen for many epochs); above it, less than 2 %."""
    sizes = pytokens[np.random.default_rng(0).integers(0, pytokens.size, n)].astype(np.float64)
    sizes = sizes[sizes <= 16384]
    eff, rep, fill = _quality(sizes, fitbatch.Pooled())
    ratio = len(fitbatch.plan_batches(sizes, 16384.0)) / len(fitbatch.plan_batches(sizes, 16384.0, strategy="sorted"))
    assert fill <= 1.0
    if n < 100_000:  # (epoch 1 came to 1.06x and is fitted again within 1.05x: 0.0072 repeat)
        assert rep <= 0.008 and 1.02 < ratio <= 1.05 and eff >= 0.95, (eff, rep, ratio)
    else:
        assert rep <= 0.007 and ratio <= 1.02 and eff >= 0.98, (eff, rep, ratio)


def test_auto_reaches_its_allowance_on_continuous_sizes(pytokens):
    """The secant for "auto" may land within its 5 % tolerance yet just over the strict 5 %
    ceiling: it must then go on, not fall back to a far earlier fit. On 10,000 real pytokens with
    continuous sizes the first such landing (0.0525 excess against 0.05) used to be discarded for
    a fit spending 1.4 % (repeat 0.032; lhotse's DynamicBucketingSampler repeats 0.011 there).
    Epoch 1 aims as high, lands at 1.06x and is fitted again 3 % lower until within 1.05x
    (repeat 0.015 against epoch 0: 0.0095 over the allowance)."""
    rng = np.random.default_rng(0)
    sizes = pytokens[rng.integers(0, pytokens.size, 10_000)] + np.random.default_rng(1).random(10_000)
    sizes = sizes[sizes <= 16384]
    eff, rep, fill = _quality(sizes, fitbatch.Pooled())
    sorted_count = len(fitbatch.plan_batches(sizes, 16384.0, strategy="sorted"))
    ratios = [len(fitbatch.plan_batches(sizes, 16384.0, epoch=e)) / sorted_count for e in (0, 1)]
    assert fill <= 1.0
    assert rep <= 0.02 and 1.03 < ratios[0] <= 1.05 and ratios[1] <= 1.05 and eff >= 0.95, (eff, rep, ratios)


@pytest.mark.parametrize("strategy", ["pooled", "buckets"])
@pytest.mark.parametrize("name", ["functions", "pytokens"])
@pytest.mark.parametrize("n", [10_000, 20_000, 40_000])
def test_auto_keeps_within_five_percent_of_sorting_every_epoch(strategy, name, n, functions, pytokens):
    """"auto" aims at up to 5 % more batches than exact sorting on average; an epoch whose level
    boundaries moved least used to land over it (20,000 function lengths: 1.056x in one of eight
    epochs, pytokens 1.061x; buckets 1.074x) and is now fitted again until within it. Eight
    epochs each."""
    base = functions if name == "functions" else pytokens
    sizes = base[np.random.default_rng(n).integers(0, base.size, n)].astype(np.float64)
    sizes = sizes[sizes <= 16384]
    sorted_count = len(fitbatch.plan_batches(sizes, 16384.0, strategy="sorted"))
    counts = [len(fitbatch.plan_batches(sizes, 16384.0, strategy=strategy, epoch=e)) for e in range(8)]
    assert max(counts) <= math.floor(1.05 * sorted_count + 1e-9), (counts, sorted_count)
    if strategy == "pooled":  # still mixing: the allowance is spent, not dropped
        assert min(counts) > sorted_count  # (buckets plans few-batch leftovers sorted)


@pytest.mark.parametrize("budget", [16384, 65536])
def test_auto_few_batch_levels_keep_the_batch_allowance(functions, budget):
    """With a few dozen batches one more batch is 2-5 %: "auto" narrows its few-batch levels until
    an epoch spends at most ``auto_excess(n)`` more batches than exact sorting (20,000 real
    function lengths at 65,536 tokens used 31 batches against 29 sorted, 1.069x; a long tail of
    10,000 synthetic sizes 1.087x)."""
    import math

    from fitbatch.strategies._mixing import auto_excess

    tail = np.clip(np.round(np.random.default_rng(0).lognormal(3.0, 1.0, 10_000)), 2, None)
    real = functions[np.random.default_rng(1).integers(0, functions.size, 20_000)].astype(np.float64)
    for sizes in (real, tail):
        n_sorted = len(fitbatch.plan_batches(sizes, budget, strategy="sorted"))
        allowed = math.floor((1 + auto_excess(sizes.size)) * n_sorted + 1e-9)
        for epoch in range(3):
            plan = fitbatch.plan_batches(sizes, budget, seed=3, epoch=epoch)
            assert len(plan) <= allowed, (sizes.size, epoch, len(plan), n_sorted)
            assert plan.n_samples == sizes.size and plan.costs.max() <= budget


# --------------------------------------------------------------------------- lattice orders


def _pair_repeats(sizes, seeds, strategy="pooled", pairs=5):
    """Mean co-batch repeat over ``pairs`` consecutive epoch pairs of ``strategy`` ("auto"), and
    the mean padding efficiency, over ``seeds``."""
    reps, effs = [], []
    for seed in seeds:
        plans = [
            fitbatch.plan_batches(sizes, 16384.0, seed=seed, epoch=e, strategy=strategy) for e in range(pairs + 1)
        ]
        reps += [repeat_rate(plans[e], plans[e + 1], sizes.size) for e in range(pairs)]
        effs += [p.stats().padding_efficiency for p in plans]
    return float(np.mean(reps)), float(np.mean(effs))


@pytest.mark.parametrize("strategy", ["pooled", "buckets"])
@pytest.mark.parametrize("n", [10_000, 20_000])
def test_auto_lattice_order_parts_last_epochs_partners(pytokens, n, strategy, monkeypatch):
    """Inside its levels "auto" lays samples out on a lattice whose consecutive epochs share no
    short vector (``strategies/_lattice.py``): on real file lengths it repeats about half the
    pairs a random order inside the same levels repeats, at the same padding. Over seeds 0-3 and
    five epoch pairs: 10k 0.0079 against 0.0166, 20k 0.0046 against 0.0085 (lhotse's
    DynamicBucketingSampler repeats 0.011 and 0.0055 there, `bench/plan.py --pairs 5`). `Buckets`
    fits the same levels and lays them out the same way."""
    sizes = pytokens[np.random.default_rng(0).integers(0, pytokens.size, n)].astype(np.float64)
    sizes = sizes[sizes <= 16384]
    lattice, lattice_eff = _pair_repeats(sizes, range(4), strategy)
    monkeypatch.setattr(_lattice, "MAX_SAMPLES", 0)  # random order inside levels
    shuffled, shuffled_eff = _pair_repeats(sizes, range(4), strategy)
    assert lattice <= 0.7 * shuffled, (lattice, shuffled)
    assert abs(lattice_eff - shuffled_eff) <= 0.005, (lattice_eff, shuffled_eff)


def test_lattice_order_is_not_used_where_it_cannot_help(monkeypatch):
    """Few-batch epochs, explicit ``randomness=`` (which lands on the rate asked for), unshuffled
    plans and sets over ``MAX_SAMPLES`` keep a random order (or the index order) inside levels."""
    sizes = np.random.default_rng(3).integers(1, 400, 5_000).astype(np.float64)
    calls = []
    real = _lattice.lattice_order

    def spy(keys, seed, epoch, by_rank=None):
        calls.append(keys.size)
        return real(keys, seed, epoch, by_rank)

    monkeypatch.setattr(_lattice, "lattice_order", spy)
    fitbatch.plan_batches(sizes, 2048.0, epoch=1)  # 5,000 samples of ~200 in 2,048: many batches
    assert calls, "auto, shuffled, many batches: the lattice order"
    calls.clear()
    fitbatch.plan_batches(sizes, 2048.0, epoch=1, strategy=fitbatch.Pooled(randomness=0.1))
    fitbatch.plan_batches(sizes, 2048.0, epoch=1, shuffle=False)
    fitbatch.plan_batches(sizes[:300], 16384.0, epoch=1)  # a few batches
    assert not calls


@settings(max_examples=40, deadline=None)
@given(
    modulus=st.sampled_from([11, 13, 101, 257, 1009]),
    draws=st.lists(st.integers(1, 10**6), min_size=1, max_size=12),
    partners=st.lists(st.integers(1, 10**6), min_size=1, max_size=2),
)
def test_best_multiplier_is_the_candidate_of_greatest_merit(modulus, draws, partners):
    """The pruned search returns what scoring every candidate over every difference returns, and
    ``merit`` is its definition: the least ``|d| max(|a d|_M, |p d|_M)**2`` over ``M**2``."""
    candidates = np.array([x % (modulus - 1) + 1 for x in draws], dtype=np.int64)
    partners = [p % (modulus - 1) + 1 for p in partners]

    def dist(x):
        r = x % modulus
        return max(min(r, modulus - r), 1)

    brute = [
        min(d * max(dist(a * d), dist(p * d)) ** 2 for d in range(1, modulus // 2 + 1) for p in partners) / modulus**2
        for a in candidates.tolist()
    ]
    assert np.allclose(_lattice.merit(candidates, partners, modulus), brute)
    assert _lattice.best_multiplier(candidates, partners, modulus) == int(candidates[int(np.argmax(brute))])


@settings(max_examples=40, deadline=None)
@given(
    keys=st.lists(st.integers(0, 40), min_size=1, max_size=300),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 9),
)
def test_lattice_order_lays_every_sample_once_the_same_way_every_time(keys, seed, epoch):
    k = np.asarray(keys, dtype=np.uint16)
    order = _lattice.lattice_order(k, seed, epoch)
    assert sorted(order.tolist()) == list(range(k.size))
    assert (order == _lattice.lattice_order(k, seed, epoch)).all()


def test_searched_epochs_keep_their_neighbours_apart():
    """Every searched multiplier beats the median draw against its neighbours (a random multiplier
    pair, unsearched, often has a short vector: 0.0340 of pairs met again in one such pair)."""
    m = _lattice.prime_at_least(20_000)
    a = [_lattice.multiplier(0, e, m) for e in range(10)]
    draws = np.random.default_rng(0).integers(1, m, size=64)
    for e in range(9):
        got = _lattice.merit(np.array([a[e + 1]]), [a[e]], m)[0]
        assert got > np.median(_lattice.merit(draws, [a[e]], m)), e


def test_level_fits_and_sorted_counts_are_kept_across_epochs_and_change_no_plan(functions, monkeypatch):
    """The level fit and the sorted batch count depend on the sizes and settings, not on the
    epoch: a ``Sizes`` keeps them (the latest eight settings, read-only), planning again fits
    nothing, and every plan equals the plan of fresh sizes, which fit again."""
    sizes = functions[np.random.default_rng(2).integers(0, functions.size, 6_000)].astype(np.float64)
    sizes = sizes[sizes <= 1000]
    held = fitbatch.as_sizes(sizes)
    fits = []
    real = _mixing._fit_levels
    monkeypatch.setattr(_mixing, "_fit_levels", lambda *a, **k: fits.append(1) or real(*a, **k))
    for budget in (2048.0, 16384.0):  # many batches (lattice), few batches (recut)
        for epoch in range(4):
            kept = fitbatch.plan_batches(held, budget, epoch=epoch)
            assert kept.to_lists() == fitbatch.plan_batches(sizes, budget, epoch=epoch).to_lists()
            before = len(fits)
            assert fitbatch.plan_batches(held, budget, epoch=epoch).to_lists() == kept.to_lists()
            assert len(fits) == before, "planned again: no fit"
    memo = held.cached("remembered level fit", dict)
    assert memo and all(not lut.flags.writeable and not tops.flags.writeable for lut, tops, _ in memo.values())
    assert held.cached("remembered sorted count", dict)  # integer sizes: every size its own key
    assert held.cached("remembered lattice ranks", dict)  # the many-batch epochs' lattice layout
    for k in range(12):
        fitbatch.plan_batches(held, 1000.0 + 50 * k, epoch=5)
    assert len(memo) == _base.REMEMBERED


@pytest.mark.parametrize("few", [True, False])
def test_an_epoch_no_refit_brings_within_its_allowance_takes_the_sorted_plan(few):
    """``within_allowance``'s last resort: a plan over its allowance (few batches: one more than
    sorting; else ``AUTO_MAX_EXCESS``) that no narrower or thriftier fit improves is replaced
    by the sorted plan, ties still shuffled, so "never more in any epoch" holds."""
    from fitbatch.sizes import as_sizes
    from fitbatch.strategies._base import Context, Result
    from fitbatch.strategies._ordered import _allowance, within_allowance

    sizes = np.random.default_rng(0).integers(1, 90, 300).astype(np.float64)
    ctx = Context(as_sizes(sizes), 1000.0, fitbatch.PaddedCost(), None, 1, True, 0, 0)
    exact = fitbatch.Sorted().plan(ctx)
    n = sizes.size
    lavish = Result(np.arange(n), np.arange(0, n, 2), np.zeros(n // 2, bool))  # two samples a batch
    tried = []

    def refit(width, scale):
        tried.append((width, scale))
        return lavish

    got = within_allowance(ctx, lavish, few, refit, _allowance(ctx, few))
    assert tried, "it tried to fit again first"
    assert got.order.tolist() == exact.order.tolist() and got.starts.tolist() == exact.starts.tolist()
    one_more = Result(exact.order, np.append(exact.starts, n - 1), np.zeros(exact.starts.size + 1, bool))
    kept = within_allowance(ctx, one_more, True, refit, _allowance(ctx, True))
    assert kept is one_more, "a few-batch epoch may keep one batch more than sorting"


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    spare=st.integers(0, 40),
    cost=st.sampled_from(sorted(COSTS)),
    seed=st.integers(0, 2**16),
)
def test_split_densest_spends_the_spare_on_the_batches_of_most_samples(counts, spare, cost, seed):
    """Each batch of more than ``t`` samples is cut into ``ceil(c / t)`` near-equal parts, for the
    least ``t`` within the allowance: the order is kept, no part costs more than its batch, no
    batch is added past the allowance, and no batch of ``t`` or fewer samples is cut."""
    from fitbatch.strategies._base import Context, Result
    from fitbatch.strategies._ordered import split_densest

    n = sum(counts)
    sizes = np.random.default_rng(seed).integers(1, 9, n).astype(np.float64)
    model = fitbatch.costs.resolve_cost(COSTS[cost])
    ctx = Context(fitbatch.as_sizes(sizes), 1e9, model, None, 1, True, seed, 0)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    order = np.random.default_rng(seed + 1).permutation(n).astype(np.int64)
    before = Result(order, starts, np.zeros(starts.size, bool))
    after = split_densest(ctx, before, starts.size + spare)
    assert after.order is before.order and after.starts[0] == 0
    assert starts.size <= after.starts.size <= starts.size + spare
    assert np.all(np.diff(after.starts) > 0) and set(starts.tolist()) <= set(after.starts.tolist())
    parts = np.diff(np.searchsorted(after.starts, np.append(starts, n)))  # parts of each batch
    c = np.asarray(counts)
    t = next(t for t in range(1, int(c.max()) + 1) if int(np.sum(np.ceil(c / t) - 1)) <= spare)  # the oracle
    assert np.array_equal(parts, np.ceil(c / t).astype(np.int64))
    ends = np.append(after.starts[1:], n)
    assert np.all(np.abs((ends - after.starts) - np.repeat(c / parts, parts)) < 1.0)  # near-equal parts
    for b in range(starts.size):  # a part costs at most its batch (the cost is monotone)
        a, z = starts[b], starts[b] + counts[b]

        def cost_of(p, q):
            piece = sizes[order[p:q]]
            return float(model.evaluate(np.array([q - p]), np.array([piece.max()]), np.array([piece.sum()]))[0])

        inner = after.starts[(after.starts >= a) & (after.starts < z)]
        assert all(cost_of(p, q) <= cost_of(a, z) + 1e-9 for p, q in zip(inner, np.append(inner[1:], z)))


def _split_off(monkeypatch):
    from fitbatch.strategies import _ordered

    monkeypatch.setattr(_ordered, "split_densest", lambda ctx, result, allowed: result)


def test_auto_splits_the_densest_batches_within_its_allowance(monkeypatch):
    """A long tail of duplicates (8 x Zipf(1.6), 20,000 samples): the level fit alone cannot mix
    the thousands of samples of size 8 (the next size pads them twice over); cutting their
    batches in parts costs no padding and lowers the repeat rate, within 5 % more batches than
    exact sorting (mean of three epoch pairs: 0.076 -> 0.059 when measured; lhotse 0.037 at
    1.13x the batches)."""
    sizes = 8.0 * np.random.default_rng(0).zipf(1.6, 20_000)
    sizes = np.minimum(sizes, 16384.0)
    sorted_count = len(fitbatch.plan_batches(sizes, 16384.0, strategy="sorted"))

    def measure():
        plans = [fitbatch.plan_batches(sizes, 16384.0, epoch=e) for e in range(4)]
        rep = np.mean([repeat_rate(plans[e], plans[e + 1], sizes.size) for e in range(3)])
        return rep, max(len(p) for p in plans), min(p.stats().padding_efficiency for p in plans)

    rep, most, eff = measure()
    _split_off(monkeypatch)
    rep0, most0, eff0 = measure()
    assert most <= math.floor(1.05 * sorted_count + 1e-9) and most > most0, (most, most0, sorted_count)
    assert rep < 0.9 * rep0 and eff >= eff0 - 1e-9, (rep, rep0, eff, eff0)


@pytest.mark.parametrize("n", [20_000, 100_000])
def test_auto_never_mixes_two_sizes_that_each_fill_batches(n):
    """Four whole sizes, each filling many batches: "auto" levels never put two in one batch
    (no padding at all; a cut at each border costs at most one batch), as a sampler with one
    bucket per size does; the batches still change between epochs."""
    sizes = np.random.default_rng(0).choice([32.0, 64, 128, 512], n, p=[0.4, 0.3, 0.2, 0.1])
    plans = [fitbatch.plan_batches(sizes, 16384.0, epoch=e) for e in range(3)]
    sorted_count = len(fitbatch.plan_batches(sizes, 16384.0, strategy="sorted"))
    fewest = sum(math.ceil(int(np.sum(sizes == v)) / (16384 // v)) for v in (32, 64, 128, 512))
    for plan in plans:
        assert all(np.unique(sizes[b]).size == 1 for b in plan)
        assert plan.stats().padding_efficiency == 1.0
        assert len(plan) <= math.floor(1.05 * sorted_count + 1e-9) and len(plan) >= fewest
    assert repeat_rate(plans[0], plans[1], n) < 0.1
