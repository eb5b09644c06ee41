"""OOMGuard: splitting after an OOM gives the whole batch's gradient, loses no sample, lowers the budget."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from contracts import load_script, run_processes

torch = pytest.importorskip("torch")

from fitbatch.costs import PaddedCost  # noqa: E402
from fitbatch.memory import fit_batch_model  # noqa: E402
from fitbatch.memory.guard import OOMGuard, SampleTooLargeError  # noqa: E402

WORKER = Path(__file__).parent / "distributed" / "memory_guard_worker.py"
W = load_script(WORKER, "memory_guard_worker")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class BudgetSampler:
    def __init__(self, budget):
        self.budget = budget
        self.costs = []

    def set_budget(self, budget):
        self.budget = budget


class CostSampler(BudgetSampler):
    def set_cost(self, cost):
        self.costs.append(cost)


class _OOMInBackward(torch.autograd.Function):
    """Identity whose backward runs out of memory: the head's gradients are already accumulated."""

    @staticmethod
    def forward(ctx, x, fail):
        ctx.fail = fail
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.fail:
            raise torch.OutOfMemoryError("test double: out of memory in backward")
        return grad, None


def make_items(n=12, seed=0, low=2, high=30):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (n,), generator=gen)
    return [torch.randint(0, W.VOCAB, (int(L),), generator=gen) for L in lengths]


def reference_grads(items):
    model = W.make_model()
    W.token_mean_loss(model, items).backward()
    return [p.grad.clone() for p in model.parameters()]


class Double:
    """loss_fn that throws OOM above a padded-token threshold and records what completed."""

    def __init__(self, model, threshold, where="forward"):
        self.model, self.threshold, self.where = model, threshold, where
        self.completed: list[int] = []
        self.failed = False

    def __call__(self, items):
        if self.failed:  # the guard restarts the whole batch after a failure
            self.completed.clear()
            self.failed = False
        over = len(items) * max(len(x) for x in items) > self.threshold
        self.failed = over
        if over and self.where == "forward":
            raise torch.OutOfMemoryError("test double: out of memory")
        self.completed.extend(id(x) for x in items)
        inputs, targets = W.collate(items)
        hidden = _OOMInBackward.apply(self.model[0](inputs), over)
        logits = self.model[2](self.model[1](hidden))
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=W.PAD
        )


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_split_gradient_equals_whole_batch(where, caplog):
    items = make_items()
    model = W.make_model()
    sampler = BudgetSampler(1e6)
    guard = OOMGuard(model, sampler=sampler, size_fn=len, cost=PaddedCost())
    double = Double(model, threshold=100, where=where)
    with caplog.at_level(logging.WARNING, logger="fitbatch.memory.guard"):
        loss = guard.step(items, double)
    for got, want in zip((p.grad for p in model.parameters()), reference_grads(items), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert float(loss) == pytest.approx(W.token_mean_loss(W.make_model(), items).item(), abs=1e-6)
    assert sorted(double.completed) == sorted(id(x) for x in items)  # every sample exactly once
    (event,) = guard.events
    assert event.parts > 1 and guard.ooms == 1
    whole_cost = len(items) * max(len(x) for x in items)
    assert sampler.budget == pytest.approx(0.9 * whole_cost)  # lowered below the failing batch
    assert event.budget_before == 1e6 and event.budget_after == sampler.budget
    assert "no sample lost" in caplog.text


def test_optimizer_step_matches_unsplit_training():
    model, ref = W.make_model(), W.make_model()
    guard = OOMGuard(model, torch.optim.SGD(model.parameters(), lr=0.5), size_fn=len)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    double = Double(model, threshold=40)
    for seed in range(3):
        items = make_items(8, seed)
        guard.step(items, double)
        ref_opt.zero_grad()
        W.token_mean_loss(ref, items).backward()
        ref_opt.step()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert guard.steps == 3 and guard.ooms == 3


def test_per_sample_mean_and_tensor_batches():
    net = torch.nn.Linear(5, 1)
    x, y = torch.randn(16, 5), torch.randn(16, 1)
    calls = []

    def loss_fn(batch):
        calls.append(len(batch["x"]))
        if len(batch["x"]) > 5:
            raise torch.OutOfMemoryError("test double")
        return torch.nn.functional.mse_loss(net(batch["x"]), batch["y"])

    guard = OOMGuard(net)
    guard.step({"x": x, "y": y}, loss_fn)
    got = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    for g, p in zip(got, net.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-6, rtol=0)
    assert calls == [16, 8, 4, 4, 4, 4]

    def tensor_loss(rows):
        if len(rows) > 8:
            raise torch.OutOfMemoryError("test double")
        return net(rows).pow(2).mean()

    net.zero_grad()
    guard.step(x, tensor_loss)
    assert guard.events[-1].parts == 2


def test_sample_too_large_names_it():
    model = W.make_model()
    items = make_items(4, seed=3, low=2, high=5) + [torch.zeros(50, dtype=torch.long)]
    guard = OOMGuard(model, size_fn=len)
    with pytest.raises(
        SampleTooLargeError, match="sample 'doc-4' .*position 4.*50 size units"
    ) as info:
        guard.step(items, Double(model, threshold=20), ids=[f"doc-{i}" for i in range(5)])
    assert info.value.sample_id == "doc-4" and info.value.units == 50
    assert all(p.grad is None for p in model.parameters())  # nothing half-accumulated left behind


def test_refits_memory_model_and_hands_it_to_the_sampler():
    c = np.array([1, 2, 4, 8, 1, 2, 4, 1, 2])
    L = np.array([8, 8, 8, 8, 16, 16, 16, 32, 32])
    model_cost = fit_batch_model(c, L, 100 + c * (2.0 * L))
    sampler = CostSampler(1000.0)
    net = W.make_model()
    guard = OOMGuard(net, sampler=sampler, size_fn=len, cost=model_cost, capacity=1000)
    items = [torch.arange(20) % W.VOCAB for _ in range(12)]  # costs 100 + 12 * 40 = 580 < 1000
    guard.step(items, Double(net, threshold=120))
    assert sampler.budget == 1000.0  # the model, not the budget, was corrected
    (refit,) = sampler.costs
    assert refit is guard.cost and guard.events[0].refit
    assert refit.predict([12], [20])[0] >= 1000
    assert guard.state_dict()["cost"]["kind"] == "batch_memory"


def test_grows_budget_after_steady_headroom():
    net = torch.nn.Linear(4, 4)
    sampler = BudgetSampler(100.0)
    guard = OOMGuard(net, sampler=sampler, capacity="1MiB", grow_after=2)
    for _ in range(4):
        guard.step(torch.randn(8, 4), lambda rows: net(rows).sum())
    assert sampler.budget == pytest.approx(100.0 * 1.1**2)


def test_state_dict_roundtrip_and_validation():
    net = torch.nn.Linear(2, 1)
    guard = OOMGuard(net)
    guard.step([torch.ones(2)], lambda rows: net(torch.stack(rows)).sum())
    state = guard.state_dict()
    other = OOMGuard(net)
    other.load_state_dict(state)
    assert other.state_dict() == state and other.steps == 1
    with pytest.raises(ValueError, match="keys"):
        other.load_state_dict({"version": 1})
    with pytest.raises(ValueError, match="version"):
        other.load_state_dict({**state, "version": 7})
    with pytest.raises(TypeError, match="torch.nn.Module"):
        OOMGuard(object())
    with pytest.raises(ValueError, match="backoff"):
        OOMGuard(net, backoff=1.0)
    with pytest.raises(ValueError, match="capacity"):
        OOMGuard(net, grow_after=10)
    with pytest.raises(ValueError, match="empty"):
        guard.step([], lambda rows: rows)
    with pytest.raises(TypeError, match="scalar tensor"):
        guard.step([torch.ones(2)], lambda rows: 1.0)
    with pytest.raises(ValueError, match="size_fn must return positive"):
        OOMGuard(net, size_fn=lambda x: 0).step(
            [torch.ones(2)], lambda rows: net(torch.stack(rows)).sum()
        )


def test_other_errors_propagate_untouched():
    net = torch.nn.Linear(2, 1)
    guard = OOMGuard(net)

    def broken(rows):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        guard.step([1, 2], broken)
    assert guard.ooms == 0


def test_wrap_is_a_guarded_step():
    net = torch.nn.Linear(3, 1)
    step = OOMGuard(net, torch.optim.SGD(net.parameters(), lr=0.1)).wrap(
        lambda rows: net(rows).mean()
    )
    before = net.weight.detach().clone()
    step(torch.ones(4, 3))
    assert not torch.equal(before, net.weight)


def test_two_process_gloo_one_rank_fails(tmp_path):
    init_file = tmp_path / "init"
    outs = [tmp_path / f"rank{r}.pt" for r in range(2)]
    run_processes([[sys.executable, str(WORKER), str(r), "2", str(init_file), str(outs[r])] for r in range(2)], timeout=90)
    # (both ranks exit 0: the failing one recovered from its OOM)
    results = [torch.load(o) for o in outs]
    reference = W.reference_params()
    for res in results:
        for name, value in reference.items():
            torch.testing.assert_close(res["params"][name], value, atol=1e-6, rtol=0)
    for name in reference:
        assert torch.equal(results[0]["params"][name], results[1]["params"][name])
    # both ranks split alike and lowered the budget alike, from rank 1's failure
    assert results[0]["parts"] == results[1]["parts"] and all(p > 1 for p in results[1]["parts"])
    assert results[0]["budget"] == results[1]["budget"] < 200.0
    assert results[0]["ooms"] == results[1]["ooms"] == 2


def test_a_backoff_below_the_longest_sample_keeps_training():
    """The backoff under the longest sample's cost: the sampler (oversized="error") refuses it,
    and that ValueError came out of ``guard.step`` after the batch was recovered, before the
    optimizer stepped. The guard now sets the least budget that holds every sample alone."""
    import fitbatch

    sizes = [1000] + [512] * 40  # two of 512 cost 1024: planned, but over the real limit
    sampler = fitbatch.BudgetBatchSampler(sizes, 1024, cost="padded", seed=0, num_replicas=1, rank=0)
    net = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    guard = OOMGuard(net, opt, sampler=sampler, size_fn=lambda i: sizes[i], cost=PaddedCost())

    def loss_fn(ids):
        if len(ids) * max(sizes[i] for i in ids) > 1000:  # the real limit, under the planned 1024
            raise torch.OutOfMemoryError("test double: out of memory")
        return net(torch.ones(len(ids), 1)).pow(2).mean()

    seen = []
    for batch in sampler:
        guard.step(batch, loss_fn, ids=batch)
        seen.extend(batch)
    assert sorted(seen) == list(range(len(sizes))) and guard.steps == len(sampler.plan())
    assert guard.ooms >= 1 and sampler.budget == 1000 and guard.events[0].budget_after == 1000


def test_guard_settings_and_state_are_checked():
    net = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match="pass size_fn= too"):
        OOMGuard(net, None, sampler=BudgetSampler(10), cost=PaddedCost())
    guard = OOMGuard(net, None, sampler=BudgetSampler(10))
    good = guard.state_dict()
    for key, value in (("steps", -5), ("ooms", 2.9), ("steps", True), ("clean_steps", -1), ("window_peak", float("nan"))):
        with pytest.raises(ValueError, match=f"OOMGuard state key '{key}'"):
            guard.load_state_dict({**good, key: value})
    with pytest.raises(ValueError, match="ids has 2 entries for a batch of 3 samples"):
        guard.step([1, 2, 3], lambda b: net(torch.ones(len(b), 1)).mean(), ids=[0, 1])


def test_an_event_counts_the_parts_the_batch_split_into():
    """A rank asks for twice the parts; a batch of 3 splits into 3 at most (it read 4)."""
    net = torch.nn.Linear(1, 1)
    guard = OOMGuard(net, torch.optim.SGD(net.parameters(), lr=0.1), sampler=BudgetSampler(10))

    def loss_fn(batch):
        if len(batch) > 1:
            raise torch.OutOfMemoryError("test double")
        return net(torch.ones(1, 1)).pow(2).mean()

    guard.step([0, 1, 2], loss_fn)
    assert guard.events[0].parts == 3
