"""Bounded batch shapes (``max_shapes=K``): the length grid, the rows, and the plans that fit them."""

from __future__ import annotations

import doctest
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from contracts import COSTS, STRATEGIES, check_plan
from hypothesis import given
from hypothesis import strategies as st

import fitbatch
from fitbatch.cli._main import main
from fitbatch.plan import _shapes as S

SHAPE_COSTS = {name: COSTS[name] for name in ("padded", "polynomial", "function")}


def pick_shape(shapes: np.ndarray, count: int, longest: float) -> tuple[int, int]:
    """The collates' rule, written out: among shapes holding the batch, smallest length, then rows."""
    holding = [(int(r), int(L)) for r, L in shapes if r >= count and L >= longest]
    assert holding, f"no shape holds a batch of {count} samples, longest {longest}"
    rows, length = min(holding, key=lambda s: (s[1], s[0]))
    return rows, length


def brute_grid_cost(lengths: np.ndarray, counts: np.ndarray, k: int) -> float:
    """The least sum(count * grid length) over every grid of at most k of the lengths (containing the last)."""
    u, best = lengths.size, np.inf
    for r in range(1, min(k, u) + 1):
        for cuts in itertools.combinations(range(u - 1), r - 1):
            grid = lengths[[*cuts, u - 1]]
            best = min(best, float((grid[np.searchsorted(grid, lengths)] * counts).sum()))
    return best


def check_shapes(
    plan: fitbatch.BatchPlan,
    sizes: np.ndarray,
    k: int,
    budget: float,
    model,
    *,
    one_per_length: bool = True,
) -> None:
    """Every batch fits its shape, every shape fits the budget, and the shapes follow the rule."""
    shapes, shape_set = plan.shapes, plan.shape_set
    assert shapes is not None and shape_set is not None
    assert shapes.dtype == np.int64 and shapes.shape == (len(plan), 2)
    assert shape_set.dtype == np.int64 and 1 <= len(shape_set) <= k or len(sizes) == 0
    assert np.all(np.diff(shape_set[:, 1]) >= 0), "sorted by length"
    if one_per_length:
        assert np.all(np.diff(shape_set[:, 1]) > 0), "one shape per length"
    assert len({tuple(s) for s in shapes.tolist()}) <= k
    for batch, (rows, length) in zip(plan, shapes.tolist(), strict=True):
        longest = float(sizes[batch].max())
        assert len(batch) <= rows and longest <= length
        assert (rows, length) == pick_shape(shape_set, len(batch), longest)
        # the collates pad to the same shape (fitbatch.collate.pick_shape, the rule of make_hf_collate(shapes=))
        assert tuple(int(v) for v in fitbatch.collate.pick_shape(shape_set, len(batch), int(np.ceil(longest)))) == (rows, length)
        shape_cost = float(
            model.evaluate(
                np.array([rows], float), np.array([length], float), np.array([rows * length], float)
            )[0]
        )
        if shape_cost > budget:  # only a lone sample over the budget alone (oversized="single")
            assert (
                rows == 1 and len(batch) == 1 and float(model.sample_cost(sizes[batch])[0]) > budget
            )


# ---------------------------------------------------------------------------- the grid


@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=9, unique=True),
    counts=st.lists(st.integers(1, 20), min_size=9, max_size=9),
    k=st.integers(1, 6),
)
def test_optimal_lengths_is_the_least_padding_grid(lengths, counts, k):
    v = np.sort(np.array(lengths, dtype=np.float64))
    c = np.array(counts[: v.size], dtype=np.float64)
    grid = S.optimal_lengths(v, c, k)
    assert grid.size <= k and grid[-1] == v[-1] and set(grid) <= set(v)
    assert float((grid[np.searchsorted(grid, v)] * c).sum()) == brute_grid_cost(v, c, k)


def test_distinct_lengths_bins_many_lengths_and_still_covers_them():
    values = np.random.default_rng(3).integers(1, 10**7, 200_000).astype(np.float64)
    lengths, counts = S.distinct_lengths(values)
    assert lengths.size <= S.MAX_DISTINCT and counts.sum() == values.size
    assert np.all(np.diff(lengths) > 0) and lengths[-1] == values.max()
    # every value lies in the bin that stands for the next bin length: rounding up never shrinks it
    covered = lengths[np.searchsorted(lengths, values)]
    assert np.all(covered >= values) and np.all(covered <= values * 1.005 + 1)


def test_float_sizes_get_whole_lengths():
    shapes = S.shape_set(np.array([0.5, 1.25, 2.0, 7.01]), 100.0, 2, fitbatch.PaddedCost())
    assert shapes.tolist() == [[50, 2], [12, 8]]


@pytest.mark.parametrize("name", sorted(SHAPE_COSTS))
@pytest.mark.parametrize(("cap", "multiple"), [(None, 1), (40, 1), (None, 8), (30, 8)])
def test_shape_rows_are_the_most_that_fit(name, cap, multiple):
    model = SHAPE_COSTS[name]
    lengths = np.array([3.0, 17.0, 64.0, 250.0, 999.0, 5000.0])
    rows = S.shape_rows(lengths, model, 4096.0, cap, multiple)

    def fits(r, L):
        return model.evaluate(np.array([float(r)]), np.array([L]), np.array([r * L]))[0] <= 4096.0

    for r, L in zip(rows.tolist(), lengths.tolist(), strict=True):
        most = max(
            [m for m in range(1, 2000) if fits(m, L) and (cap is None or m <= cap)], default=1
        )
        expected = most - most % multiple if most >= multiple else most
        assert r == expected


# ---------------------------------------------------------------------------- plans


@given(
    sizes=st.lists(st.integers(1, 300), min_size=0, max_size=80),
    budget=st.integers(300, 5000),
    k=st.integers(2, 12),  # 1 with oversized samples is refused (test_oversized_samples_...)
    strategy=st.sampled_from(sorted(STRATEGIES)),
    cost=st.sampled_from(sorted(SHAPE_COSTS)),
    seed=st.integers(0, 2**16),
    epoch=st.integers(0, 3),
)
def test_every_batch_fits_its_shape_and_the_budget(sizes, budget, k, strategy, cost, seed, epoch):
    values, model = np.array(sizes, dtype=np.float64), SHAPE_COSTS[cost]

    def planned(e: int) -> fitbatch.BatchPlan:
        return fitbatch.plan_batches(
            values, budget, cost=model, strategy=STRATEGIES[strategy], max_shapes=k, seed=seed, epoch=e,
            oversized="single",
        )

    plan = planned(epoch)
    check_plan(plan, values, budget, model, oversized="single")
    check_shapes(plan, values, k, budget, model)
    again = planned(epoch)
    assert again.to_lists() == plan.to_lists() and np.array_equal(again.shapes, plan.shapes)
    other = planned(epoch + 1)
    assert np.array_equal(other.shape_set, plan.shape_set), "the same shapes every epoch"


@given(
    sizes=st.lists(st.floats(0.01, 90.0), min_size=1, max_size=80),
    k=st.integers(1, 8),
    cap=st.one_of(st.none(), st.integers(1, 40)),
    multiple=st.integers(1, 8),
    oversized=st.sampled_from(["single", "skip"]),
)
def test_float_sizes_caps_multiples_and_oversized(sizes, k, cap, multiple, oversized):
    values, model, budget = np.array(sizes), COSTS["padded"], 400.0
    plan = fitbatch.plan_batches(
        values,
        budget,
        max_shapes=k,
        max_batch_size=cap,
        batch_size_multiple=multiple,
        oversized=oversized,
    )
    check_plan(plan, values, budget, model, oversized=oversized, max_batch_size=cap)
    check_shapes(plan, values, k, budget, model)
    assert np.all(plan.shape_set[:, 0] <= (cap or np.inf))


def test_a_segments_uncut_last_batch_stays_within_its_shapes_rows():
    """batch_size_multiple cuts batches but not a segment's last one; it must still fit its shape."""
    values = np.array([1.0] * 6 + [45.0])
    plan = fitbatch.plan_batches(values, 400.0, max_shapes=1, batch_size_multiple=3, oversized="single")
    assert plan.shape_set.tolist() == [[6, 45]]  # 8 rows of 45 fit 400; cut to a multiple of 3
    assert sorted(len(b) for b in plan) == [1, 6]
    check_shapes(plan, values, 1, 400.0, COSTS["padded"])


@given(
    sizes=st.lists(st.integers(1, 200), min_size=8, max_size=150),
    world=st.integers(1, 4),
    policy=st.sampled_from(["split", "drop"]),
    epoch=st.integers(0, 2),
)
def test_every_rank_sees_the_same_shapes_and_its_batches_fit_them(sizes, world, policy, epoch):
    values = np.array(sizes, dtype=np.float64)
    samplers = [
        fitbatch.BudgetBatchSampler(
            values, 600, max_shapes=5, num_replicas=world, rank=r, policy=policy, seed=7
        )
        for r in range(world)
    ]
    first = samplers[0].shapes
    placed = []
    for sampler in samplers:
        sampler.set_epoch(epoch)
        assert np.array_equal(sampler.shapes, first)
        plan = sampler.plan()
        check_shapes(plan, values, 5, 600, COSTS["padded"])
        placed += [i for b in sampler for i in b]
    dropped = samplers[0].steps().plan.dropped.tolist()
    assert sorted(placed + dropped) == list(range(values.size))


def test_shapes_pad_nearly_as_little_as_the_optimal_grid(functions, pytokens):
    """Padding efficiency against the shapes >= 0.95 x that of the optimal K-length grid."""
    resampled = np.random.default_rng(0).choice(pytokens, 50_000)
    cases = [
        (np.minimum(functions, 512), 4096),
        (functions, 8192),
        (functions, 16384),
        (pytokens, 72_000),
        (resampled, 131_072),
    ]
    for sizes, budget in cases:
        values = sizes.astype(np.float64)
        for k in (4, 8, 16, 32):
            plan = fitbatch.plan_batches(values, budget, max_shapes=k)
            grid = plan.shape_set[:, 1].astype(np.float64)
            grid_efficiency = values.sum() / grid[np.searchsorted(grid, values)].sum()
            stats = plan.stats()
            assert stats.n_shapes <= k
            assert stats.shape_efficiency >= 0.95 * grid_efficiency, (
                budget,
                k,
                stats.shape_efficiency,
                grid_efficiency,
            )


def test_stats_and_report_count_the_shapes():
    plan = fitbatch.plan_batches([3, 5, 9, 10, 4, 10], 40, strategy="sorted", max_shapes=2)
    assert plan.to_lists() == [[4, 1], [0, 5, 3, 2]]
    assert plan.shapes.tolist() == [[8, 5], [4, 10]]
    stats = plan.stats()
    assert (stats.n_shapes, stats.shape_efficiency) == (2, 41 / 80)
    assert "shapes / efficiency  2 / 0.5125" in plan.report()
    assert "2 shapes, efficiency 0.512" in stats.summary()
    plain = fitbatch.plan_batches([3, 5, 9], 40)
    assert plain.shapes is None and plain.shape_set is None and plain.stats().n_shapes is None
    assert "shapes" not in plain.report()


def test_chosen_sub_batches_keep_fitting(functions):
    """A batch split in halves (equal steps per rank) still fits a shape of the set."""
    values = functions[:3000].astype(np.float64)
    plan = fitbatch.plan_batches(values, 4096, max_shapes=6)
    split = fitbatch.epoch._arrange.split_batches(
        plan, fitbatch.as_sizes(values), fitbatch.PaddedCost(), 25
    )
    assert len(split) == len(plan) + 25
    check_shapes(split, values, 6, 4096, fitbatch.PaddedCost())


# ---------------------------------------------------------------------------- samplers


def test_sampler_state_records_max_shapes(functions):
    values = functions[:4000]
    sampler = fitbatch.BudgetBatchSampler(values, 4096, max_shapes=8, num_replicas=1, rank=0)
    it = iter(sampler)
    done = [next(it) for _ in range(5)]
    state = sampler.state_dict()
    assert state["options"]["max_shapes"] == 8
    resumed = fitbatch.BudgetBatchSampler(values, 4096, max_shapes=8, num_replicas=1, rank=0)
    resumed.load_state_dict(state)
    assert done + list(resumed) == list(
        fitbatch.BudgetBatchSampler(values, 4096, max_shapes=8, num_replicas=1, rank=0)
    )
    for k in (4, None):
        other = fitbatch.BudgetBatchSampler(values, 4096, max_shapes=k, num_replicas=1, rank=0)
        with pytest.raises(ValueError, match=r"max_shapes: saved 8, this sampler"):
            other.load_state_dict(state)
    assert (
        "max_shapes"
        not in fitbatch.BudgetBatchSampler(values, 4096, num_replicas=1, rank=0).state_dict()[
            "options"
        ]
    )


def test_a_resume_on_another_world_size_keeps_the_shapes(functions):
    values = np.minimum(functions[:6000], 512)
    old = [
        fitbatch.BudgetBatchSampler(values, 4096, max_shapes=8, num_replicas=2, rank=r)
        for r in range(2)
    ]
    iterators = [iter(s) for s in old]
    done = [i for it in iterators for _ in range(10) for i in next(it)]
    state = old[0].state_dict()
    new = [
        fitbatch.BudgetBatchSampler(values, 4096, max_shapes=8, num_replicas=3, rank=r)
        for r in range(3)
    ]
    for sampler in new:
        sampler.load_state_dict(state)
        assert np.array_equal(sampler.shapes, old[0].shapes)
        check_shapes(sampler.plan(), values.astype(np.float64), 8, 4096, fitbatch.PaddedCost())
    rest = [i for s in new for b in s for i in b]
    assert sorted(done + rest) == list(range(values.size))


def test_a_budget_change_mid_epoch_keeps_every_batch_in_a_shape(functions):
    values = functions[:5000].astype(np.float64)
    sampler = fitbatch.BudgetBatchSampler(values, 4096, max_shapes=8, num_replicas=1, rank=0)
    before = sampler.shapes
    it = iter(sampler)
    seen = [next(it) for _ in range(20)]
    sampler.set_budget(8192)
    seen += list(it)
    assert sorted(i for b in seen for i in b) == list(range(values.size))
    check_shapes(sampler.plan(), values, 16, 8192, fitbatch.PaddedCost(), one_per_length=False)
    after = fitbatch.BudgetBatchSampler(values, 8192, max_shapes=8, num_replicas=1, rank=0).shapes
    # this epoch: the shapes of both budgets; the next: those of the new budget over every sample
    assert {tuple(s) for s in sampler.shapes.tolist()} <= {
        tuple(s) for s in [*before.tolist(), *after.tolist()]
    }
    sampler.set_epoch(1)
    assert np.array_equal(sampler.shapes, after)


def test_scheduled_sampler_takes_max_shapes_from_plan_options(functions):
    values = functions[:3000]
    micro = fitbatch.plan.PlanOptions.build(2048, max_shapes=6)
    schedule = fitbatch.schedule.BatchSizeSchedule.from_list([8192], on_exhausted="hold_last")
    sampler = fitbatch.schedule.ScheduledBatchSampler(
        values, schedule, micro_batch_size=micro, num_replicas=1, rank=0
    )
    assert sampler.shapes.shape[0] <= 6
    check_shapes(sampler.plan(), values.astype(np.float64), 6, 2048, fitbatch.PaddedCost())


# ---------------------------------------------------------------------------- refusals and the CLI


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_shapes": 0}, ValueError, "max_shapes must be >= 1, got 0"),
        ({"max_shapes": True}, TypeError, "max_shapes must be an int >= 1 or None, got True"),
        ({"max_shapes": 4, "cost": "sum"}, ValueError, "max_shapes=4 needs a padded cost model"),
    ],
)
def test_bad_max_shapes_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        fitbatch.plan_batches([3, 4, 5], 40, **kwargs)


def test_oversized_samples_planned_alone_get_a_shape_of_their_own():
    values = np.array([1.0, 239.0, 40.0, 500.0, 30.0])
    plan = fitbatch.plan_batches(values, 300, max_shapes=3, oversized="single")
    assert plan.shape_set.tolist() == [[7, 40], [1, 239], [1, 500]]
    check_shapes(plan, values, 3, 300, fitbatch.PaddedCost())
    with pytest.raises(
        ValueError, match="max_shapes=1 cannot give the 1 sample over the budget alone"
    ):
        fitbatch.plan_batches(values, 300, max_shapes=1, oversized="single")


def test_shapes_need_one_size_per_sample_and_one_budget():
    with pytest.raises(ValueError, match=r"needs one size per sample, got sizes of shape \(2, 2\)"):
        fitbatch.plan_batches([[3, 4], [5, 6]], 400, max_shapes=2)
    with pytest.raises(ValueError, match="max_shapes needs one budget for every rank"):
        fitbatch.BudgetBatchSampler([3, 4, 5, 6], [40, 80], max_shapes=2, num_replicas=2, rank=0)


def test_cli_plan_reports_the_shapes(tmp_path, capsys, functions):
    path = tmp_path / "lengths.npy"
    np.save(path, functions[:5000])
    assert (
        main(["plan", str(path), "--budget", "8192", "--strategy", "pooled", "--max-shapes", "8"])
        == 0
    )
    out = capsys.readouterr().out
    assert "Batch shapes (--max-shapes 8" in out and "fitbatch pooled: 8 shapes, efficiency" in out
    assert "shapes / efficiency  8 / " in out
    assert (
        main(
            [
                "plan",
                str(path),
                "--budget",
                "8192",
                "--strategy",
                "sorted",
                "--max-shapes",
                "4",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["mean"]["n_shapes"] is None and rows[1]["per_epoch"][0]["n_shapes"] == 4
    assert main(["plan", str(path), "--budget", "8192", "--cost", "sum", "--max-shapes", "4"]) != 0
    assert "needs a padded cost model" in capsys.readouterr().err


def test_the_docs_examples_run(monkeypatch):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    result = doctest.testfile(str(root / "docs" / "shapes.md"), module_relative=False)
    assert result.attempted >= 10 and result.failed == 0


def test_a_fractional_sample_whose_whole_length_is_over_the_budget_is_oversized():
    """Shapes have whole lengths: 9.5 under 9.7 needs (1, 10), which costs 10 (it was given that
    shape, over the budget); it is oversized now, by the policy the caller chose."""
    with pytest.raises(ValueError, match=r"index 0 \(cost 10\.0\)"):
        fitbatch.plan_batches([9.5, 3.0, 2.5], 9.7, max_shapes=2)
    plan = fitbatch.plan_batches([9.5, 3.0, 2.5], 9.7, max_shapes=2, oversized="skip")
    assert plan.skipped.tolist() == [0] and sorted(plan.to_lists()[0]) == [1, 2]
    poly = fitbatch.PaddedPolynomial(per_token=1, quadratic=0.01)
    plan = fitbatch.plan_batches([117.6, 50.0, 30.0], 256, cost=poly, max_shapes=2, oversized="skip")
    assert plan.skipped.tolist() == [0]  # 118 tokens cost 257.24
    for rows, length in plan.shape_set.tolist():
        assert poly.evaluate(np.array([rows]), np.array([float(length)]), np.array([rows * length]))[0] <= 256
