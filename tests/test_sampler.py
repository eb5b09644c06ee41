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
from fitbatch import BudgetBatchSampler, pad_collate  # noqa: E402
from fitbatch.sampler._budget import PlanSampler  # noqa: E402
from fitbatch.schedule import ScheduledBatchSampler  # noqa: E402


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
    assert default == fitbatch.plan.PlanOptions.build(10)
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


# --------------------------------------------------------------------------- changes part-way through an epoch


def flat(batches) -> list[int]:
    return [i for b in batches for i in b]


def padded(batch, sizes) -> int:
    return len(batch) * int(max(sizes[i] for i in batch))


def test_set_budget_part_way_loses_and_repeats_no_sample(functions):
    """The OOMGuard case: 3 batches, a lower budget, 7 more, a state at step 10, a resume."""
    sizes = functions[:3000]
    sampler = BudgetBatchSampler(sizes, 4096, seed=0)
    it = iter(sampler)
    head = [next(it) for _ in range(3)]
    steps_before, samples_before = len(sampler), sampler.step_totals().samples
    sampler.set_budget(3686.4)
    head += [next(it) for _ in range(7)]
    state = json.loads(json.dumps(sampler.state_dict(step=10)))
    live_rest = list(it)
    assert state["events"] == [{"step": 3, "budget": 3686.4}] and state["options"]["budget"] == 4096.0
    assert sorted(flat(head + live_rest)) == list(range(3000)), "every sample once in the live run"
    assert all(padded(b, sizes) <= 3686.4 for b in head[3:] + live_rest)
    # len() and step_totals(): the epoch as it now runs; the steps already run keep their totals
    samples_after = sampler.step_totals().samples
    assert len(sampler) == samples_after.size == 3 + len(head[3:] + live_rest) != steps_before
    assert samples_after[:3].tolist() == samples_before[:3].tolist()
    assert int(samples_after.sum()) == 3000
    # a sampler built with the budget the epoch began with resumes exactly
    resumed = BudgetBatchSampler(sizes, 4096, seed=0)
    resumed.load_state_dict(state)
    assert resumed.budget == 3686.4 and len(resumed) == len(live_rest)
    assert list(resumed) == live_rest
    assert resumed.step_totals()[0].tolist() == samples_after.tolist()
    # one built with the new budget is refused, naming the budgets and the rule
    with pytest.raises(ValueError, match=r"budget: saved 4096.0, this sampler 3686.4.*began with.*event"):
        BudgetBatchSampler(sizes, 3686.4, seed=0).load_state_dict(state)
    # later epochs plan with the new budget, on both
    for s in (sampler, resumed):
        s.set_epoch(1)
        assert s.state_dict()["options"]["budget"] == 3686.4 and s.state_dict()["events"] == []
    assert list(sampler) == list(resumed) == BudgetBatchSampler(sizes, 3686.4, seed=0, num_replicas=1, rank=0).plan(1).to_lists()


def test_set_budget_before_the_first_batch_plans_the_epoch_with_it():
    sizes = sizes_for(300)
    sampler = BudgetBatchSampler(sizes, 2000, seed=1, num_replicas=1, rank=0)
    assert len(sampler) > 0
    sampler.set_budget(1500)
    built = BudgetBatchSampler(sizes, 1500, seed=1, num_replicas=1, rank=0)
    assert list(sampler) == list(built) and sampler.state_dict() == built.state_dict()
    sampler.set_budget(1500)  # the same budget: no change, no event
    assert sampler.state_dict()["events"] == []


def test_set_cost_part_way_is_replayed_from_its_description():
    sizes = sizes_for(400)
    poly = fitbatch.PaddedPolynomial(fixed=50.0, linear=1.0, per_token=1.0, quadratic=0.01)
    kw = dict(seed=2, num_replicas=1, rank=0)
    sampler = BudgetBatchSampler(sizes, 4000, **kw)
    it = iter(sampler)
    head = [next(it) for _ in range(4)]
    sampler.set_cost(poly)
    state = json.loads(json.dumps(sampler.state_dict()))
    rest = list(it)
    assert state["events"] == [{"step": 4, "cost": poly.to_dict()}]
    assert sorted(flat(head + rest)) == list(range(400))
    assert all(float(poly.evaluate(np.array([len(b)]), np.array([sizes[b].max()]), np.array([sizes[b].sum()]))[0]) <= 4000
               for b in rest)
    resumed = BudgetBatchSampler(sizes, 4000, **kw)
    resumed.load_state_dict(state)
    assert list(resumed) == rest and resumed.options.cost == poly


def test_a_change_at_the_end_of_an_epoch_applies_to_the_next():
    sizes = sizes_for(200)
    sampler = BudgetBatchSampler(sizes, 2000, seed=0, num_replicas=1, rank=0)
    full = list(sampler)
    sampler.set_budget(1000)
    state = sampler.state_dict()
    assert state["step"] == len(full) and state["events"] == [{"step": len(full), "budget": 1000.0}]
    resumed = BudgetBatchSampler(sizes, 2000, seed=0, num_replicas=1, rank=0)
    resumed.load_state_dict(state)
    assert list(resumed) == [] and resumed.budget == 1000.0
    resumed.set_epoch(1)
    assert list(resumed) == BudgetBatchSampler(sizes, 1000, seed=0, num_replicas=1, rank=0).plan(1).to_lists()


def test_a_prefetching_dataloader_keeps_its_prefetched_batches_and_resumes_exactly(functions):
    """Workers run ahead: the change applies from the batches handed out, the state from the loop's count."""
    sizes = functions[:2500]
    kw = {"num_replicas": 1, "rank": 0, "seed": 9}
    sampler = BudgetBatchSampler(sizes, 4096, **kw)
    loader = DataLoader(list(range(len(sizes))), batch_sampler=sampler, num_workers=2, collate_fn=list)
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    handed_out = sampler.state_dict()["step"]
    assert handed_out > 5
    sampler.set_budget(3000)  # what OOMGuard does after the loop's fifth step
    head += [next(it) for _ in range(5)]
    state = sampler.state_dict(step=10)
    rest = list(it)
    assert state["events"] == [{"step": handed_out, "budget": 3000.0}]
    assert sorted(flat(head + rest)) == list(range(len(sizes)))
    assert all(padded(b, sizes) <= 3000 for b in (head + rest)[handed_out:])
    resumed = BudgetBatchSampler(sizes, 4096, **kw)
    resumed.load_state_dict(state)
    assert list(DataLoader(list(range(len(sizes))), batch_sampler=resumed, num_workers=2, collate_fn=list)) == rest


def _run(sizes, world, *, budget, new_budget, change_at, save_at=None, **kw):
    """Every rank runs the epoch, changing the budget after ``change_at`` steps; the state after ``save_at``."""
    samplers = [BudgetBatchSampler(sizes, budget, num_replicas=world, rank=r, **kw) for r in range(world)]
    its = [iter(s) for s in samplers]
    got, state, k = [[] for _ in range(world)], None, 0
    while True:
        if k == change_at:
            for s in samplers:
                s.set_budget(new_budget)
        if k == save_at:
            state = json.loads(json.dumps(samplers[0].state_dict()))
        row = [next(it, None) for it in its]
        if row[0] is None:
            assert all(b is None for b in row), "ranks ran different numbers of steps"
            return samplers, got, state
        for g, b in zip(got, row):
            g.append(b)
        k += 1


@pytest.mark.parametrize("world, change_at", [(1, 7), (3, 3)])
def test_resume_at_every_step_with_a_budget_change_equals_the_uninterrupted_run(functions, world, change_at):
    sizes = np.minimum(np.random.default_rng(5).choice(functions, 700), 1500)
    kw = dict(seed=4, budget=3000, new_budget=1500)
    _, full, _ = _run(sizes, world, change_at=change_at, **kw)
    steps = len(full[0])
    assert {len(g) for g in full} == {steps} and steps > change_at + 2
    assert sorted(flat([b for g in full for b in g])) == list(range(len(sizes)))
    assert all(padded(b, sizes) <= (3000 if k < change_at else 1500) for g in full for k, b in enumerate(g))
    for save_at in range(steps + 1):
        # a state saved before the change holds no event: the resumed run makes the change itself
        _, _, state = _run(sizes, world, change_at=change_at if save_at >= change_at else None, save_at=save_at, **kw)
        assert len(state["events"]) == (save_at >= change_at)
        for r in range(world):
            resumed = BudgetBatchSampler(sizes, 3000, num_replicas=world, rank=r, seed=4)
            resumed.load_state_dict(state)
            if save_at >= change_at:  # before the change, len() counts the epoch as not yet changed
                assert len(resumed) == steps - save_at
            it, rest = iter(resumed), []
            for k in range(save_at, steps):
                if k == change_at:
                    resumed.set_budget(1500)
                rest.append(next(it))
            assert next(it, None) is None
            assert full[r][:save_at] + rest == full[r], f"rank {r}, saved at step {save_at}"


def test_a_world_change_after_a_budget_change_keeps_every_sample_once(functions):
    sizes = np.minimum(np.random.default_rng(6).choice(functions, 900), 1500)
    samplers, full, state = _run(sizes, 2, budget=3000, new_budget=1600, change_at=5, save_at=12, seed=3)
    consumed = flat([b for g in full for b in g[:12]])
    three = [BudgetBatchSampler(sizes, 3000, num_replicas=3, rank=r, seed=3) for r in range(3)]
    for s in three:
        s.load_state_dict(state)
    got = [list(s) for s in three]
    assert len({len(g) for g in got}) == 1 and len(three[0]) == len(got[0])
    assert sorted(consumed + flat([b for g in got for b in g])) == list(range(len(sizes)))
    assert all(padded(b, sizes) <= 1600 for g in got for b in g)
    state3 = three[1].state_dict(step=14)
    assert state3["events"] == [{"step": 5, "budget": 1600.0}, {"step": 12, "num_replicas": 3}]
    assert state3["num_replicas"] == 2 and state3["options"]["budget"] == 3000.0
    # the new world resumes its own state exactly, and a third world still sees every sample once
    for r in range(3):
        again = BudgetBatchSampler(sizes, 3000, num_replicas=3, rank=r, seed=3)
        again.load_state_dict(state3)
        assert list(again) == got[r][2:]
    alone = BudgetBatchSampler(sizes, 3000, num_replicas=1, rank=0, seed=3)
    alone.load_state_dict(state3)
    done = consumed + flat([b for g in got for b in g[:2]])
    assert sorted(done + flat(alone)) == list(range(len(sizes)))
    assert alone.state_dict()["events"][-1] == {"step": 14, "num_replicas": 1}


def test_per_rank_budgets_scale_together_part_way(functions):
    sizes = np.minimum(functions[:1500], 2000)
    samplers = [BudgetBatchSampler(sizes, [2000, 4000], num_replicas=2, rank=r, seed=0) for r in range(2)]
    its = [iter(s) for s in samplers]
    head = [[next(it) for _ in range(3)] for it in its]
    for s in samplers:
        s.set_budget(1800)
    rest = [list(it) for it in its]
    assert samplers[0].budget == 1800 and len(rest[0]) == len(rest[1])
    assert sorted(flat(head[0] + head[1] + rest[0] + rest[1])) == list(range(1500))
    for r, cap in enumerate((1800, 3600)):
        assert all(padded(b, sizes) <= cap * (1 + 1e-12) for b in rest[r])
    state = samplers[1].state_dict(step=3)
    again = BudgetBatchSampler(sizes, [2000, 4000], num_replicas=2, rank=1, seed=0)
    again.load_state_dict(state)
    assert list(again) == rest[1]


def test_a_lower_budget_that_a_remaining_sample_exceeds_fails_naming_it():
    sizes = np.array([10] * 20 + [90])
    sampler = BudgetBatchSampler(sizes, 100, strategy="sequential", num_replicas=1, rank=0)
    it = iter(sampler)
    next(it)
    with pytest.raises(ValueError, match=r"1 sample cost more than the budget 50 even alone; largest: index 20"):
        sampler.set_budget(50)
    assert sampler.budget == 100 and sampler.state_dict()["events"] == [], "a refused change changes nothing"
    skipping = BudgetBatchSampler(sizes, 100, strategy="sequential", oversized="skip", num_replicas=1, rank=0)
    it = iter(skipping)
    first = next(it)
    skipping.set_budget(50)
    assert sorted(first + flat(it)) == list(range(20)) and skipping.plan().skipped.tolist() == [20]


def test_a_change_whose_rest_cannot_fill_equal_steps_keeps_the_rest(caplog):
    """4 samples left for 3 ranks, none of which fit together under the new budget: no empty batch,
    no lost sample: the rest keeps its batches, the new budget holds from the next epoch."""
    sizes = [10] * 10
    samplers = [BudgetBatchSampler(sizes, 20, strategy="sequential", num_replicas=3, rank=r) for r in range(3)]
    its = [iter(s) for s in samplers]
    head = [next(it) for it in its]
    expected = [s.plan().to_lists()[1:] for s in samplers]
    with caplog.at_level("WARNING", logger="fitbatch.sampler._budget"):
        for s in samplers:
            s.set_budget(10)
    assert "cannot fill equal steps for 3 ranks" in caplog.text
    rest = [list(it) for it in its]
    assert rest == expected and sorted(flat(head) + flat(b for r in rest for b in r)) == list(range(10))
    state = samplers[0].state_dict(step=1)
    assert state["events"] == [{"step": 1, "budget": 10.0}]
    again = BudgetBatchSampler(sizes, 20, strategy="sequential", num_replicas=3, rank=2)
    again.load_state_dict(state)
    assert list(again) == rest[2] and again.budget == 10.0


def test_a_change_at_the_end_of_a_dropping_epoch_counts_each_dropped_sample_once():
    """Found by tests/test_fuzz_sampler.py: the epoch's dropped samples were counted twice."""
    sizes = np.clip(np.ceil(np.random.default_rng(0).lognormal(np.log(10), 0.9, 49)), 1, 60)
    kw = dict(strategy="sequential", policy="drop", oversized="single")
    samplers = [BudgetBatchSampler(sizes, 60, num_replicas=3, rank=r, **kw) for r in range(3)]
    ran = [list(s) for s in samplers]
    dropped = samplers[0].plan().dropped.tolist()
    assert dropped and sorted(flat(b for r in ran for b in r) + dropped) == list(range(49))
    for s in samplers:
        s.set_budget(30)
    assert samplers[0].plan().dropped.tolist() == dropped


def test_a_budget_that_a_sample_exceeds_alone_is_refused_before_and_during_the_epoch():
    """Found by tests/test_fuzz_sampler.py: before the first batch the error came only when planning."""
    sizes = np.array([10] * 20 + [45])
    for handed_out in (0, 2):
        sampler = BudgetBatchSampler(sizes, 100, strategy="sequential", num_replicas=1, rank=0)
        it = iter(sampler)
        head = [next(it) for _ in range(handed_out)]
        before = sampler.state_dict()
        with pytest.raises(ValueError, match="1 sample cost more than the budget 40 even alone; largest: index 20"):
            sampler.set_budget(40)
        assert sampler.state_dict() == before and sampler.budget == 100
        assert head + list(it) == BudgetBatchSampler(sizes, 100, strategy="sequential", num_replicas=1, rank=0).plan().to_lists()


# --------------------------------------------------------------------------- corrupted or foreign state


def state_of(sizes, **kw):
    sampler = BudgetBatchSampler(sizes, 2000, seed=0, num_replicas=1, rank=0, **kw)
    return sampler, sampler.state_dict(step=3)


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("num_replicas", 0, r"'num_replicas' must be an int >= 1, got 0"),
        ("num_replicas", -2, r"'num_replicas' must be an int >= 1, got -2"),
        ("num_replicas", 1.7, r"'num_replicas' must be an int >= 1, got 1.7"),
        ("epoch", "1", r"'epoch' must be an int >= 0, got '1'"),
        ("events", [[2, -3]], r"'events' must be a list of events .* item 0 is \[2, -3\]"),
        ("events", [{"step": 2, "budget": -3}], r"'events' must be a list of events"),
        ("sizes_digest", "0" * 31, r"'sizes_digest' must be a hexadecimal digest of 32 characters"),
        ("options", [1], r"'options' must be a mapping"),
    ],
)
def test_corrupted_state_values_are_refused_naming_key_value_and_way_out(key, value, match):
    sampler, state = state_of(sizes_for())
    with pytest.raises(ValueError, match=match) as info:
        sampler.load_state_dict({**state, key: value})
    assert "pass what state_dict() returned, unchanged" in str(info.value)


def test_every_missing_key_is_a_value_error_naming_it():
    sampler, state = state_of(sizes_for())
    for key in state:
        with pytest.raises(ValueError, match=rf"sampler state lacks keys \['{key}'\]"):
            sampler.load_state_dict({k: v for k, v in state.items() if k != key})


def test_a_step_beyond_the_epoch_is_refused_by_state_dict_and_load():
    sampler, state = state_of(sizes_for())
    steps = len(sampler)
    assert sampler.state_dict(step=steps)["step"] == steps
    with pytest.raises(ValueError, match=rf"step 1000000000 is outside epoch 0.*0\.\.{steps}"):
        sampler.state_dict(step=10**9)
    with pytest.raises(ValueError, match=rf"step 1000000000, outside epoch 0, whose steps run 0\.\.{steps}"):
        sampler.load_state_dict({**state, "step": 10**9})
    with pytest.raises(ValueError, match=r"event 0 .* at step 500, outside epoch 0"):
        sampler.load_state_dict({**state, "events": [{"step": 500, "budget": 1000.0}]})


def test_a_state_of_other_sizes_with_the_same_count_is_refused():
    sizes = sizes_for()
    _, state = state_of(sizes)
    other = sizes.copy()
    other[[0, 1]] = other[[1, 0]] if other[0] != other[1] else (other[0] + 1, other[1])
    with pytest.raises(ValueError, match="saved over other sizes .*sizes_digest.*same order"):
        BudgetBatchSampler(other, 2000, seed=0, num_replicas=1, rank=0).load_state_dict(state)


def test_a_state_from_fitbatch_0_1_is_refused_by_its_version():
    sampler, state = state_of(sizes_for())
    old = {"version": 1, "epoch": 0, "step": 3, "num_replicas": 1, "n_samples": 500, "options": state["options"], "history": []}
    with pytest.raises(ValueError, match="unsupported sampler state version 1; expected 2"):
        sampler.load_state_dict(old)


def test_bucket_boundaries_resume_from_a_json_round_trip():
    sizes = sizes_for()
    kw = dict(strategy=fitbatch.Buckets(boundaries=(50.0, 120.0)), seed=0, num_replicas=1, rank=0)
    sampler = BudgetBatchSampler(sizes, 2000, **kw)
    full = list(sampler)
    resumed = BudgetBatchSampler(sizes, 2000, **kw)
    resumed.load_state_dict(json.loads(json.dumps(sampler.state_dict(step=2))))
    assert list(resumed) == full[2:]


def test_rank_stats_after_a_resume_on_another_world_compare_with_the_rest(functions):
    """After 2 ranks ran part of the epoch and 3 resume it, a rank's bound is that of the rest."""
    two = BudgetBatchSampler(functions, 16384, seed=0, num_replicas=2, rank=0)
    state = two.state_dict(step=50)
    three = BudgetBatchSampler(functions, 16384, seed=0, num_replicas=3, rank=0)
    three.load_state_dict(state)
    stats = three.plan().stats()
    rest = three.steps().plan
    bound = fitbatch.plan._planner.lower_bound(fitbatch.PaddedCost(), 16384.0, float(functions[rest.order].sum()), rest.n_samples)
    assert stats.lower_bound == -(-bound // 3) and stats.n_batches == len(three)
    assert 1.0 <= stats.batches_vs_lower_bound < 1.05
