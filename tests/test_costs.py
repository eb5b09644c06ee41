"""Cost models: values, closed forms, validation and resolution."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fitbatch
from fitbatch.costs import COST_NAMES


def ev(model, count, mx, sm):
    return model.evaluate(np.asarray(count, dtype=np.float64), np.asarray(mx, dtype=np.float64),
                          np.asarray(sm, dtype=np.float64)).tolist()


def test_builtin_values_one_dimensional():
    assert ev(fitbatch.SumCost(), [4, 2], [10, 50], [30, 60]) == [30.0, 60.0]
    assert ev(fitbatch.PaddedCost(), [4, 2], [10, 50], [30, 60]) == [40.0, 100.0]
    poly = fitbatch.PaddedPolynomial(fixed=100.0, linear=1.0, per_token=2.0, quadratic=0.5)
    assert ev(poly, [3, 1], [4, 0], [9, 0]) == [100 + 3 * (1 + 8 + 8), 101.0]


def test_builtin_values_two_dimensional():
    mx = [[3.0, 4.0], [2.0, 10.0]]
    sm = [[5.0, 6.0], [2.0, 10.0]]
    assert ev(fitbatch.PaddedCost(), [2, 1], mx, sm) == [2 * 12.0, 20.0]
    assert ev(fitbatch.PaddedCost(weights=(1.0, 0.5)), [2, 1], mx, sm) == [2 * (3 + 2), 2 + 5.0]
    assert ev(fitbatch.SumCost(), [2, 1], mx, sm) == [11.0, 12.0]
    assert ev(fitbatch.SumCost(weights=(2.0, 0.0)), [2, 1], mx, sm) == [10.0, 4.0]
    poly = fitbatch.PaddedPolynomial(fixed=1.0, per_token=1.0, quadratic=1.0)
    assert ev(poly, [2], [[3.0, 4.0]], [[5.0, 6.0]]) == [1 + 2 * (12 + 144)]


def test_sample_cost_is_a_batch_of_one():
    sizes = np.array([0.0, 3.0, 8.0])
    for model in (fitbatch.SumCost(), fitbatch.PaddedCost(), fitbatch.PaddedPolynomial(fixed=2.0, linear=1.0)):
        assert model.sample_cost(sizes).tolist() == ev(model, [1, 1, 1], sizes, sizes)
    assert fitbatch.PaddedCost().sample_cost(np.array([[2.0, 3.0]])).tolist() == [6.0]


@given(edge=st.floats(0, 1e5), budget=st.floats(1, 1e7),
       coefs=st.tuples(*(st.one_of(st.just(0.0), st.floats(1e-6, hi)) for hi in (50, 5, 5, 0.01))))
def test_max_count_is_the_largest_fitting_count(edge, budget, coefs):
    fixed, linear, per_token, quadratic = coefs
    for model in (fitbatch.PaddedCost(), fitbatch.PaddedPolynomial(fixed, linear, per_token, quadratic)):
        limit = float(model.max_count(np.array([edge]), budget)[0])
        if math.isinf(limit):
            assert ev(model, [1e12], [edge], [edge])[0] <= budget
            continue
        c = math.floor(limit)
        if c >= 1:
            assert ev(model, [c], [edge], [c * edge])[0] <= budget * (1 + 1e-9)
        assert ev(model, [c + 1], [edge], [(c + 1) * edge])[0] > budget * (1 - 1e-9)


def test_max_count_none_when_the_sum_matters():
    assert fitbatch.SumCost().max_count(np.array([1.0]), 10.0) is None
    assert fitbatch.costs.FunctionCost(lambda c, m, s: s).max_count(np.array([1.0]), 10.0) is None
    assert fitbatch.PaddedPolynomial(fixed=20.0).max_count(np.array([1.0]), 10.0).tolist() == [0.0]


@pytest.mark.parametrize("field", ["fixed", "linear", "per_token", "quadratic"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_polynomial_rejects_bad_coefficients(field, value):
    with pytest.raises(ValueError, match=field):
        fitbatch.PaddedPolynomial(**{field: value})


@pytest.mark.parametrize("weights", [(), (-1.0, 1.0), (float("nan"),), (1.0, float("inf"))])
def test_bad_weights(weights):
    for cls in (fitbatch.SumCost, fitbatch.PaddedCost, fitbatch.PaddedPolynomial):
        with pytest.raises(ValueError, match="weights"):
            cls(weights=weights)


def test_resolve_cost():
    assert fitbatch.costs.resolve_cost("sum") == fitbatch.SumCost()
    assert fitbatch.costs.resolve_cost("padded") == fitbatch.PaddedCost()
    assert fitbatch.costs.resolve_cost("polynomial") == fitbatch.PaddedPolynomial()
    model = fitbatch.PaddedCost(weights=(1.0, 2.0))
    assert fitbatch.costs.resolve_cost(model) is model
    fn = fitbatch.costs.resolve_cost(lambda c, m, s: c * m)
    assert isinstance(fn, fitbatch.costs.FunctionCost)
    assert ev(fn, [3], [4], [5]) == [12.0]
    assert set(COST_NAMES) == {"sum", "padded", "polynomial"}


def test_resolve_cost_errors_list_the_alternatives():
    with pytest.raises(ValueError) as err:
        fitbatch.costs.resolve_cost("tokens")
    for name in COST_NAMES:
        assert repr(name) in str(err.value)
    with pytest.raises(TypeError, match="cost"):
        fitbatch.costs.resolve_cost(3)


@pytest.mark.parametrize("fn, dimension", [
    (lambda c, m, s: 100.0 - c, "count"),
    (lambda c, m, s: c * (1e6 - m), "max size"),
    (lambda c, m, s: c * m - s, "sum of sizes"),
])
def test_decreasing_function_is_refused_naming_the_dimension(fn, dimension):
    with pytest.raises(ValueError, match=f"decreases with the {dimension}"):
        fitbatch.costs.resolve_cost(fn)


def test_decreasing_custom_model_is_refused():
    class Bad(fitbatch.CostModel):
        def evaluate(self, count, max_size, sum_size):
            return 10.0 - np.asarray(count, dtype=np.float64)

    with pytest.raises(ValueError, match="non-decreasing"):
        fitbatch.costs.resolve_cost(Bad())


def test_function_cost_must_be_vectorised():
    model = fitbatch.costs.FunctionCost(lambda c, m, s: 1.0)
    with pytest.raises(ValueError, match="vectorised"):
        model.evaluate(np.ones(3), np.ones(3), np.ones(3))


def test_models_are_frozen_and_compare_by_value():
    assert fitbatch.PaddedPolynomial(fixed=1) == fitbatch.PaddedPolynomial(fixed=1.0)
    assert fitbatch.PaddedCost() != fitbatch.PaddedCost(weights=(1.0,))
    with pytest.raises(AttributeError):
        fitbatch.PaddedPolynomial().fixed = 3.0  # type: ignore[misc]
    assert fitbatch.PaddedPolynomial(fixed=2).to_dict() == {
        "kind": "polynomial", "fixed": 2.0, "linear": 0.0, "per_token": 1.0, "quadratic": 0.0, "weights": None}
    assert fitbatch.SumCost().to_dict() == {"kind": "sum", "weights": None}

    def my_cost(c, m, s):
        return s

    assert fitbatch.costs.FunctionCost(my_cost).to_dict()["fn"].endswith("my_cost")


# --- results are checked where they enter planning, naming the model and the batch ----------


def _nan_beyond_two(c, m, s):
    return np.where(c > 2, np.nan, s)


@pytest.mark.parametrize(("fn", "what"), [
    (_nan_beyond_two, "NaN"),
    (lambda c, m, s: np.where(c > 2, np.inf, s), "inf"),
])
def test_function_cost_results_are_checked(fn, what):
    with pytest.raises(ValueError) as err:
        fitbatch.plan_batches([1, 2, 3, 4], 10, cost=fn)
    msg = str(err.value)
    assert msg.startswith(f"cost model FunctionCost({fn.__qualname__}) returned {what} for a batch of (count=3, max=")
    assert "a cost must be a finite number >= 0" in msg


def test_negative_costs_are_refused():
    with pytest.raises(ValueError, match=r"returned a negative cost -1 for a batch of \(count=1, max=1, sum=1\)"):
        fitbatch.plan_batches([1, 2, 3, 4], 10, cost=lambda c, m, s: s - 2)


def test_nan_for_every_sample_names_the_model_not_an_integer_conversion():
    with pytest.raises(ValueError, match=r"FunctionCost\(.*\) returned NaN for a batch of \(count=1, max=1, sum=1\) "
                                         r"\(and 3 more of the 4 evaluated\)"):
        fitbatch.plan_batches([1, 2, 3, 4], 10, cost=lambda c, m, s: s * np.nan)


def test_custom_models_are_checked_and_the_probe_grid_is_not():
    @dataclasses.dataclass(frozen=True)
    class LongerThanOne(fitbatch.CostModel):
        def evaluate(self, count, max_size, sum_size):
            return np.asarray(max_size, dtype=np.float64) - 1.0 + 0.0 * count

    model = fitbatch.costs.resolve_cost(LongerThanOne())  # negative on the probe grid: not refused there
    assert LongerThanOne.checked and not fitbatch.PaddedCost.checked
    with pytest.raises(ValueError, match=r"cost model .*LongerThanOne\(\) returned a negative cost -0.5 for a batch of "
                                         r"\(count=1, max=0.5, sum=0.5\)"):
        fitbatch.plan_batches([2.0, 0.5], 10, cost=model)

    class Scalar(fitbatch.CostModel):
        def evaluate(self, count, max_size, sum_size):
            return 1.0

        def __repr__(self):
            return "Scalar()"

    with pytest.raises(ValueError, match=r"cost model Scalar\(\) returned shape \(\) from evaluate .*vectorised"):
        Scalar().sample_cost(np.ones(3))


def test_non_numeric_costs_name_the_model():
    def words(c, m, s):
        return ["many"] * len(c)

    with pytest.raises(TypeError, match=r"cost model FunctionCost\(.*words\) returned list from evaluate, not numbers"):
        fitbatch.plan_batches([1, 2], 10, cost=words)


def test_oversized_message_says_cost_and_shows_the_size_when_it_differs():
    with pytest.raises(ValueError) as err:
        fitbatch.plan_batches([1, 2, 8, 4], 205, cost=fitbatch.PaddedPolynomial(fixed=200))
    assert "1 sample cost more than the budget 205 even alone; largest: index 2 (cost 208.0, size 8.0)." in str(err.value)
    with pytest.raises(ValueError, match=r"index 1 \(cost 120.0, size \(3.0, 40.0\)\)"):
        fitbatch.plan_batches([[1, 2], [3, 40]], 100, cost="padded")
    with pytest.raises(ValueError, match=r"index 1 \(cost 60.0\)\."):  # the size is the cost: shown once
        fitbatch.plan_batches([1, 60], 50, cost="sum")


@pytest.mark.parametrize("cls", [fitbatch.PaddedCost, fitbatch.SumCost, fitbatch.PaddedPolynomial])
def test_weights_must_match_the_size_dimensions(cls):
    model = cls(weights=(1.0,))
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\(.*weights=\(1.0,\)\) has 1 weight but the sizes have "
                                         r"D=2 dimensions \(shape \(N, 2\)\); pass one weight per dimension"):
        fitbatch.plan_batches([[1, 2], [3, 4]], 205, cost=model)


@pytest.mark.parametrize("cost", ["padded", "polynomial"])
def test_max_count_of_a_subnormal_size_is_unbounded_without_a_warning(cost):
    """budget / 5e-324 overflows: the closed-form count is inf (no limit), and numpy's overflow
    warning stays inside (found by a random hunt over the cost properties)."""
    model = fitbatch.costs.resolve_cost(cost)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = model.max_count(np.array([5e-324, 0.0, 2.0]), 1e6)
    assert got[0] > 1e300 and np.isinf(got[1]) and got[2] == pytest.approx(model.max_count(np.array([2.0]), 1e6)[0])
