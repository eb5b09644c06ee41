"""Who iterates a sampler: accelerate's ``BatchSamplerShard`` shards batch samplers a second time.

``accelerator.prepare(DataLoader(..., batch_sampler=sampler))`` wraps the batch sampler in
accelerate's ``BatchSamplerShard``, which hands process ``p`` the batches ``p``, ``p + world``,
``p + 2 world``, ... of what the sampler yields. A fitbatch sampler already yields only its own
rank's batches: sharded again, each rank would run ``1/world`` of them and the epoch would lose
the rest, silently. So :class:`~fitbatch.sampler._budget.PlanSampler` asks :func:`outer_world` who calls
its ``__iter__``/``__len__``:

* a ``BatchSamplerShard`` over the sampler's own world: the sampler yields (and counts) the
  *global* step layout, step by step, rank 0's batch first, so the shard's every-world-th pick
  gives each rank exactly fitbatch's batches (equal steps, cost balance, ``step_totals``);
* a ``BatchSamplerShard`` of one process (one that
  :func:`fitbatch.integrations.accelerate.prepare` made a pass-through): nothing changes;
* a shard over another world, a sampler that cannot lay out every rank's batches, or
  accelerate's ``DataLoaderDispatcher`` over several ranks (``dispatch_batches=True``, which
  concatenates the batches of several ranks): a ``ValueError`` at the first batch (or at
  ``len()``), naming the way out.

accelerate is never imported here: its classes are recognised by module and name.

>>> import sys
>>> outer_world(object(), sys._getframe())  # called by no accelerate object
1
"""

from __future__ import annotations

from types import FrameType
from typing import Any

ACCELERATE_MODULE = "accelerate.data_loader"
#: frames walked up from a sampler's ``__iter__`` to find a ``DataLoaderDispatcher``
#: (torch's loader iterator and the loader sit between them)
DISPATCH_DEPTH = 10
SUPPORTED = "fitbatch.integrations.accelerate.prepare(accelerator, loader)"
#: the way out for a sampler that yields its own rank's batches only and has no state to resume
SUPPORTED_STATELESS = "fitbatch.integrations.accelerate.prepare_loader(accelerator, loader)"


def _accelerate_object(frame: FrameType | None, name: str) -> Any:
    """The ``self`` of ``frame`` if it is accelerate's class ``name``, else ``None``."""
    if frame is None:
        return None
    obj = frame.f_locals.get("self")
    cls = type(obj)
    return obj if cls.__name__ == name and cls.__module__ == ACCELERATE_MODULE else None


def outer_world(sampler: Any, caller: FrameType | None, *, iterating: bool = False) -> int:
    """The world to lay out every rank's batches for (1: yield this rank's own, as always).

    Args:
        sampler: the fitbatch sampler (``num_replicas``, ``rank``, ``SHARES_PLAN``).
        caller: the frame that called the sampler's ``__iter__`` or ``__len__``.
        iterating: called from ``__iter__`` (then a ``DataLoaderDispatcher`` further up is
            refused as well).

    Raises:
        ValueError: accelerate would split or merge this sampler's batches in a way that loses,
            repeats or mixes samples (the message names the fix).
    """
    shard = _accelerate_object(caller, "BatchSamplerShard")
    if shard is not None:
        return _shard_world(sampler, shard)
    if iterating and getattr(sampler, "num_replicas", 1) > 1:
        frame = caller
        for _ in range(DISPATCH_DEPTH):
            if frame is None:
                break
            if _accelerate_object(frame, "DataLoaderDispatcher") is not None:
                raise ValueError(
                    f"{type(sampler).__name__} under accelerate's dispatch_batches=True: the main process "
                    "would concatenate the batches of several ranks and split them again, breaking the "
                    "budget and the per-rank plan; use DataLoaderConfiguration(dispatch_batches=False) "
                    f"(the default for map-style datasets) or {SUPPORTED}"
                )
            frame = frame.f_back
    return 1


def _shard_world(sampler: Any, shard: Any) -> int:
    world, index = int(shard.num_processes), int(shard.process_index)
    if world == 1:  # a pass-through: this rank's batches, unchanged
        return 1
    name = type(sampler).__name__
    if getattr(shard, "split_batches", False):
        raise ValueError(
            f"accelerate's split_batches=True would cut each {name} batch into {world} pieces; "
            f"use split_batches=False (the default) or {SUPPORTED}"
        )
    if not getattr(sampler, "SHARES_PLAN", False):
        way = SUPPORTED if hasattr(sampler, "load_state_dict") else SUPPORTED_STATELESS
        raise ValueError(
            f"{name} yields this rank's batches only and accelerate's BatchSamplerShard would shard "
            f"them again (each rank would run 1/{world} of them); prepare the loader with {way}"
        )
    if (sampler.num_replicas, sampler.rank) != (world, index):
        raise ValueError(
            f"accelerate shards this {name} over {world} processes (this one is {index}), but it was built "
            f"for rank {sampler.rank} of {sampler.num_replicas}: build it after Accelerator() (it reads "
            "torch.distributed) or pass num_replicas=accelerator.num_processes, "
            "rank=accelerator.process_index"
        )
    return world


__all__ = ["outer_world"]
