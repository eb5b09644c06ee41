"""Samplers at their edges (issue 37): one budget-shape rule for plan_batches, set_budget and
set_cost; loss_sizes within the sizes; a state that is not a mapping named."""

from __future__ import annotations

import numpy as np
import pytest

import fitbatch
import fitbatch.costs
import fitbatch.schedule
from fitbatch import BudgetBatchSampler


@pytest.fixture(scope="module")
def columns(functions: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"tokens": functions[:4000], "images": rng.integers(0, 4, 4000)}


LIMITS = {"tokens": 16384, "images": 16}
WINDOWS = [{}, {"window": 1000}]


@pytest.mark.parametrize("kw", WINDOWS, ids=["global", "windowed"])
@pytest.mark.parametrize("oversized", ["error", "single"])
def test_a_number_as_the_budget_of_several_limits_is_refused_everywhere(
    columns: dict[str, np.ndarray], kw: dict, oversized: str
) -> None:
    """set_budget(8192) on a {"tokens", "images"} sampler became the allowed fill: one batch of
    4 million padded tokens for the rest of the epoch. plan_batches refuses it; so must they."""
    with pytest.raises(ValueError) as planned:
        fitbatch.plan_batches(columns, 8192, oversized=oversized)
    sampler = BudgetBatchSampler(columns, LIMITS, cost={"images": "sum"}, num_replicas=1, rank=0, seed=0,
                                 oversized=oversized, **kw)
    it = iter(sampler)
    first = [next(it) for _ in range(3)]
    before = (len(sampler), sampler.state_dict())
    with pytest.raises(ValueError) as refused:
        sampler.set_budget(8192)
    assert str(refused.value) == str(planned.value)
    with pytest.raises(ValueError, match="sizes are named columns"):
        sampler.set_cost("padded")
    assert (len(sampler), sampler.state_dict()) == before, "a refused change changes nothing"
    sampler.set_budget({"tokens": 8192, "images": 16})  # the shape plan_batches takes
    rest = list(it)
    assert sorted(i for b in first + rest for i in b) == list(range(4000))


@pytest.mark.parametrize("kw", WINDOWS, ids=["global", "windowed"])
def test_a_budget_mapping_for_one_column_is_refused(functions: np.ndarray, kw: dict) -> None:
    sampler = BudgetBatchSampler(functions[:500], 4096, num_replicas=1, rank=0, **kw)
    with pytest.raises(ValueError, match=r"budget is a mapping of columns \['tokens'\] but the sizes have no column names"):
        sampler.set_budget({"tokens": 8192})
    with pytest.raises(ValueError, match="the sizes have no column names"):
        sampler.set_cost(fitbatch.costs.resolve_limits({"tokens": 5}))


def test_loss_sizes_larger_than_the_sizes_are_refused(functions: np.ndarray) -> None:
    sizes = functions[:300]
    loss = sizes.copy()
    loss[7] += 1
    match = r"loss_sizes must not exceed the sizes .* index 7"
    with pytest.raises(ValueError, match=match):
        fitbatch.plan_batches(sizes, 4096, loss_sizes=loss)
    with pytest.raises(ValueError, match=match):
        BudgetBatchSampler(sizes, 4096, loss_sizes=loss, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=match):
        fitbatch.schedule.ScheduledBatchSampler(sizes, 4096, micro_batch_size=4, loss_sizes=loss, num_replicas=1, rank=0)
    assert fitbatch.plan_batches(sizes, 4096, loss_sizes=sizes).stats().loss_units == sizes.sum()  # equal is fine


@pytest.mark.parametrize("kw", WINDOWS, ids=["global", "windowed"])
@pytest.mark.parametrize("state", [None, 5, "state", [1, 2]])
def test_a_state_that_is_not_a_mapping_is_a_type_error(functions: np.ndarray, kw: dict, state: object) -> None:
    sampler = BudgetBatchSampler(functions[:500], 4096, num_replicas=1, rank=0, **kw)
    with pytest.raises(TypeError, match=r"state must be a mapping \(what state_dict\(\) returned\), got"):
        sampler.load_state_dict(state)  # type: ignore[arg-type]
