"""``bionemo.size_aware_batching.utils``: peak CUDA memory per item, and size buckets.

* :func:`collect_cuda_peak_alloc` — :func:`fitbatch.memory.collect_peak_memory` on a CUDA
  device, as ``(features, peaks)``.
* :func:`create_buckets` — bucket boundaries over integer sizes: each bucket takes sizes in
  ascending order until it holds ``min_bucket_count`` elements or spans ``max_width``; wide
  gaps become empty buckets of width ``max_width``. Returns :class:`Buckets`, ready for
  :class:`~fitbatch.compat.bionemo.BucketBatchSampler`.

>>> import torch
>>> from fitbatch.compat.bionemo.utils import create_buckets
>>> create_buckets(torch.tensor([1, 1, 2, 9, 30]), max_width=5, min_bucket_count=2)
Buckets(bucket_boundaries=tensor([ 1,  2,  7, 12, 17, 22, 27, 31]), bucket_sizes=tensor([2, 1, 1, 0, 0, 0, 1]))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["Buckets", "collect_cuda_peak_alloc", "create_buckets"]

_INTEGERS = ("torch.uint8", "torch.int8", "torch.int16", "torch.int32", "torch.int64")


class Buckets(NamedTuple):
    """Bucket boundaries (ascending, one more than buckets) and the elements in each bucket.

    >>> Buckets([0, 5, 9], [3, 1]).bucket_sizes
    [3, 1]
    """

    bucket_boundaries: Any
    bucket_sizes: Any


def collect_cuda_peak_alloc(
    dataset: Iterable[Any],
    work: Callable[[Any], Any],
    device: torch.device | str,
    cleanup: Callable[[], None] | None = None,
) -> tuple[list[Any], list[int]]:
    """Peak CUDA memory allocated while ``work`` runs on each item (bytes), with its features.

    Args:
        dataset: the items (read once).
        work: item -> feature; the step whose memory is measured.
        device: the CUDA device.
        cleanup: called after each item, before garbage collection.

    Returns:
        ``(features, peaks)``: the features ``work`` returned and the peaks, for the items that
        did not run out of memory (those are logged and left out).

    Raises:
        ValueError: ``device`` is not a CUDA device.

    >>> collect_cuda_peak_alloc([1], abs, "cpu")
    Traceback (most recent call last):
    ...
    ValueError: This function is intended for CUDA devices only, got device 'cpu'.
    """
    from fitbatch.memory import collect_peak_memory
    from fitbatch.memory.profile import as_device

    dev = as_device(device)
    if dev.type != "cuda":
        raise ValueError(f"This function is intended for CUDA devices only, got device {str(dev)!r}.")
    profile = collect_peak_memory(dataset, work, device=dev, cleanup=cleanup, warmup=0, progress=False)
    return list(profile.features), profile.peaks.tolist()


def create_buckets(sizes: torch.Tensor, max_width: int, min_bucket_count: int) -> Buckets:
    """Left-closed, right-open buckets over integer ``sizes``, and how many elements each holds.

    A bucket starts at the smallest size not yet covered and takes the next distinct sizes
    while it holds fewer than ``min_bucket_count`` elements and they lie less than
    ``max_width`` above its start; it ends at the next distinct size, or one past the largest.
    A bucket that would be wider than ``max_width`` is cut into buckets of that width (the
    others empty).

    Args:
        sizes: a non-empty 1-D integer tensor.
        max_width: the widest a bucket may be (an int >= 1).
        min_bucket_count: the fewest elements a bucket takes unless ``max_width`` stops it (an
            int >= 1).

    Returns:
        ``Buckets(bucket_boundaries, bucket_sizes)``, int64 tensors.

    Raises:
        TypeError: ``sizes`` is not a tensor.
        ValueError: ``sizes`` not 1-D, not integers or empty; ``max_width`` or
            ``min_bucket_count`` not a positive int.

    >>> import torch
    >>> create_buckets(torch.arange(20), max_width=10, min_bucket_count=5).bucket_boundaries
    tensor([ 0,  5, 10, 15, 20])
    """
    import torch

    if not torch.is_tensor(sizes):
        raise TypeError(f"sizes should be a torch tensor, but got sizes={sizes}")
    if sizes.ndim != 1:
        raise ValueError(f"sizes should be a 1D tensor, but got sizes with shape {sizes.shape}")
    if str(sizes.dtype) not in _INTEGERS:
        raise ValueError(f"sizes should contain only integers, but got sizes.dtype={sizes.dtype}")
    if len(sizes) == 0:
        raise ValueError("sizes should not be empty")
    if not isinstance(max_width, int) or max_width <= 0:
        raise ValueError(f"max_width should be a positive integer but got max_width={max_width}")
    if not isinstance(min_bucket_count, int) or min_bucket_count <= 0:
        raise ValueError(f"min_bucket_count should be a positive integer but got min_bucket_count={min_bucket_count}")
    values, counts = np.unique(sizes.detach().cpu().numpy().astype(np.int64), return_counts=True)
    bounds, filled = _bucket_bounds(values.tolist(), counts.tolist(), max_width, min_bucket_count)
    return Buckets(torch.tensor(bounds, dtype=torch.int64), torch.tensor(filled, dtype=torch.int64))


def _bucket_bounds(values: list[int], counts: list[int], width: int, least: int) -> tuple[list[int], list[int]]:
    bounds, filled = [values[0]], []
    n, start = len(values), 0
    # invariant: values[:start] lie below bounds[-1] <= values[start]; bounds[-1] is where the
    # next bucket starts, less than `width` below values[start]
    while start < n:
        end, count = start + 1, counts[start]
        while end < n and count < least and values[end] - bounds[-1] < width:
            count, end = count + counts[end], end + 1
        upper = values[end] if end < n else values[-1] + 1
        steps = (upper - bounds[-1]) // width
        filled += [count] + [0] * max(0, steps - 1)
        bounds += [bounds[-1] + width * k for k in range(1, steps + 1)] if steps else [upper]
        start = end
    return bounds, filled
