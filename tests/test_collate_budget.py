"""``fitbatch.collate.check_budget``: collated batches measured against the sampler's budget."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fitbatch
from fitbatch.collate import (
    BudgetCheckedCollate,
    check_budget,
    make_hf_collate,
    make_varlen_collate,
    pad_collate,
)
from fitbatch.collate._budget import Measured, measure_collated


def rows(*lengths: int) -> list[dict]:
    return [{"input_ids": list(range(1, n + 1))} for n in lengths]


def test_what_is_measured_in_each_batch_form():
    padded = make_hf_collate(0, return_tensors="np")(rows(3, 5))
    assert measure_collated(padded) == Measured(2, 5, 10, False)
    assert measure_collated(pad_collate([np.ones(4), np.ones(2), np.ones(1)])) == Measured(3, 4, 12, False)
    assert measure_collated((pad_collate([np.ones(4)]), np.array([0]))) == Measured(1, 4, 4, False)
    varlen = make_varlen_collate(return_tensors="np")(rows(3, 5, 2))
    assert measure_collated(varlen) == Measured(3, 5, 10, True)
    trl_style = {"input_ids": np.zeros((1, 8)), "position_ids": np.array([[0, 1, 2, 0, 1, 0, 0, 0]])}
    assert measure_collated(trl_style) == Measured(5, 3, 8, True), "a padded tail counts as short sequences"
    assert measure_collated({"pixel_values": np.zeros((2, 3))}) is None
    assert measure_collated("no tensor") is None


def test_budgets_per_cost_model():
    hf = make_hf_collate(0, return_tensors="np")
    assert check_budget(hf, 10)(rows(3, 5))["input_ids"].shape == (2, 5)
    with pytest.raises(ValueError, match=r"costs 10 \(2 rows x 5 tokens, cost 'padded'\), over the budget 9 \(1.11x\)"):
        check_budget(hf, 9)(rows(3, 5))
    # a sum plan: a padded collator holds more than the planned 8 tokens
    with pytest.raises(ValueError, match=r"\(1\) a padded collator under a sum plan.*make_varlen_collate"):
        check_budget(hf, 8, cost="sum")(rows(3, 5))
    check_budget(make_varlen_collate(return_tensors="np"), 8, cost="sum")(rows(3, 5))  # 8 real tokens
    # a padding-free row under a padded plan: its real tokens, not sequences x longest
    check_budget(make_varlen_collate(return_tensors="np"), 8)(rows(3, 5))
    with pytest.raises(ValueError, match=r"one padding-free row of 2 sequences, 8 tokens"):
        check_budget(make_varlen_collate(return_tensors="np"), 7, cost="sum")(rows(3, 5))


def test_the_error_names_a_pad_multiple_and_the_sizes():
    def pad64(samples):
        return {"input_ids": np.zeros((len(samples), 64), dtype=np.int64)}

    with pytest.raises(ValueError, match=r"costs 128.*\(1\) a collator that pads to a multiple.*64.*\(2\) the sampler's sizes are not"):
        check_budget(pad64, 100)(rows(3, 5))


def test_a_sampler_gives_budget_cost_and_oversized():
    sizes = [5, 7, 3, 30]
    single = fitbatch.BudgetBatchSampler(sizes, 16, cost="sum", oversized="single", num_replicas=1, rank=0)
    check = check_budget(make_varlen_collate(return_tensors="np"), single)
    assert (check.budget, check.cost, check.single) == (16.0, single.options.cost, True)
    check(rows(30))  # a sample of its own, over the budget: allowed as the plan allowed it
    with pytest.raises(ValueError, match="over the budget 16"):
        check(rows(10, 10))
    with pytest.raises(ValueError, match=r"cost='sum' with a sampler"):
        check_budget(pad_collate, single, cost="sum")
    both = fitbatch.BudgetBatchSampler(np.ones((4, 2)), {"a": 4, "b": 4}, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="cannot be measured"):
        check_budget(pad_collate, both)


def test_picklable_for_dataloader_workers():
    check = check_budget(pad_collate, 20)
    again = pickle.loads(pickle.dumps(check))
    assert isinstance(again, BudgetCheckedCollate) and again.budget == 20


@given(st.lists(st.integers(1, 60), min_size=1, max_size=80), st.sampled_from(["padded", "sum"]),
       st.integers(0, 3))
def test_a_sampler_over_the_rows_own_lengths_never_trips_the_check(lengths, cost, seed):
    budget = 120
    sampler = fitbatch.BudgetBatchSampler(lengths, budget, cost=cost, seed=seed, num_replicas=1, rank=0,
                                          strategy="packed" if cost == "sum" else "pooled")
    collate = make_varlen_collate(return_tensors="np") if cost == "sum" else make_hf_collate(0, return_tensors="np")
    check = check_budget(collate, sampler)
    data = rows(*lengths)
    for batch in sampler:
        check([data[i] for i in batch])
    # sizes one short: some batch trips it, or no batch was full enough to notice
    short = fitbatch.BudgetBatchSampler([n - 1 if n > 1 else 1 for n in lengths], budget, cost=cost, seed=seed,
                                        num_replicas=1, rank=0, strategy="packed" if cost == "sum" else "pooled")
    check = check_budget(collate, short)
    for batch in short:
        try:
            check([data[i] for i in batch])
        except ValueError as exc:
            assert "over the budget" in str(exc)
            break
