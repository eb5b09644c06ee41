"""How :class:`~fitbatch.memory.OOMGuard` splits a batch and accumulates its gradient.

A batch (a list or tuple of samples, a tensor, or a mapping of per-row tensors or lists) is cut
into micro-batches of positions; each micro-batch's loss is scaled by its share of the batch's
real size units, so that the accumulated gradient equals the whole batch's. torch is imported on
use, so that importing this module needs no torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.memory.profile import is_oom_error

if TYPE_CHECKING:
    import torch


def sample_units(batch: Any, n: int, size_fn: Callable[[Any], float] | None) -> NDArray[np.float64]:
    """Real size units of each of the ``n`` samples (all 1 without ``size_fn``), checked positive."""
    if size_fn is None:
        return np.ones(n)
    units = np.array([float(size_fn(_item(batch, i))) for i in range(n)], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(units) | (units <= 0))
    if bad.size:
        raise ValueError(
            f"size_fn must return positive finite units; sample {int(bad[0])} has {units[bad[0]]!r}"
        )
    return units


def accumulate(
    batch: Any,
    loss_fn: Callable[[Any], torch.Tensor],
    units: NDArray[np.float64],
    total: float,
    order: NDArray[np.int64],
    parts: int,
    sync: contextlib.AbstractContextManager[Any],
) -> tuple[Any, NDArray[np.int64] | None]:
    """Accumulate the gradient in ``parts`` micro-batches: (detached loss, None) or (None, failing positions).

    ``sync`` is entered around the backward passes (``no_sync`` for ``DistributedDataParallel``).
    """
    chunks = [np.sort(c) for c in np.array_split(order, min(parts, len(order)))]
    total_loss: Any = 0.0
    failed: NDArray[np.int64] | None = None
    with sync:
        for chunk in chunks:
            micro = batch if parts == 1 else _take(batch, chunk)
            try:
                scaled = _check_loss(loss_fn(micro)) * (float(units[chunk].sum()) / total)
                scaled.backward()
            except Exception as exc:
                if not is_oom_error(exc):
                    raise
                failed = chunk
                break  # leaving the except block drops the traceback that holds activations
            total_loss = total_loss + scaled.detach()
            del micro, scaled
    return (None, failed) if failed is not None else (total_loss, None)


def _check_loss(loss: Any) -> torch.Tensor:
    import torch

    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(
            f"loss_fn must return a scalar tensor, got {type(loss).__name__}"
            f"{'' if not isinstance(loss, torch.Tensor) else f' of shape {tuple(loss.shape)}'}"
        )
    return loss


def _batch_len(batch: Any) -> int:
    import torch

    if isinstance(batch, torch.Tensor):
        n = int(batch.shape[0]) if batch.dim() else 0
    elif isinstance(batch, Mapping):
        lengths = {
            k: (int(v.shape[0]) if isinstance(v, torch.Tensor) else len(v))
            for k, v in batch.items()
        }
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"mapping batch values must share their first dimension, got {lengths}"
            )
        n = next(iter(lengths.values()))
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        n = len(batch)
    else:
        raise TypeError(
            f"batch must be a list or tuple of samples, a tensor or a mapping of tensors, got {type(batch).__name__}"
        )
    if n == 0:
        raise ValueError("batch is empty; OOMGuard.step needs at least one sample")
    return n


def _item(batch: Any, i: int) -> Any:
    if isinstance(batch, Mapping):
        return {k: v[i] for k, v in batch.items()}
    return batch[i]


def _take(batch: Any, idx: NDArray[np.int64]) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch[torch.as_tensor(idx, device=batch.device)]
    if isinstance(batch, Mapping):
        return {k: _take(v, idx) for k, v in batch.items()}
    return [batch[int(i)] for i in idx]
