"""How :class:`~fitbatch.memory.OOMGuard` ranks agree, with small all-reduces, in data-parallel runs.

Every rank runs its micro-batches without communication; then one all-reduce tells all ranks
whether any of them failed and into how many parts to split, so that a rank that fails never
leaves the others waiting in a collective and all take the same decisions. Only when all
succeeded are the gradients averaged (:func:`reduce_gradients`). Alone (no process group, or a
world of one), every function here is a no-op or answers for this rank only. torch is imported
on use, so that importing this module needs no torch.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import torch

_BUCKET_BYTES = 32 * 2**20  # gradient all-reduce bucket


def is_distributed() -> bool:
    """Whether ``torch.distributed`` is initialised with more than one rank."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def no_sync(model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
    """``model.no_sync()`` in a distributed run (``DistributedDataParallel``), else a null context."""
    no_sync_fn = getattr(model, "no_sync", None)
    if no_sync_fn is not None and is_distributed():
        return no_sync_fn()  # type: ignore[no-any-return]
    return contextlib.nullcontext()


def _comm_tensor(device: torch.device, values: list[float]) -> torch.Tensor:
    import torch
    import torch.distributed as dist

    device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    return torch.tensor(values, dtype=torch.float64, device=device)


def agree(
    failed: NDArray[np.int64] | None, parts: int, n: int, device: torch.device
) -> tuple[bool, int]:
    """(any rank hit a lone sample, parts to retry with or 0), identical on all ranks."""
    fatal = failed is not None and len(failed) == 1
    request = 0 if failed is None else min(2 * parts, n)
    if failed is not None and request <= parts:
        fatal = True
    if is_distributed():
        import torch.distributed as dist

        flags = _comm_tensor(device, [float(fatal), float(request)])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        fatal, request = bool(flags[0].item()), int(flags[1].item())
    if request and not fatal:
        request = max(request, 2 * parts)  # another rank with fewer samples must still progress
    return fatal, request


def gather_failure(row: list[float], device: torch.device) -> NDArray[np.float64]:
    """Rows (failed, count, max units, sum units) of every rank (just this one when alone)."""
    if not is_distributed():
        return np.asarray([row], dtype=np.float64)
    import torch.distributed as dist

    table = [[0.0] * 4 for _ in range(dist.get_world_size())]
    table[dist.get_rank()] = row
    tensor = _comm_tensor(device, sum(table, []))
    dist.all_reduce(tensor)
    return np.asarray(tensor.cpu().tolist(), dtype=np.float64).reshape(-1, 4)


def max_over_ranks(value: float, device: torch.device) -> float:
    """The largest ``value`` of all ranks (this one's when alone)."""
    if not is_distributed():
        return value
    import torch.distributed as dist

    flag = _comm_tensor(device, [value])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return float(flag[0].item())


def reduce_gradients(model: torch.nn.Module) -> None:
    """Average the gradients of ``model`` over all ranks (nothing when alone)."""
    if not is_distributed():
        return
    import torch
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    world = dist.get_world_size()
    grads = []
    for p in model.parameters():
        if p.requires_grad:
            if p.grad is None:  # a rank whose batch did not touch p still joins the reduction
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    # buckets of one dtype and device, up to _BUCKET_BYTES: few collectives, bounded extra memory
    bucket: list[torch.Tensor] = []
    size = 0
    for i, g in enumerate(grads):
        bucket.append(g)
        size += g.numel() * g.element_size()
        last = i + 1 == len(grads)
        if (
            last
            or size >= _BUCKET_BYTES
            or (grads[i + 1].dtype, grads[i + 1].device) != (g.dtype, g.device)
        ):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat)
            flat.div_(world)
            for g_out, reduced in zip(
                bucket, _unflatten_dense_tensors(flat, bucket), strict=True
            ):
                g_out.copy_(reduced)
            bucket, size = [], 0


def least_budget(sampler: Any) -> float | None:
    """The least budget ``sampler`` can take: its longest sample's cost alone (``None``: unknown).

    >>> import fitbatch
    >>> least_budget(fitbatch.BudgetBatchSampler([3, 9, 4], 20, num_replicas=1, rank=0))
    9.0
    """
    opts = getattr(sampler, "options", None)
    cost = getattr(opts, "cost", None)
    if cost is None or getattr(cost, "name", "") == "limits":
        return None
    column = getattr(sampler, "_column", None)  # a windowed sampler's: its largest is known
    if column is not None and getattr(column, "largest", None) is not None:
        return float(cost.sample_cost(np.array([float(column.largest)]))[0])
    values = getattr(getattr(sampler, "_sizes", None), "values", None)
    if values is None or not len(values) or np.ndim(values) != 1:
        return None
    return float(np.max(cost.sample_cost(np.asarray(values, dtype=np.float64))))
