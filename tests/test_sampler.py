"""BudgetBatchSampler: torch BatchSampler glue, epochs, re-entrancy, state, and a real
multi-worker DataLoader over variable-length tensors with the real function lengths."""

from __future__ import annotations

import json

import numpy as np
import pytest
from contracts import check_plan

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader, Dataset  # noqa: E402

import fitbatch  # noqa: E402
from fitbatch import BudgetBatchSampler, ScheduledBatchSampler, pad_collate  # noqa: E402
from fitbatch.sampler import PlanSampler  # noqa: E402


def sizes_for(n=500, seed=0):
    return np.random.default_rng(seed).integers(1, 200, n)


def test_is_a_torch_batch_sampler_yielding_int_lists():
    sampler = BudgetBatchSampler(sizes_for(), 2000, num_replicas=1, rank=0)
    assert isinstance(sampler, BatchSampler)
    batches = list(sampler)
    assert batches and all(isinstance(b, list) and all(type(i) is int for i in b) for b in batches)
    assert len(sampler) == len(batches)
    assert sorted(i for b in batches for i in b) == list(range(500))


def test_docstring_example():
    sampler = BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted", num_replicas=1, rank=0)
    assert list(sampler) == [[3, 1], [6, 0, 2], [4, 7], [5]]
    assert len(sampler) == 4


def test_matches_plan_batches():
    sizes = sizes_for()
    sampler = BudgetBatchSampler(sizes, 2000, strategy="pooled", seed=5, num_replicas=1, rank=0)
    sampler.set_epoch(3)
    plan = fitbatch.plan_batches(sizes, 2000, strategy="pooled", seed=5, epoch=3)
    assert list(sampler) == plan.to_lists()
    check_plan(sampler.plan(), sizes, 2000.0, fitbatch.PaddedCost())


def test_set_epoch_changes_the_plan():
    sampler = BudgetBatchSampler(sizes_for(), 2000, strategy="pooled", num_replicas=1, rank=0)
    first = list(sampler)
    assert list(sampler) == first, "same epoch, same batches"
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first
    assert sorted(i for b in second for i in b) == list(range(500))
    sampler.set_epoch(0)
    assert list(sampler) == first
    with pytest.raises(ValueError, match="epoch"):
        sampler.set_epoch(-1)


def test_reentrant_iteration():
    sampler = BudgetBatchSampler(sizes_for(), 2000, num_replicas=1, rank=0)
    full = list(sampler)
    a, b = iter(sampler), iter(sampler)
    got_a, got_b = [], []
    for x, y in zip(a, b, strict=True):
        got_a.append(x)
        got_b.append(y)
    got_a += list(a)
    got_b += list(b)
    assert got_a == full and got_b == full


@pytest.mark.parametrize("k", [0, 1, 7])
def test_resume_yields_exactly_the_remaining_batches(k):
    sizes = sizes_for(800)
    kw = dict(strategy="pooled", seed=3, num_replicas=1, rank=0, max_batch_size=16)
    sampler = BudgetBatchSampler(sizes, 2000, **kw)
    sampler.set_epoch(2)
    full = list(sampler)
    it = iter(sampler)
    consumed = [next(it) for _ in range(k)]
    assert consumed == full[:k]
    state = json.loads(json.dumps(sampler.state_dict()))  # JSON-able
    assert state["version"] == 2 and state["epoch"] == 2 and state["step"] == k
    frozen = json.dumps(state, sort_keys=True)
    fresh = BudgetBatchSampler(sizes, 2000, **kw)
    fresh.load_state_dict(state)
    assert json.dumps(state, sort_keys=True) == frozen, "load_state_dict does not mutate its argument"
    assert fresh.epoch == 2
    assert len(fresh) == len(full) - k
    assert list(fresh) == full[k:]
    assert list(fresh) == full, "the next iteration is a whole epoch again"


def test_state_rejects_bad_input():
    sizes = sizes_for()
    sampler = BudgetBatchSampler(sizes, 2000, num_replicas=1, rank=0)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match="unknown"):
        BudgetBatchSampler(sizes, 2000, num_replicas=1, rank=0).load_state_dict({**state, "cursor": 3})
    with pytest.raises(ValueError, match="version"):
        BudgetBatchSampler(sizes, 2000, num_replicas=1, rank=0).load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match="options"):
        BudgetBatchSampler(sizes, 3000, num_replicas=1, rank=0).load_state_dict(state)
    with pytest.raises(ValueError, match="options"):
        BudgetBatchSampler(sizes, 2000, strategy="sorted", num_replicas=1, rank=0).load_state_dict(state)
    with pytest.raises(ValueError, match="options"):
        BudgetBatchSampler(sizes, 2000, seed=1, num_replicas=1, rank=0).load_state_dict(state)
    with pytest.raises(ValueError, match="samples"):
        BudgetBatchSampler(sizes[:-1], 2000, num_replicas=1, rank=0).load_state_dict(state)


def test_bad_arguments():
    with pytest.raises(ValueError, match="budget"):
        BudgetBatchSampler([1, 2], 0, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="strategy"):
        BudgetBatchSampler([1, 2], 10, strategy="nope", num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="policy"):
        BudgetBatchSampler([1, 2], 10, policy="nope", num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="non-negative"):
        BudgetBatchSampler([1, -2], 10, num_replicas=1, rank=0)


def test_planning_options_are_keyword_parameters_with_plan_options_defaults():
    default = BudgetBatchSampler([1, 2, 3], 10, num_replicas=1, rank=0).options
    assert default == fitbatch.PlanOptions.build(10)
    opts = BudgetBatchSampler([1, 2, 3], 10, max_batch_size=2, batch_size_multiple=2, shuffle=False, seed=4,
                              oversized="skip", drop_last=True, saturation=0.5, num_replicas=1, rank=0).options
    assert (opts.max_batch_size, opts.batch_size_multiple, opts.shuffle, opts.seed) == (2, 2, False, 4)
    assert (opts.oversized, opts.drop_last, opts.saturation) == ("skip", True, 0.5)
    with pytest.raises(TypeError, match="max_batchsize"):
        BudgetBatchSampler([1, 2, 3], 10, max_batchsize=2, num_replicas=1, rank=0)


def test_callable_sizes_with_n():
    sampler = BudgetBatchSampler(lambda i: i % 7 + 1, 20, cost="sum", strategy="sequential", n=10,
                                 num_replicas=1, rank=0)
    assert list(sampler) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # 15 + 6 > 20; 6 + 7 + 1 + 2 + 3 = 19


# --------------------------------------------------------------------------- the protocol


def test_both_samplers_are_plan_samplers_and_torch_batch_samplers():
    for cls in (BudgetBatchSampler, ScheduledBatchSampler):
        assert issubclass(cls, PlanSampler) and issubclass(cls, BatchSampler)
        for name in ("__iter__", "__len__", "plan", "step_totals"):
            assert getattr(cls, name) is getattr(PlanSampler, name), f"{cls.__name__}.{name} is the base's"


PROTOCOL_CASES = [
    (lambda: BudgetBatchSampler(sizes_for(300), 2000, num_replicas=1, rank=0), "step"),
    (lambda: ScheduledBatchSampler(60, 8, micro_batch_size=4, num_replicas=1, rank=0), "micro"),
]


@pytest.mark.parametrize("make, cursor", PROTOCOL_CASES)
def test_cursor_len_and_state_behave_alike_in_both_samplers(make, cursor):
    sampler = make()
    full = list(sampler)
    assert len(sampler) == len(full) and sampler.plan().to_lists() == full
    assert int(sampler.step_totals()[0].sum()) == sum(len(b) for b in full)
    state = sampler.state_dict(**{cursor: 2})
    assert state["version"] == 2 and state[cursor] == 2 and state["epoch"] == 0
    fresh = make()
    fresh.load_state_dict(state)
    assert len(fresh) == len(full) - 2
    unused, used = iter(fresh), iter(fresh)  # a multi-worker DataLoader calls iter() twice
    assert list(used) == full[2:]
    assert list(fresh) == full, "the next iteration is a whole epoch again"
    del unused


@pytest.mark.parametrize("make, cursor", PROTOCOL_CASES)
def test_both_samplers_check_state_with_their_schema(make, cursor):
    sampler = make()
    state = sampler.state_dict()
    with pytest.raises(ValueError, match=rf"sampler state lacks keys \['{cursor}'\]"):
        sampler.load_state_dict({k: v for k, v in state.items() if k != cursor})
    with pytest.raises(ValueError, match=r"unknown sampler state keys \['rank'\]"):
        sampler.load_state_dict({**state, "rank": 0})
    with pytest.raises(ValueError, match="unsupported sampler state version 1; expected 2"):
        sampler.load_state_dict({**state, "version": 1})
    with pytest.raises(TypeError, match="sampler state must be a mapping"):
        sampler.load_state_dict([("version", 1)])
    with pytest.raises(ValueError, match=f"sampler state key '{cursor}' must be an int >= 0, got -1"):
        sampler.load_state_dict({**state, cursor: -1})


# --------------------------------------------------------------------------- real DataLoader


class Tokens(Dataset):
    """Sample i: an int64 tensor of length lengths[i], first element i, then i-dependent values."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        n = int(self.lengths[i])
        x = torch.arange(1, n + 1, dtype=torch.int64) + 1000
        x[0] = i
        return x


def test_dataloader_with_workers_sees_every_sample_once_padded(functions):
    lengths = np.random.default_rng(0).choice(functions, 3000)
    lengths = np.minimum(lengths, 4096)  # one sample must fit the budget alone
    sampler = BudgetBatchSampler(lengths, 4096, cost="padded", strategy="pooled", seed=1, num_replicas=1, rank=0)
    loader = DataLoader(Tokens(lengths), batch_sampler=sampler, collate_fn=pad_collate, num_workers=2)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        seen = []
        n_batches = 0
        for batch in loader:
            n_batches += 1
            values, lens, mask = batch
            ids = values[:, 0].tolist()
            seen += ids
            assert lens.tolist() == [int(lengths[i]) for i in ids]
            assert values.shape[1] == int(lens.max())
            assert values.shape[0] * values.shape[1] <= 4096
            assert torch.equal(mask, torch.arange(values.shape[1])[None, :] < lens[:, None])
            assert bool((values[~mask] == 0).all()), "padding is zero"
            expected = torch.arange(1, values.shape[1] + 1)[None, :] + 1000
            assert bool((values[:, 1:] == expected[:, 1:].expand_as(values[:, 1:]))[mask[:, 1:]].all())
        assert n_batches == len(sampler)
        assert sorted(seen) == list(range(len(lengths)))
