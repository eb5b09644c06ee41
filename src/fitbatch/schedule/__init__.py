"""Variable batch-size schedules, gradient accumulation and learning-rate rules, on any device.

Three parts, each in its own private module, re-exported here:

* :class:`BatchSizeSchedule` — the global batch size of every optimizer step, from a
  ``trace.csv`` (``step,batchsize``, the PyTorch-XLA emulator's format), a list, a constant, a
  linear ramp-up or a function;
* :class:`ScheduledBatchSampler` — micro-batches such that step s consumes exactly
  ``schedule(s)`` samples (or a budget of size units) over all ranks, with equal micro-batch
  counts per rank, exact ``len()``, ``set_epoch`` and O(1) resume; :class:`MicroBatchInfo`
  says where each micro-batch stands in its step;
* :class:`GradientAccumulator` — accumulates a step's micro-batches (``no_sync`` under DDP),
  normalises by the step's real units over all ranks, applies the LR rule for that step only.

>>> import torch
>>> net = torch.nn.Linear(3, 1)
>>> opt = torch.optim.SGD(net.parameters(), lr=0.01)
>>> sampler = ScheduledBatchSampler(24, [4, 8, 12], micro_batch_size=4, seed=0)
>>> acc = GradientAccumulator(net, opt, lr_rule="linear", reference=4, normalize="samples")
>>> x, y = torch.randn(24, 3), torch.randn(24, 1)
>>> for batch, info in sampler.with_info():
...     if acc.backward((net(x[batch]) - y[batch]).pow(2).sum(), info):
...         print(info.step, info.step_samples, info.n_micro, acc.last_lrs)
0 4 1 [0.01]
1 8 2 [0.02]
2 12 3 [0.03]
"""

from __future__ import annotations

from fitbatch.schedule._accumulate import LR_RULES, NORMALIZE, GradientAccumulator
from fitbatch.schedule._layout import ROUNDING
from fitbatch.schedule._sampler import MicroBatchInfo, ScheduledBatchSampler
from fitbatch.schedule._sizes import ON_EXHAUSTED, BatchSizeSchedule

__all__ = [
    "BatchSizeSchedule",
    "GradientAccumulator",
    "LR_RULES",
    "MicroBatchInfo",
    "NORMALIZE",
    "ON_EXHAUSTED",
    "ROUNDING",
    "ScheduledBatchSampler",
]
