"""fitbatch.steps.partition: one step's sequences into capped, balanced micro-batches per rank.

Every guarantee is recomputed here from the sizes and the cost model, one micro-batch at a time
(``check_partition``), over sizes, world sizes, cost models, weights, groups and options that
``hypothesis`` draws; exact cases pin small splits; real lengths check the balance.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference as R
from hypothesis import given
from hypothesis import strategies as st

from fitbatch.costs import PaddedCost, PaddedPolynomial, SumCost
from fitbatch.steps import Partition, partition

COSTS = {
    "sum": SumCost(),
    "padded": PaddedCost(),
    "polynomial": PaddedPolynomial(fixed=5.0, linear=1.0, per_token=1.0, quadratic=0.01),
}
WORKLOAD = staticmethod(lambda L: 24576 * L + L**2)


def check_partition(p: Partition, sizes, budget, model, *, world, micro_multiple=1, min_micro=None,
                    groups=None, keep_groups="rank", oversized="error", weights=None, loss=None,
                    cp_size=None) -> None:
    """Every guarantee of ``partition``, recomputed from the inputs."""
    sizes = np.asarray(sizes, dtype=np.float64)
    counted = sizes if cp_size is None else np.ceil(sizes / (2 * cp_size)) * (2 * cp_size)
    cost = R.model_cost(model)
    w = counted if weights is None else np.asarray(weights(counted) if callable(weights) else weights, float)
    assert len(p) == world and p.world == world and p.ranks == tuple(range(world))
    m = p.n_micro
    assert m % micro_multiple == 0 and m >= (min_micro or 0) and m >= p.lower_bound
    seen = np.zeros(sizes.size, dtype=np.int64)
    rank_of = np.full(sizes.size, -1)
    micro_of = np.full(sizes.size, -1)
    samples, tokens, loss_tokens = np.zeros(m), np.zeros(m), np.zeros(m)
    workload = np.zeros((world, m))
    empty = over = 0
    for r in range(world):
        batches = p[r]
        assert len(batches) == m
        for j, b in enumerate(batches):
            assert b.dtype == np.int64 and np.all(np.diff(b) > 0)
            seen[b] += 1
            rank_of[b], micro_of[b] = r, j
            if b.size == 0:
                empty += 1
                continue
            c = cost(b.size, counted[b].max(), counted[b].sum())
            if c > budget:  # only an oversized sequence (or group) alone may exceed the cap
                assert oversized == "single"
                alone = b if keep_groups == "micro" and groups is not None else b[:1]
                assert b.size == alone.size and cost(b.size, counted[b].max(), counted[b].sum()) == c
                over += 1
            samples[j] += b.size
            tokens[j] += sizes[b].sum()
            loss_tokens[j] += (sizes if loss is None else np.asarray(loss, float))[b].sum()
            workload[r, j] += w[b].sum()
    skipped = set(p.skipped.tolist())
    assert all(seen[i] == (0 if i in skipped else 1) for i in range(sizes.size)), "each sequence exactly once"
    if oversized != "skip":
        assert not skipped
    for i in skipped:
        assert cost(1, counted[i], counted[i]) > budget or keep_groups == "micro"
    assert p.n_oversized == over and p.n_empty == empty
    np.testing.assert_array_equal(p.step_samples, samples)
    np.testing.assert_allclose(p.step_tokens, tokens)
    np.testing.assert_allclose(p.step_loss_tokens, loss_tokens)
    np.testing.assert_allclose(p.workload, workload, rtol=1e-9, atol=1e-9)
    slowest = workload.max(axis=0).sum() if m else 0
    assert p.efficiency == pytest.approx(workload.sum() / world / slowest if slowest else 1.0)
    assert 0 < p.efficiency <= 1 + 1e-12
    if groups is not None:
        ids = np.asarray(groups)
        for g in np.unique(ids):
            members = np.flatnonzero((ids == g) & (seen == 1))
            assert len(set(rank_of[members].tolist())) <= 1, "a group on one rank"
            if keep_groups == "micro":
                assert len(set(micro_of[members].tolist())) <= 1, "a group in one micro-batch"


# --------------------------------------------------------------------------- properties


@st.composite
def steps(draw):
    n = draw(st.integers(0, 120))
    top = draw(st.sampled_from([8, 100, 4000]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.ceil(rng.lognormal(math.log(top / 5), 1.0, n)), 1, top).astype(np.int64)
    return sizes, top, rng


@given(
    steps(),
    st.integers(1, 9),
    st.sampled_from(sorted(COSTS)),
    st.sampled_from(["sizes", "workload", "model", "array"]),
    st.integers(1, 4),
    st.one_of(st.none(), st.integers(1, 6)),
    st.floats(1.0, 6.0),
)
def test_every_guarantee_holds(step, world, cost, weighting, micro_multiple, min_micro, slack) -> None:
    sizes, top, rng = step
    model = COSTS[cost]
    budget = float(math.ceil(R.model_cost(model)(1, top, top) * slack))
    weights = {"sizes": None, "workload": WORKLOAD, "model": PaddedPolynomial(quadratic=1.0),
               "array": rng.random(sizes.size) * 10}[weighting]
    p = partition(sizes, budget, world=world, weights=weights, cost=model, micro_multiple=micro_multiple,
                  min_micro=min_micro)
    check = weights.sample_cost if weighting == "model" else weights
    check_partition(p, sizes, budget, model, world=world, micro_multiple=micro_multiple, min_micro=min_micro,
                    weights=check)


@given(steps(), st.integers(1, 6), st.sampled_from(["rank", "micro"]), st.integers(1, 5), st.integers(0, 2**16))
def test_groups_stay_on_one_rank_or_in_one_micro_batch(step, world, keep, per_group, seed) -> None:
    sizes, top, _ = step
    groups = np.random.default_rng(seed).integers(0, max(1, sizes.size // per_group), sizes.size) * 7 - 3
    budget = float(top * (per_group + 1)) if keep == "micro" else float(top)
    p = partition(sizes, budget, world=world, groups=groups, keep_groups=keep, oversized="single")
    check_partition(p, sizes, budget, SumCost(), world=world, groups=groups, keep_groups=keep, oversized="single")


@given(steps(), st.integers(1, 5), st.sampled_from(["single", "skip"]), st.sampled_from(["sum", "padded"]))
def test_oversized_sequences_are_counted(step, world, oversized, cost) -> None:
    sizes, top, rng = step
    budget = float(max(1, top // 3))
    loss = rng.integers(0, 5, sizes.size)
    p = partition(sizes, budget, world=world, cost=cost, oversized=oversized, loss_sizes=loss)
    check_partition(p, sizes, budget, COSTS[cost], world=world, oversized=oversized, loss=loss)
    big = np.flatnonzero(sizes > budget)
    if oversized == "skip":
        np.testing.assert_array_equal(p.skipped, big)
    else:
        assert p.n_oversized == big.size


@given(steps(), st.integers(1, 5), st.integers(1, 4))
def test_cp_size_counts_lengths_padded_to_2cp(step, world, cp) -> None:
    sizes, top, _ = step
    budget = float(2 * cp * math.ceil(top / (2 * cp)) * 2)
    p = partition(sizes, budget, world=world, cp_size=cp)
    check_partition(p, sizes, budget, SumCost(), world=world, cp_size=cp)


@given(steps(), st.integers(1, 8))
def test_deterministic_and_near_the_bound(step, world) -> None:
    sizes, top, _ = step
    budget = float(4 * top)
    a, b = (partition(sizes, budget, world=world, weights=WORKLOAD) for _ in range(2))
    assert a.n_micro == b.n_micro
    np.testing.assert_array_equal(a.order, b.order)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    # sequences at most a quarter of the budget: the deal wastes at most a quarter of each bin
    assert a.n_micro <= max(a.lower_bound, math.ceil(sizes.sum() / (0.75 * budget) / world) + 1)


# --------------------------------------------------------------------------- exact cases


def test_the_cap_is_a_cap() -> None:
    """verl PR #7553's case: [7] * 8 under a cap of 8 must not pair two 7s."""
    p = partition([7] * 8, 8, world=1)
    assert p.n_micro == 8 and all(b.size == 1 for b in p[0])
    p = partition([7] * 8, 8, world=2, micro_multiple=3)
    assert p.n_micro == 6 and p.n_empty == 4 and p.lower_bound == 6


def test_a_small_step_exactly() -> None:
    p = partition([900, 700, 400, 300, 200, 100], 1000, world=2)
    assert [[b.tolist() for b in p[r]] for r in range(2)] == [[[0], [3, 4]], [[1], [2, 5]]]
    assert p.step_samples.tolist() == [2, 4] and p.step_tokens.tolist() == [1600.0, 1000.0]
    assert p.loss_tokens == 2600.0 and p.lower_bound == 2


def test_fewer_sequences_than_micro_batches_gives_empty_ones() -> None:
    p = partition([5, 3], 100, world=4, min_micro=2)
    assert p.n_micro == 2 and p.n_empty == 6
    assert sorted(i for r in range(4) for b in p[r] for i in b.tolist()) == [0, 1]


def test_an_empty_step() -> None:
    p = partition([], 10, world=3)
    assert p.n_micro == 0 and p[2] == [] and p.efficiency == 1.0
    p = partition([], 10, world=3, min_micro=2)
    assert p.n_micro == 2 and p.n_empty == 6


def test_balance_on_real_lengths(functions) -> None:
    """1,024 rollouts drawn from real lengths scaled to 8k tokens, 8 ranks: near-perfect balance."""
    rng = np.random.default_rng(0)
    sizes = np.minimum(functions[rng.choice(functions.size, 1024)] * 8, 8192)
    p = partition(sizes, 16384, world=8, weights=WORKLOAD)
    check_partition(p, sizes, 16384, SumCost(), world=8, weights=WORKLOAD)
    assert p.efficiency >= 0.97 and p.n_micro <= p.lower_bound + 1


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"world": 0}, ValueError, "world must be >= 1"),
        ({"world": 2.0}, TypeError, "world must be an int"),
        ({"world": 2, "micro_multiple": 0}, ValueError, "micro_multiple"),
        ({"world": 2, "weights": [1, 2]}, ValueError, "weights must have one entry per sequence"),
        ({"world": 2, "weights": [1, -2, 3]}, ValueError, r"weights must be finite and >= 0.*index 1"),
        ({"world": 2, "groups": [1, 2]}, ValueError, "groups must hold one id per sequence"),
        ({"world": 2, "keep_groups": "step"}, ValueError, "unknown keep_groups 'step'"),
        ({"world": 2, "oversized": "drop"}, ValueError, "unknown oversized 'drop'"),
        ({"world": 2, "cp_size": 0}, ValueError, "cp_size"),
    ],
)
def test_bad_options_name_the_parameter(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        partition([3, 4, 5], 10, **kwargs)


def test_an_oversized_sequence_is_an_error_by_default() -> None:
    with pytest.raises(ValueError, match=r"1 sequence cost more than budget=10 alone \(index 1 \(size 11.0\)\).*oversized='single'"):
        partition([3, 11, 5], 10, world=2)
    with pytest.raises(ValueError, match="1 group cost more"):
        partition([6, 6, 5], 10, world=2, groups=[0, 0, 1], keep_groups="micro")
