"""Several limits at once: sizes of named columns, a budget and a cost per column (``Limits``).

Every check recomputes each column's cost from the raw columns with numpy (count x max for
``"padded"``, the sum for ``"sum"``), never from the plan's own per-batch arrays.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fitbatch
from fitbatch.costs import Limits, PaddedCost, SumCost, resolve_limits
from fitbatch.epoch._arrange import TooFewSamples

DATA = Path(__file__).parent / "data"
STRATEGIES = ("sequential", "sorted", "pooled", "buckets", "packed")


def column_cost(values: np.ndarray, batch: np.ndarray, kind: str) -> float:
    part = values[batch]
    return float(part.sum()) if kind == "sum" else float(len(part) * part.max(initial=0))


def check_limits(plan: fitbatch.BatchPlan, columns: dict, budgets: dict, kinds: dict) -> None:
    """Every batch within every limit, every sample in exactly one batch or left out."""
    n = len(next(iter(columns.values())))
    seen = np.concatenate([plan.order, plan.skipped, plan.dropped])
    assert np.array_equal(np.sort(seen), np.arange(n))
    for batch in plan:
        for name, values in columns.items():
            assert column_cost(np.asarray(values), batch, kinds[name]) <= budgets[name], (
                name,
                batch,
            )


# ----------------------------------------------------------------------------- exact batches


def test_images_limit_splits_what_one_token_budget_would_keep_together():
    sizes = {"tokens": [10, 10, 10, 10], "images": [2, 2, 1, 1]}
    one = fitbatch.plan_batches(sizes["tokens"], 100, strategy="sequential")
    two = fitbatch.plan_batches(
        sizes, {"tokens": 100, "images": 3}, cost={"images": "sum"}, strategy="sequential"
    )
    assert one.to_lists() == [[0, 1, 2, 3]]
    assert two.to_lists() == [[0], [1, 2], [3]]
    assert two.limit_costs("images").tolist() == [2.0, 3.0, 1.0]
    assert two.limit_costs("tokens").tolist() == [10.0, 20.0, 10.0]
    assert two.costs.tolist() == [2 / 3, 1.0, 1 / 3]
    assert two.cost_name == "limits" and two.budget == 1.0
    assert two.lower_bound == 2  # images: 6 / 3


def test_tokens_limit_binds_with_padded_cost():
    sizes = {"tokens": [40, 30, 20, 10], "images": [1, 2, 1, 3]}
    plan = fitbatch.plan_batches(
        sizes, {"tokens": 64, "images": 3}, cost={"images": "sum"}, strategy="sequential"
    )
    assert plan.to_lists() == [[0], [1, 2], [3]]
    stats = plan.stats()
    assert stats.fill_by_limit == pytest.approx(
        {"images": (1 + 3 + 3) / 9, "tokens": (40 + 60 + 10) / 192}
    )
    assert stats.min_fill_by_limit == pytest.approx({"images": 1 / 3, "tokens": 10 / 64})
    # padding efficiency is the padded column's (tokens): 100 real of 110 padded
    assert stats.padding_efficiency == pytest.approx(100 / 110)
    assert "fill by limit mean (min)" in plan.report() and "images 0.778 (0.333)" in plan.report()
    assert "fill by limit images 0.778, tokens 0.573" in stats.summary()
    assert json.loads(json.dumps(stats.as_dict()))["fill_by_limit"]["tokens"] == pytest.approx(
        110 / 192
    )


def test_sorting_strategies_sort_by_the_padded_column():
    """Sorted by tokens (the padded column), not by each sample's largest fill: sample 0's images
    fill its limit alone, yet it pads nothing beside sample 2."""
    sizes = {"tokens": [1, 9, 1, 9], "images": [4, 0, 0, 4]}
    plan = fitbatch.plan_batches(
        sizes, {"tokens": 18, "images": 4}, cost={"images": "sum"}, strategy="sorted"
    )
    assert plan.to_lists() == [[2, 0], [3, 1]]
    assert plan.stats().padding_efficiency == 1.0
    limits = resolve_limits({"tokens": 18, "images": 4}, {"images": "sum"})
    rows = fitbatch.as_sizes(sizes).values
    assert limits.order_cost(rows).tolist() == [1 / 18, 0.5, 1 / 18, 0.5]
    assert limits.sample_cost(rows).tolist() == [1.0, 0.5, 1 / 18, 1.0]
    assert resolve_limits({"a": 2, "b": 4}, "sum").order_cost(np.array([[1.0, 1.0]])).tolist() == [
        0.5
    ]


def test_missing_cost_defaults_to_padded_and_one_cost_applies_to_every_column():
    limits = resolve_limits({"tokens": 100, "images": 4}, {"images": "sum"})
    assert limits.names == ("images", "tokens")
    assert limits.costs == (SumCost(), PaddedCost())
    assert resolve_limits({"a": 1, "b": 2}, "sum").costs == (SumCost(), SumCost())
    assert resolve_limits({"a": "2KiB", "b": "1GiB"}).budgets == (2048.0, 2.0**30)


def test_column_order_does_not_matter():
    a = fitbatch.plan_batches(
        {"tokens": [5, 1, 4, 2], "images": [0, 2, 1, 1]}, {"images": 2, "tokens": 8}, seed=1
    )
    b = fitbatch.plan_batches(
        {"images": [0, 2, 1, 1], "tokens": [5, 1, 4, 2]}, {"tokens": 8, "images": 2}, seed=1
    )
    assert a.to_lists() == b.to_lists()


def test_limits_model_sorts_columns_and_describes():
    limits = Limits(("tokens", "images"), (100.0, 4.0), (PaddedCost(), SumCost()))
    assert limits.names == ("images", "tokens") and limits.budgets == (4.0, 100.0)
    assert limits.describe(np.array([5.0, 120.0])) == "images 5 > 4, tokens 120 > 100"
    assert (
        limits.describe(np.array([1.0, 10.0])) == "images 1 > 4, tokens 10 > 100"
    )  # none over: all
    assert limits.evaluate(
        np.array([2.0]), np.array([[3.0, 40.0]]), np.array([[4.0, 60.0]])
    ).tolist() == [1.0]


# ----------------------------------------------------------------------------- errors


def test_budget_names_differ_from_size_columns():
    with pytest.raises(
        ValueError,
        match=r"budget names the columns \['images', 'tokens'\] but the sizes name \['frames', 'tokens'\]",
    ):
        fitbatch.plan_batches({"tokens": [1, 2], "frames": [1, 1]}, {"tokens": 8, "images": 2})


def test_cost_names_a_column_without_budget():
    with pytest.raises(
        ValueError, match=r"cost names columns \['frames', 'tokens'\] but budget names \['tokens'\]"
    ):
        fitbatch.plan_batches(
            {"tokens": [1, 2]}, {"tokens": 8}, cost={"tokens": "sum", "frames": "sum"}
        )


def test_cost_mapping_with_one_budget():
    with pytest.raises(TypeError, match="budget must be a mapping of the same names"):
        fitbatch.plan_batches({"tokens": [1, 2]}, 8, cost={"tokens": "sum"})


def test_columns_with_one_budget_and_one_dim_sizes_with_budget_mapping():
    with pytest.raises(
        ValueError,
        match=r"sizes are named columns \['images', 'tokens'\]: pass budget as a mapping",
    ):
        fitbatch.plan_batches({"tokens": [1, 2], "images": [0, 1]}, 8)
    with pytest.raises(ValueError, match="the sizes have no column names"):
        fitbatch.plan_batches([1, 2], {"tokens": 8})
    with pytest.raises(ValueError, match="budget is an empty mapping"):
        fitbatch.plan.PlanOptions.build({})


@pytest.mark.parametrize(
    ("sizes", "error", "match"),
    [
        ({0: 3, "a": [1]}, TypeError, "not both"),
        ({"a": [1, 2], "b": [1]}, ValueError, r"lengths \{'a': 2, 'b': 1\}"),
        ({"a": [[1, 2]]}, ValueError, "column 'a' must be 1-D"),
        ({"a": [1, -1]}, ValueError, "non-negative"),
        ({"a": ["x"]}, TypeError, "numeric"),
    ],
)
def test_bad_columns(sizes, error, match):
    with pytest.raises(error, match=match):
        fitbatch.as_sizes(sizes)


def test_index_mappings_still_mean_one_size_per_sample():
    assert fitbatch.as_sizes({1: 5, 0: 7}).values.tolist() == [7.0, 5.0]
    assert fitbatch.as_sizes({1: 5, 0: 7}).columns is None


def test_oversized_names_the_limit():
    sizes = {"tokens": [10, 500, 10, 10], "images": [1, 1, 9, 1]}
    with pytest.raises(
        ValueError,
        match=r"2 samples exceed a limit even alone; largest: index 1 \(tokens 500 > 100\), index 2 \(images 9 > 4\)",
    ):
        fitbatch.plan_batches(sizes, {"tokens": 100, "images": 4}, cost={"images": "sum"})
    plan = fitbatch.plan_batches(
        sizes,
        {"tokens": 100, "images": 4},
        cost={"images": "sum"},
        oversized="skip",
        strategy="sequential",
    )
    assert plan.skipped.tolist() == [1, 2] and plan.to_lists() == [[0, 3]]
    single = fitbatch.plan_batches(
        sizes,
        {"tokens": 100, "images": 4},
        cost={"images": "sum"},
        oversized="single",
        strategy="sequential",
    )
    assert single.to_lists() == [[0], [1], [2], [3]] and single.stats().oversized_batches == 2


def test_limit_costs_of_a_plan_of_one_budget_and_unknown_name():
    plan = fitbatch.plan_batches([1, 2], 8)
    with pytest.raises(ValueError, match="needs a plan of several limits"):
        plan.limit_costs("tokens")
    assert plan.stats().fill_by_limit is None
    two = fitbatch.plan_batches({"tokens": [1, 2]}, {"tokens": 8})
    with pytest.raises(
        ValueError, match=r"unknown limit 'images'; the plan's limits are \['tokens'\]"
    ):
        two.limit_costs("images")


def test_streams_refuse_several_limits():
    with pytest.raises(TypeError, match="batch_stream plans one budget, not several limits"):
        fitbatch.batch_stream(iter([1, 2]), sizeof=int, budget={"tokens": 8})


def test_limits_restore_from_state_description():
    from fitbatch.epoch._timeline import restore_cost

    limits = resolve_limits({"tokens": 100, "images": 4}, {"images": "sum"})
    assert restore_cost(json.loads(json.dumps(limits.to_dict()))) == limits


# ----------------------------------------------------------------------------- invariants


@st.composite
def limited(draw):
    n = draw(st.integers(0, 120))
    tokens = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    images = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    budgets = {"tokens": draw(st.integers(300, 2000)), "images": draw(st.integers(6, 30))}
    kinds = {
        "tokens": draw(st.sampled_from(["padded", "sum"])),
        "images": draw(st.sampled_from(["padded", "sum"])),
    }
    return {"tokens": tokens, "images": images}, budgets, kinds


@settings(max_examples=40, deadline=None)
@given(
    case=limited(),
    strategy=st.sampled_from(STRATEGIES),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 3),
)
def test_every_strategy_respects_every_limit(case, strategy, seed, epoch):
    columns, budgets, kinds = case
    plan = fitbatch.plan_batches(
        columns, budgets, cost=kinds, strategy=strategy, seed=seed, epoch=epoch
    )
    check_limits(plan, columns, budgets, kinds)
    assert len(plan) >= plan.lower_bound
    again = fitbatch.plan_batches(
        columns, budgets, cost=kinds, strategy=strategy, seed=seed, epoch=epoch
    )
    assert again.to_lists() == plan.to_lists()
    for name in budgets:  # per-limit costs as recomputed
        expect = [column_cost(np.asarray(columns[name]), b, kinds[name]) for b in plan]
        assert plan.limit_costs(name).tolist() == expect


@settings(max_examples=20, deadline=None)
@given(case=limited(), size=st.integers(1, 8), seed=st.integers(0, 2**32))
def test_fixed_only_measures(case, size, seed):
    columns, budgets, kinds = case
    plan = fitbatch.plan_batches(
        columns, budgets, cost=kinds, strategy=fitbatch.strategies.Fixed(size), seed=seed
    )
    assert all(len(b) == size for b in list(plan)[:-1])
    for name in budgets:
        expect = [
            column_cost(np.asarray(columns[name]), b, kinds[name]) / budgets[name] for b in plan
        ]
        fill = np.mean(expect) if expect else 0.0
        assert plan.stats().fill_by_limit[name] == pytest.approx(fill)


@settings(max_examples=15, deadline=None)
@given(
    case=limited(),
    strategy=st.sampled_from(STRATEGIES),
    seed=st.integers(0, 2**16),
    cut=st.integers(0, 6),
)
def test_sampler_resume_and_equal_steps(case, strategy, seed, cut):
    columns, budgets, kinds = case
    if len(columns["tokens"]) < 4:
        return
    make = lambda rank: fitbatch.BudgetBatchSampler(  # noqa: E731
        columns, budgets, cost=kinds, strategy=strategy, num_replicas=2, rank=rank, seed=seed
    )
    single = fitbatch.plan_batches(columns, budgets, cost=kinds, strategy=strategy, seed=seed)
    if single.n_samples < 2 * -(-len(single) // 2):  # an odd batch count of lone samples: no split
        with pytest.raises(TooFewSamples, match="policy='drop'"):
            list(make(0))
        return
    ranks = [list(make(r)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1])
    flat = sorted(i for r in ranks for b in r for i in b)
    assert flat == list(range(len(columns["tokens"])))
    for batch in ranks[0] + ranks[1]:
        for name, values in columns.items():
            assert column_cost(np.asarray(values), np.asarray(batch), kinds[name]) <= budgets[name]
    sampler = make(0)
    it = iter(sampler)
    head = [next(it) for _ in range(min(cut, len(ranks[0])))]
    resumed = make(0)
    resumed.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    assert head + list(resumed) == ranks[0]


def test_sizes_digest_covers_column_names():
    a = fitbatch.BudgetBatchSampler(
        {"tokens": [3, 4, 5], "images": [1, 1, 1]}, {"tokens": 10, "images": 2}
    )
    b = fitbatch.BudgetBatchSampler(
        {"tokens": [3, 4, 5], "frames": [1, 1, 1]}, {"tokens": 10, "frames": 2}
    )
    assert a.state_dict()["sizes_digest"] != b.state_dict()["sizes_digest"]
    with pytest.raises(ValueError, match="state was saved over other sizes"):
        b.load_state_dict(a.state_dict())


def test_sampler_set_budget_mapping_part_way_resumes():
    rng = np.random.default_rng(7)
    columns = {"tokens": rng.integers(1, 500, 300), "images": rng.integers(0, 5, 300)}
    make = lambda: fitbatch.BudgetBatchSampler(  # noqa: E731
        columns,
        {"tokens": 2048, "images": 8},
        cost={"images": "sum"},
        num_replicas=1,
        rank=0,
        seed=3,
    )
    sampler = make()
    it = iter(sampler)
    head = [next(it) for _ in range(5)]
    sampler.set_budget({"tokens": 1024, "images": 4})
    state = json.loads(json.dumps(sampler.state_dict()))
    rest = list(it)
    assert state["events"][0]["cost"]["budgets"] == [4.0, 1024.0]
    assert sorted(i for b in head + rest for i in b) == list(range(300))
    for b in rest:
        assert len(b) * columns["tokens"][b].max() <= 1024 and columns["images"][b].sum() <= 4
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == rest
    with pytest.raises(
        ValueError, match=r"set_budget needs a budget for each limit \['images', 'tokens'\]"
    ):
        sampler.set_budget({"tokens": 512})


# ----------------------------------------------------------------------------- real data


def test_real_function_lengths_with_synthetic_image_counts():
    """Tokens: lengths of CPython stdlib functions (tests/data). Images: a synthetic column, 0-4
    images per sample from a seeded generator (the data has none), each image costing 256 tokens
    of the same sequence too: both limits bind in some batches."""
    lengths = np.load(DATA / "cpython_stdlib_functions.npy").astype(np.int64)
    images = np.random.default_rng(17).integers(0, 5, lengths.size)
    columns = {"tokens": lengths + 256 * images, "images": images}
    budgets = {"tokens": 16384, "images": 24}
    kinds = {"tokens": "padded", "images": "sum"}
    for strategy in STRATEGIES:
        plan = fitbatch.plan_batches(
            columns, budgets, cost={"images": "sum"}, strategy=strategy, seed=0
        )
        check_limits(plan, columns, budgets, kinds)
        stats = plan.stats()
        assert stats.n_batches >= stats.lower_bound
        tokens_full = plan.limit_costs("tokens") / budgets["tokens"]
        images_full = plan.limit_costs("images") / budgets["images"]
        assert (images_full == 1.0).any() and (tokens_full > 0.95).any(), strategy
        assert stats.fill_by_limit["images"] == pytest.approx(images_full.mean())
        if strategy in ("sorted", "pooled", "packed"):
            # sorted by tokens; pooled's randomness="auto" spends about 2 % on fresh batch partners
            assert stats.padding_efficiency > (0.97 if strategy == "pooled" else 0.99), strategy
    one = fitbatch.plan_batches(columns["tokens"], 16384, strategy="pooled", seed=0)
    two = fitbatch.plan_batches(columns, budgets, cost={"images": "sum"}, strategy="pooled", seed=0)
    assert len(two) > len(one)  # the images limit costs batches


@settings(max_examples=25, deadline=None)
@given(
    case=limited(),
    cap=st.one_of(st.none(), st.integers(1, 12)),
    segment=st.integers(1, 50),
    poly=st.booleans(),
)
def test_compiled_rows_greedy_matches_numpy(case, cap, segment, poly):
    """The numba loop over rows (several limits) gives the numpy kernel's starts and open batch."""
    from fitbatch._kernels import greedy as G
    from fitbatch._kernels import jit as _jit

    columns, budgets, kinds = case
    assert _jit.enabled(), "numba is installed in CI: the compiled loop must load"
    if poly:
        kinds = {
            **kinds,
            "tokens": fitbatch.PaddedPolynomial(fixed=1.0, linear=2.0, quadratic=0.001),
        }
    limits = resolve_limits(budgets, kinds)
    rows = fitbatch.as_sizes(columns).values
    force = np.zeros(rows.shape[0], dtype=bool)
    force[::segment] = True
    compiled = _jit.greedy(
        rows, 1.0, limits, np.inf if cap is None else cap, force, 0, np.zeros(2), np.zeros(2)
    )
    assert compiled is not None
    numpy_starts, open_batch = (
        G._repair_seams(
            G._Greedy(rows, 1.0, limits, np.inf if cap is None else float(cap), force),
            8,
            G._lockstep(
                G._Greedy(rows, 1.0, limits, np.inf if cap is None else float(cap), force),
                8,
                G._empty_state(rows),
            ),
            G._empty_state(rows),
        )
        if rows.shape[0]
        else (np.zeros(0, np.int64), G._empty_state(rows))
    )
    assert compiled[0].tolist() == numpy_starts.tolist()
    if rows.shape[0]:
        assert compiled[1][0] == open_batch.count
        assert compiled[1][1].tolist() == np.asarray(open_batch.max_size).tolist()
        assert compiled[1][2].tolist() == np.asarray(open_batch.sum_size).tolist()


def test_from_batches_measures_every_limit():
    sizes = {"tokens": [4, 1, 3, 2], "images": [0, 2, 1, 1]}
    limits = resolve_limits({"tokens": 8, "images": 2}, {"images": "sum"})
    plan = fitbatch.BatchPlan.from_batches(
        sizes, limits, [1, 3, 2, 0], [0, 2, 4], budget=1, strategy_name="by hand"
    )
    assert plan.limit_costs("images").tolist() == [3.0, 1.0]
    assert plan.limit_costs("tokens").tolist() == [4.0, 8.0]
    assert plan.costs.tolist() == [1.5, 1.0] and plan.stats().oversized_batches == 1
    assert plan.stats().fill_by_limit == {"images": 1.0, "tokens": 0.75}
    with pytest.raises(ValueError, match="sizes are named columns"):
        fitbatch.BatchPlan.from_batches(
            sizes, "padded", [0, 1], [0, 2], budget=8, strategy_name="x"
        )
