"""fitbatch.compat.xla_vbs: the variable-batch-size emulator's documented behaviour, without torch_xla.

The original (``variable_batch_size.py``) is not a package and needs torch_xla, so it is not
run here: these tests check what its README and docstrings describe — a ``step,batchsize``
trace, micro-batches of ``minibatch_size``, each step consuming its global batch size over all
ranks, whole steps per epoch with the leftover samples dropped, and optimizers that accumulate
until the step's last micro-batch and scale the learning rate by the linear / root rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fitbatch.compat.xla_vbs as vbs  # noqa: E402


def _trace_file(tmp_path, sizes):
    path = tmp_path / "trace.csv"
    path.write_text(" step,batchsize\n" + "".join(f" {i}, {s}\n" for i, s in enumerate(sizes)))
    return str(path)


def _epoch_steps(trace, n, minibatch, epoch):
    """The original's rule: each epoch takes the whole trace steps that fit its samples."""
    room = n // minibatch * minibatch
    start = 0
    for _ in range(epoch + 1):
        end, total = start, 0
        while total + trace[end] <= room:
            total += trace[end]
            end += 1
        first, start = start, end
    return trace[first:end]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_steps_follow_the_trace_over_all_ranks(tmp_path, world):
    trace = [8, 8, 16, 32, 8, 24, 16, 8, 32, 16, 8, 8] * 3
    path = _trace_file(tmp_path, trace)
    n = 101
    for epoch in range(3):
        per_rank = []
        for rank in range(world):
            sampler = vbs.CustomSampler(range(n), path, num_replicas=world, rank=rank, minibatch_size=4)
            sampler.set_epoch(epoch)
            per_rank.append(list(sampler.with_info()))
        expected = _epoch_steps(trace, n, 4, epoch)
        rows = len(per_rank[0])
        assert all(len(r) == rows for r in per_rank)  # equal micro-batch counts on every rank
        steps: dict[int, list[int]] = {}
        for r in per_rank:
            for batch, info in r:
                steps.setdefault(info.step, []).extend(batch)
        assert [len(v) for _, v in sorted(steps.items())] == expected
        seen = [i for v in steps.values() for i in v]
        assert len(seen) == len(set(seen))  # no sample twice, no dummy batches
        if world == 1:
            assert all(len(b) == 4 for b, _ in per_rank[0])


def test_int_and_list_traces_and_validation():
    assert [len(b) for b in vbs.CustomSampler(range(20), 8, num_replicas=1, rank=0, minibatch_size=4)] == [4] * 4
    sampler = vbs.CustomSampler(range(20), [4, 12, 8], num_replicas=1, rank=0, minibatch_size=4)
    assert sampler.num_steps() == 2 and sampler.plan().stats().dropped == 4
    with pytest.raises(ValueError, match="multiple of 4"):
        vbs.CustomSampler(range(20), [4, 6], num_replicas=1, rank=0, minibatch_size=4)
    with pytest.raises(ValueError):
        vbs.CustomSampler(range(20), [4], num_replicas=8, rank=0, minibatch_size=4)  # step < ranks x ...


def test_same_seed_and_epoch_same_order_other_epoch_other_order():
    a = vbs.CustomSampler(range(64), 16, num_replicas=1, rank=0, minibatch_size=8)
    b = vbs.CustomSampler(range(64), 16, num_replicas=1, rank=0, minibatch_size=8)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first


def _train(opt_cls, trace, ref, seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Linear(3, 1)
    x, y = torch.randn(40, 3), torch.randn(40, 1)
    sampler = vbs.CustomSampler(range(40), trace, num_replicas=1, rank=0, minibatch_size=4)
    optimizer = opt_cls(torch.optim.SGD(net.parameters(), lr=0.05), sampler, ref_batchsize=ref)
    stepped = []
    for batch in sampler:
        ((net(x[batch]) - y[batch]) ** 2).mean().backward()
        optimizer.zero_grad()  # documented: no effect
        stepped.append(optimizer.step())
    return net, stepped, [b for b in sampler.plan()], x, y


@pytest.mark.parametrize(("cls", "rule"), [(vbs.LinearRuleOptimizer, lambda r: r), (vbs.RootRuleOptimizer, math.sqrt), (vbs.ConstantOptimizer, lambda r: 1.0)])
def test_optimizers_equal_big_batch_sgd_with_the_lr_rule(cls, rule):
    trace = [8, 4, 16, 8, 16]  # 36 of 40 samples in 4 steps; the trace must reach past the epoch
    net, stepped, batches, x, y = _train(cls, trace, ref=8)
    assert stepped == [False, True, True, False, False, False, True, False, True]
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 1)
    k = 0
    for size in trace[:4]:
        idx = np.concatenate([b for b in batches[k : k + size // 4]])
        k += size // 4
        ref.zero_grad()
        ((ref(x[idx]) - y[idx]) ** 2).mean().backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= 0.05 * rule(size / 8) * p.grad
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)


def test_set_epoch_protocol_and_state():
    net = torch.nn.Linear(2, 1)
    sampler = vbs.CustomSampler(range(16), 8, num_replicas=1, rank=0, minibatch_size=4)
    opt = vbs.LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), sampler, ref_batchsize=8)
    assert opt.get_bs() == 8 and opt.current_lr() == pytest.approx(0.1)
    with pytest.raises(ValueError, match="set_epoch"):
        opt.set_epoch(1)
    for _ in sampler:
        net(torch.ones(4, 2)).sum().backward()
        opt.step()
    with pytest.raises(RuntimeError, match="set_epoch"):
        opt.step()
    state = opt.state_dict()
    assert state["micro"] == 4 and opt.step_index == 2
    sampler.set_epoch(1)
    opt.set_epoch(1)
    assert opt.step_index == 0
    sampler.set_epoch(0)
    opt.load_state_dict(state)
    assert opt.step_index == 2


README = """
import fitbatch.compat.xla_vbs as vbs

train_sampler = vbs.CustomSampler(
  train_dataset,
  'trace.csv',
  num_replicas=global_world_size,
  rank=global_ordinal,
  minibatch_size=flags.batch_size)

internal_optimizer = optim.SGD(model.parameters(), lr=lr, momentum=flags.momentum)
optimizer = vbs.LinearRuleOptimizer(internal_optimizer, ref_batchsize = 256)

for epoch in range(2):
  train_sampler.set_epoch(epoch)
  optimizer.set_epoch(epoch)
  loader = torch.utils.data.DataLoader(train_dataset, batch_sampler=train_sampler)
  for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    STEPS.append(optimizer.step())
"""


def test_readme_example_runs_unchanged_without_torch_xla(tmp_path, monkeypatch):
    from types import SimpleNamespace

    monkeypatch.chdir(tmp_path)
    _trace_file(tmp_path, [64, 64, 128, 128, 256, 256] * 4)
    ns = {
        "torch": torch,
        "optim": torch.optim,
        "train_dataset": torch.utils.data.TensorDataset(torch.randn(600, 5), torch.randn(600, 1)),
        "global_world_size": 1,
        "global_ordinal": 0,
        "flags": SimpleNamespace(batch_size=32, momentum=0.9),
        "model": torch.nn.Linear(5, 1),
        "lr": 0.01,
        "STEPS": [],
    }
    exec(compile(README, "xla-vbs-readme", "exec"), ns)
    trace = [64, 64, 128, 128, 256, 256] * 4
    expected = len(_epoch_steps(trace, 600, 32, 0)) + len(_epoch_steps(trace, 600, 32, 1))
    assert sum(ns["STEPS"]) == expected == 4 + 3
