"""The PyTorch-XLA variable-batch-size emulator's API on :mod:`fitbatch.schedule`, without torch_xla.

Migrating: ``import variable_batch_size as vbs`` becomes
``import fitbatch.compat.xla_vbs as vbs``; nothing else changes. It runs on any device (CPU,
CUDA, XLA), in one process or under an initialised ``torch.distributed`` process group.

* :class:`CustomSampler` — a :class:`fitbatch.schedule.ScheduledBatchSampler`: micro-batches of
  ``minibatch_size`` indices such that trace step s consumes ``trace[s]`` samples over all
  ranks; the epoch holds the whole trace steps that fit, the samples left over are dropped
  (counted in ``plan().stats()``), as in the original.
* :class:`LinearRuleOptimizer`, :class:`RootRuleOptimizer`, :class:`ConstantOptimizer` — wrap
  the training loop's optimizer: ``step()`` after each micro-batch's ``loss.backward()``
  accumulates until the trace step's last micro-batch, then averages the gradients over the
  step's micro-batches (all ranks), scales every learning rate by ``batch / ref_batchsize``
  (linear), its square root (root) or 1 (constant) for that step only — the factor of
  :meth:`fitbatch.schedule.GradientAccumulator.lr_factor` — steps, and zeroes the gradients.
  ``zero_grad()`` has no effect, as documented.

Deliberate differences from the original (bugs not reproduced):

* No torch_xla needed (the original calls ``xm.all_reduce``/``xm.mark_step`` on every step):
  gradients are summed over ranks with ``torch.distributed`` when a process group is
  initialised, and not at all in a single process.
* The optimizer's ``sampler`` argument may be left out, as in the README
  (``LinearRuleOptimizer(opt, ref_batchsize=256)``): the most recent :class:`CustomSampler`
  of this process is used. The original requires it.
* Every rank runs the same number of micro-batches per step: a step whose minibatches do not
  divide among the ranks gets micro-batches that differ by one sample, and a rank is never
  fed the dummy batch ``[0, 0, ...]`` (which trained on sample 0 again) — a step smaller than
  the number of ranks raises ``ValueError`` up front.
* The shuffle is keyed by ``(seed, epoch)`` through numpy's ``SeedSequence`` (the original
  seeds torch with ``seed + epoch``, so epoch 1 of seed 42 equals epoch 0 of seed 43); the
  permutation therefore differs from the original's.
* ``verbose`` messages go to ``logging``, not ``print``; ``state_dict()`` returns the state
  (the original returns ``None``); a trace that runs out raises ``ValueError`` naming the step.

>>> import torch
>>> import fitbatch.compat.xla_vbs as vbs
>>> net = torch.nn.Linear(2, 1)
>>> sampler = vbs.CustomSampler(range(24), [4, 8, 12], num_replicas=1, rank=0, minibatch_size=4)
>>> optimizer = vbs.LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), ref_batchsize=4)
>>> for batch in sampler:
...     net(torch.ones(len(batch), 2)).mean().backward()
...     if optimizer.step():
...         print(optimizer.step_index, optimizer.last_lrs)
1 [0.1]
2 [0.2]
3 [0.30000000000000004]
"""

from __future__ import annotations

import logging
import numbers
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from fitbatch._state import EPOCH_KEY, MICRO_KEY, StateSchema
from fitbatch.schedule import (
    BatchSizeSchedule,
    GradientAccumulator,
    MicroBatchInfo,
    ScheduledBatchSampler,
)

__all__ = ["ConstantOptimizer", "CustomOptimizer", "CustomSampler", "LinearRuleOptimizer", "RootRuleOptimizer"]

logger = logging.getLogger(__name__)

_LATEST: list[weakref.ref[CustomSampler]] = []
OPTIMIZER_STATE = StateSchema("CustomOptimizer", version=1, required=(EPOCH_KEY, MICRO_KEY, "optimizer"))


def _trace(trace: Any, minibatch_size: int) -> BatchSizeSchedule:
    schedule = BatchSizeSchedule.coerce(trace)
    values = schedule.distinct()
    bad = [] if values is None else [int(v) for v in values.tolist() if v % minibatch_size]
    if bad:
        raise ValueError(f"Every Sample batch size should be multiple of {minibatch_size}; got {bad[:5]}")
    return schedule


class CustomSampler(ScheduledBatchSampler):
    """Micro-batches of ``minibatch_size`` indices following a global batch-size trace.

    Args:
        dataset: the dataset (only its length is used), or the number of samples.
        trace: a ``step,batchsize`` CSV path, a list (batch size of step i), an int (constant),
            or a :class:`fitbatch.schedule.BatchSizeSchedule`; every batch size a multiple of
            ``minibatch_size``.
        seed: the shuffle's seed.
        num_replicas: the data-parallel world size (from ``torch.distributed`` when omitted).
        rank: this process's rank (from ``torch.distributed`` when omitted).
        minibatch_size: samples per micro-batch on one rank.
        verbose: log the trace and the epoch arithmetic at INFO level.

    Raises:
        ValueError: a batch size that is not a multiple of ``minibatch_size`` or is smaller
            than the number of ranks, or a trace too short for epoch 0.
    """

    def __init__(
        self,
        dataset: Any, trace: Any, seed: int = 42,  # the emulator's signature, in its order
        num_replicas: int | None = None, rank: int | None = None,
        minibatch_size: int = 32, verbose: bool = True,
    ) -> None:
        if isinstance(minibatch_size, bool) or not isinstance(minibatch_size, numbers.Integral) or minibatch_size < 1:
            raise ValueError(f"minibatch_size must be an int >= 1, got {minibatch_size!r}")
        n = dataset if isinstance(dataset, numbers.Integral) else len(dataset)
        super().__init__(
            int(n),
            _trace(trace, int(minibatch_size)),
            micro_batch_size=int(minibatch_size),
            num_replicas=num_replicas,
            rank=rank,
            shuffle=True,
            seed=seed,
            drop_last=True,
            rounding="uneven",
        )
        self.minibatch_size = int(minibatch_size)
        self.verbose = verbose
        if verbose and self.rank == 0:
            logger.info("CustomSampler: %s, %d steps in epoch 0", self.schedule, self.num_steps(0))
        _LATEST[:] = [weakref.ref(self)]


def _latest_sampler() -> CustomSampler:
    sampler = _LATEST[0]() if _LATEST else None
    if sampler is None:
        raise TypeError("pass the CustomSampler: LinearRuleOptimizer(optimizer, sampler, ref_batchsize=...)")
    return sampler


class CustomOptimizer:
    """Accumulate micro-batches into the trace's steps; the base of the rule optimizers.

    Args:
        optimizer: the torch optimizer that updates the weights.
        sampler: the :class:`CustomSampler` feeding the loop (default: the latest one made).
        ref_batchsize: the batch size the optimizer's learning rate is for.
        log_steps: log the step, batch size and learning rate every ``log_steps`` steps.
        reduction: ``"mean"`` (average the step's micro-batch gradients) or ``"sum"``.
    """

    lr_rule = "none"

    def __init__(
        self,
        optimizer: Any,
        sampler: CustomSampler | None = None,
        ref_batchsize: float | None = None,
        log_steps: int | None = None,
        reduction: str = "mean",
    ) -> None:
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be one of ('mean', 'sum'), got {reduction!r}")
        self.optimizer = optimizer
        self.sampler = sampler if sampler is not None else _latest_sampler()
        self.ref_batchsize = ref_batchsize
        self.log_steps, self.reduction = log_steps, reduction
        reference = ref_batchsize if self.lr_rule != "none" else None
        self._rule = GradientAccumulator(None, optimizer, lr_rule=self.lr_rule, reference=reference, normalize="samples")
        self.last_lrs: list[float] = []
        self.set_epoch(self.sampler.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Follow the sampler into ``epoch`` (call ``sampler.set_epoch(epoch)`` first)."""
        if epoch != self.sampler.epoch:
            raise ValueError(f"the sampler is at epoch {self.sampler.epoch}: call sampler.set_epoch({epoch}) first")
        self._infos: Sequence[MicroBatchInfo] = self.sampler.infos()
        self._cursor = 0
        self.step_index = 0
        self.optimizer.zero_grad()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No effect: gradients are zeroed after each step."""

    def get_lr(self) -> tuple[float, ...]:
        return tuple(group["lr"] for group in self.optimizer.param_groups)

    def get_bs(self) -> int:
        """The batch size of the current step (0 past the epoch's last step)."""
        return self._infos[self._cursor].step_samples if self._cursor < len(self._infos) else 0

    def current_lr(self) -> float:
        """The first group's learning rate the current step will use."""
        if self._cursor >= len(self._infos):
            return float(self.get_lr()[0])
        return float(self.get_lr()[0] * self._rule.lr_factor(self._infos[self._cursor]))

    def step(self) -> bool:
        """Account one micro-batch; ``True`` when the weights were updated (the step closed)."""
        if self._cursor >= len(self._infos):
            raise RuntimeError(f"the epoch has {len(self._infos)} micro-batches; call set_epoch() for the next one")
        info = self._infos[self._cursor]
        self._cursor += 1
        if not info.closes_step:
            return False
        self._reduce(1.0 if self.reduction == "sum" else 1.0 / (info.n_micro * info.world), info.world)
        groups = self.optimizer.param_groups
        saved = [g["lr"] for g in groups]
        factor = self._rule.lr_factor(info)
        try:
            for g in groups:
                g["lr"] = g["lr"] * factor
            self.last_lrs = [float(g["lr"]) for g in groups]
            self.optimizer.step()
        finally:
            for g, lr in zip(groups, saved):
                g["lr"] = lr
        self.optimizer.zero_grad()
        self.step_index += 1
        if self.log_steps and self.step_index % self.log_steps == 0:
            logger.info("step %d: batch size %d, lr %s", info.step, info.step_samples, self.last_lrs)
        return True

    def _reduce(self, scale: float, world: int) -> None:
        import torch.distributed as dist

        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if world > 1 and dist.is_available() and dist.is_initialized():
            for grad in grads:
                dist.all_reduce(grad)
        for grad in grads:
            grad.mul_(scale)

    def state_dict(self) -> dict[str, Any]:
        """``{version, epoch, micro, optimizer}``: where in the epoch, and the inner optimizer.

        >>> import torch
        >>> sampler = CustomSampler(range(8), 4, num_replicas=1, rank=0, minibatch_size=2, verbose=False)
        >>> opt = ConstantOptimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1), sampler)
        >>> sorted(opt.state_dict())
        ['epoch', 'micro', 'optimizer', 'version']
        """
        return OPTIMIZER_STATE.envelope(epoch=self.sampler.epoch, micro=self._cursor, optimizer=self.optimizer.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the sampler must be at the same epoch)."""
        OPTIMIZER_STATE.check(state)
        self.set_epoch(int(state[EPOCH_KEY]))
        self.optimizer.load_state_dict(state["optimizer"])
        self._cursor = int(state[MICRO_KEY])
        self.step_index = sum(1 for info in self._infos[: self._cursor] if info.closes_step)


class LinearRuleOptimizer(CustomOptimizer):
    """Learning rate ``lr * batch / ref_batchsize`` for each step (see :class:`CustomOptimizer`)."""

    lr_rule = "linear"


class RootRuleOptimizer(CustomOptimizer):
    """Learning rate ``lr * sqrt(batch / ref_batchsize)`` for each step (see :class:`CustomOptimizer`)."""

    lr_rule = "sqrt"


class ConstantOptimizer(CustomOptimizer):
    """The optimizer's own learning rate for every step (see :class:`CustomOptimizer`)."""

    lr_rule = "none"
