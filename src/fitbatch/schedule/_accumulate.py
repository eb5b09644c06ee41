"""``GradientAccumulator``: one optimizer step per scheduled step, exact whatever the micro-batches.

For each micro-batch the training loop passes the SUM of its per-unit losses (per real token,
or per sample) and the :class:`~fitbatch.schedule.MicroBatchInfo` from the sampler. The accumulator

* zeroes the gradients when a step opens and checks that no micro-batch was skipped;
* scales the loss by ``1 / step total`` (the step's real units, its tokens that carry loss
  with ``normalize="loss_tokens"``, or samples, over all ranks and micro-batches), so the accumulated gradient is that of one big batch whose loss is the mean
  per unit, however unequal the micro-batches are; under ``DistributedDataParallel`` (any model
  with ``no_sync``) it also multiplies by the world size to undo DDP's mean all-reduce, and runs
  every micro-batch but the step's last inside ``no_sync()``; a plain model in an initialised
  process group has its gradients all-reduced (summed) once per step instead;
* on the step's last micro-batch, sets each group's learning rate to ``lr x rule(size /
  reference)`` (``"linear"``: the ratio, ``"sqrt"``: its square root, ``"none"``: 1), steps the
  optimizer (through a ``torch.amp.GradScaler`` when given), and restores the learning rates so
  an outer LR scheduler keeps working. ``size`` is the step's total in the ``normalize`` unit.

The seed's ``LinearRuleOptimizer(optimizer, ref_batchsize=256)`` is
``GradientAccumulator(model, optimizer, lr_rule="linear", reference=256, normalize="samples")``.

>>> import torch
>>> from fitbatch.schedule import ScheduledBatchSampler
>>> net = torch.nn.Linear(2, 1)
>>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
>>> acc = GradientAccumulator(net, opt, lr_rule="linear", reference=4, normalize="samples")
>>> data = torch.ones(8, 2)
>>> for batch, info in ScheduledBatchSampler(8, [8], micro_batch_size=4).with_info():
...     stepped = acc.backward(net(data[batch]).pow(2).sum(), info)
>>> stepped, acc.steps, acc.last_lrs, opt.param_groups[0]["lr"]
(True, 1, [0.2], 0.1)
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from typing import Any

from fitbatch._state import CONFIG_KEY, STEPS_KEY, StateSchema
from fitbatch._validate import choice, non_negative_int, parse_budget
from fitbatch.schedule._sampler import MicroBatchInfo

logger = logging.getLogger(__name__)

LR_RULES = ("linear", "sqrt", "none")
NORMALIZE = ("tokens", "samples", "loss_tokens")
STATE = StateSchema("accumulator", version=1, required=(STEPS_KEY, CONFIG_KEY, "scaler"))


class GradientAccumulator:
    """Accumulate micro-batches into scheduled optimizer steps (see the module docstring).

    Args:
        model: the module whose ``backward`` runs (a ``DistributedDataParallel`` wrapper when
            data-parallel).
        optimizer: its optimizer.
        lr_rule: ``"linear"``, ``"sqrt"`` or ``"none"``.
        reference: the step size at which the optimizer's own LR applies (same unit as
            ``normalize``); required unless ``lr_rule="none"``.
        normalize: divide by the step's real units (``"tokens"``, the sampler's sizes), its
            tokens that carry loss (``"loss_tokens"``: the sampler's ``loss_sizes``, e.g.
            labels != -100, summed over all ranks and micro-batches; the loss passed is then the
            SUM of per-token losses over those tokens) or its ``"samples"``.
        scaler: a ``torch.amp.GradScaler`` (optional).
        clip_grad_norm: clip the step's gradient to this norm before stepping (optional).

    Two micro-batches of 8 tokens make one step of 16 tokens, so ``"sqrt"`` doubles the LR for it:

    >>> import torch
    >>> from fitbatch.schedule import GradientAccumulator, ScheduledBatchSampler
    >>> sampler = ScheduledBatchSampler([3, 5, 2, 6], 4, micro_batch_size=2, shuffle=False)
    >>> net = torch.nn.Linear(1, 1)
    >>> acc = GradientAccumulator(net, torch.optim.SGD(net.parameters(), lr=0.1), lr_rule="sqrt", reference=4)
    >>> x, tokens = torch.ones(4, 1), torch.tensor([[3.0], [5.0], [2.0], [6.0]])
    >>> for b, info in sampler.with_info():  # each sample's loss summed over its tokens
    ...     stepped = acc.backward((net(x[b]).pow(2) * tokens[b]).sum(), info)
    >>> stepped, acc.step_size(info), acc.lr_factor(info), acc.steps, acc.last_lrs
    (True, 16.0, 2.0, 1, [0.2])
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        *,
        lr_rule: str = "linear",
        reference: float | None = None,
        normalize: str = "tokens",
        scaler: Any = None,
        clip_grad_norm: float | None = None,
    ) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.lr_rule = choice("lr_rule", lr_rule, LR_RULES)
        self.normalize = choice("normalize", normalize, NORMALIZE)
        if reference is None and self.lr_rule != "none":
            raise ValueError(f"lr_rule={lr_rule!r} needs reference=, the step size the optimizer's LR is for")
        self.reference = None if reference is None else parse_budget(reference, "reference")
        self.clip_grad_norm = None if clip_grad_norm is None else parse_budget(clip_grad_norm, "clip_grad_norm")
        self.steps = 0  # optimizer steps taken
        self.last_lrs: list[float] = []  # the learning rates of the latest step
        self._pending = 0  # micro-batches of the open step already accumulated
        self._open: int | None = None  # global step being accumulated

    # ------------------------------------------------------------------ rules

    def step_size(self, info: MicroBatchInfo) -> float:
        """The step's total in the ``normalize`` unit (all ranks, all micro-batches).

        >>> from fitbatch.schedule import ScheduledBatchSampler
        >>> sampler = ScheduledBatchSampler([3, 5, 2, 6], 4, micro_batch_size=2, loss_sizes=[2, 4, 0, 5])
        >>> info = sampler.infos()[0]
        >>> import torch
        >>> net = torch.nn.Linear(1, 1)
        >>> acc = GradientAccumulator(net, torch.optim.SGD(net.parameters(), lr=0.1), lr_rule="none", normalize="loss_tokens")
        >>> acc.step_size(info), info.step_units
        (11.0, 16.0)
        """
        if self.normalize == "loss_tokens":
            if info.step_loss_units is None:
                raise ValueError(
                    f"normalize='loss_tokens' needs the step's loss units; step {info.step}'s info has none: "
                    "take the infos from ScheduledBatchSampler (pass loss_sizes= to it)"
                )
            return float(info.step_loss_units)
        return float(info.step_units if self.normalize == "tokens" else info.step_samples)

    def lr_factor(self, info: MicroBatchInfo) -> float:
        """The factor the LR rule applies to every group's learning rate for ``info``'s step."""
        if self.lr_rule == "none" or self.reference is None:
            return 1.0
        ratio = self.step_size(info) / self.reference
        return ratio if self.lr_rule == "linear" else math.sqrt(ratio)

    # ------------------------------------------------------------------ training

    def backward(self, loss_sum: Any, info: MicroBatchInfo) -> bool:
        """Backward one micro-batch; step the optimizer when it closes its step.

        Args:
            loss_sum: the SUM over this micro-batch's real units (or samples) of their loss.
            info: the micro-batch's :class:`MicroBatchInfo` from the sampler.

        Returns:
            ``True`` when the optimizer stepped.
        """
        self._check_order(info)
        total = self.step_size(info)
        if not total > 0:
            raise ValueError(
                f"step {info.step} has no {'loss tokens' if self.normalize == 'loss_tokens' else 'real units'} "
                "to normalise by (its total is 0); use normalize='samples', or skip steps without loss tokens"
            )
        averaging, reducing = self._world_mode(info.world)
        loss = loss_sum * ((info.world if averaging else 1) / total)
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        quiet = averaging and not info.closes_step
        with self.model.no_sync() if quiet else contextlib.nullcontext():
            loss.backward()
        self._pending += 1
        if not info.closes_step:
            return False
        if reducing:
            self._all_reduce()
        self._step(self.lr_factor(info))
        return True

    def _check_order(self, info: MicroBatchInfo) -> None:
        if info.opens_step:
            if self._pending:
                raise RuntimeError(
                    f"step {self._open} was left after {self._pending} micro-batches; step {info.step} opens"
                )
            self.optimizer.zero_grad(set_to_none=True)
            self._open = info.step
        elif info.step != self._open or info.micro != self._pending:
            raise RuntimeError(
                f"micro-batch {info.micro} of step {info.step} arrived, expected micro-batch {self._pending} "
                f"of step {self._open}: pass every micro-batch, in order, from a step boundary"
            )

    def _world_mode(self, world: int) -> tuple[bool, bool]:
        """(DDP-style averaging model, needs our own all-reduce)."""
        import torch.distributed as dist

        live = dist.is_available() and dist.is_initialized()
        actual = dist.get_world_size() if live else 1
        if world != actual:
            raise ValueError(
                f"the sampler plans for {world} ranks but torch.distributed has {actual}; "
                "build the sampler in the initialised process group (or pass num_replicas)"
            )
        averaging = world > 1 and hasattr(self.model, "no_sync")
        return averaging, world > 1 and not averaging

    def _all_reduce(self) -> None:
        import torch
        import torch.distributed as dist

        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)

    def _step(self, factor: float) -> None:
        groups = self.optimizer.param_groups
        saved = [g["lr"] for g in groups]
        try:
            for g in groups:
                g["lr"] = g["lr"] * factor
            self.last_lrs = [float(g["lr"]) for g in groups]
            if self.clip_grad_norm is not None:
                import torch

                if self.scaler is not None:
                    self.scaler.unscale_(self.optimizer)
                params = [p for g in groups for p in g["params"]]
                torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        finally:
            for g, lr in zip(groups, saved, strict=True):
                g["lr"] = lr
        self.steps += 1
        self._pending, self._open = 0, None

    # ------------------------------------------------------------------ state

    def _config(self) -> dict[str, Any]:
        return {"lr_rule": self.lr_rule, "reference": self.reference, "normalize": self.normalize}

    def state_dict(self) -> dict[str, Any]:
        """``{version, steps, config, scaler}`` (the scaler's own state, when there is one).

        Raises:
            RuntimeError: in the middle of a step (accumulated gradients are not saved).

        >>> import torch
        >>> net = torch.nn.Linear(2, 1)
        >>> GradientAccumulator(net, torch.optim.SGD(net.parameters(), lr=0.1), reference=4).state_dict()
        {'version': 1, 'steps': 0, 'config': {'lr_rule': 'linear', 'reference': 4.0, 'normalize': 'tokens'}, 'scaler': None}
        """
        if self._pending:
            raise RuntimeError(
                f"checkpoint at a step boundary: step {self._open} has {self._pending} micro-batches accumulated"
            )
        scaler = None if self.scaler is None else self.scaler.state_dict()
        return STATE.envelope(steps=self.steps, config=self._config(), scaler=scaler)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state``; rejects unknown or missing keys, versions and another configuration."""
        STATE.check(state)
        if dict(state[CONFIG_KEY]) != self._config():
            raise ValueError(f"state was saved with {state[CONFIG_KEY]!r}, this accumulator has {self._config()!r}")
        if (state["scaler"] is None) != (self.scaler is None):
            raise ValueError("state and accumulator disagree on having a GradScaler")
        self.steps = non_negative_int("steps", state[STEPS_KEY])
        if self.scaler is not None:
            self.scaler.load_state_dict(dict(state["scaler"]))
        self._pending, self._open, self.last_lrs = 0, None, []

    def __repr__(self) -> str:
        return (
            f"GradientAccumulator(lr_rule={self.lr_rule!r}, reference={self.reference}, "
            f"normalize={self.normalize!r}, steps={self.steps})"
        )
