"""``bionemo-size-aware-batching``'s API on fitbatch's engine.

Migrating: replace the package prefix ``bionemo.size_aware_batching`` by
``fitbatch.compat.bionemo``; the modules ``sampler`` and ``utils`` are here too, and every name
is also importable from ``fitbatch.compat.bionemo`` itself:

* :mod:`~fitbatch.compat.bionemo.sampler` — :func:`size_aware_batching`,
  :class:`SizeAwareBatchSampler`, :class:`BucketBatchSampler`, ``Real``;
* :mod:`~fitbatch.compat.bionemo.utils` — :func:`collect_cuda_peak_alloc`,
  :func:`create_buckets`, :class:`Buckets`;
* :mod:`~fitbatch.compat.bionemo.memory_model` — ``PolynomialRegression``, which the released
  1.0.0 does not have (kept from the pre-release).

Deliberate differences from bionemo-size-aware-batching 1.0.0 (bugs not reproduced):

* ``max_total_size`` must be a positive finite number (``ValueError``), as the sampler's
  documentation says; the original accepts 0, negative numbers, NaN and bools, and then skips
  every item (NaN: batches them all). Both functions check their arguments when called; the
  original generator checks ``sizeof`` only at the first ``next()``.
* A ``sizeof`` returning a negative, NaN or infinite size raises ``ValueError``; a non-callable
  ``collate_fn`` raises ``TypeError`` (the original ignores it). A ``sizeof`` that is a mapping
  or a sequence (index -> size) is accepted, as the documentation says (the original requires
  a callable). ``sizeof`` errors are still re-raised as ``RuntimeError``.
* ``size_aware_batching`` reads its input in chunks of up to 8192 items, so the first batch
  comes after up to 8192 items were read (and their oversize warnings given); the original
  reads one item ahead. Batches are the same.
* ``SizeAwareBatchSampler`` and ``BucketBatchSampler`` have an exact ``len()``: it draws the
  next iteration (for ``BucketBatchSampler`` with ``shuffle``, the draws then come from
  ``generator`` at ``len()`` instead of at ``iter()``; the same batches follow). The original
  ``SizeAwareBatchSampler`` has no ``len()``.
* Fractional sizes are planned against ``max_total_size * (1 - 1e-12)`` (as everywhere in
  fitbatch), so float rounding never lets a batch overshoot; a batch whose fractional sizes
  add up to exactly ``max_total_size`` closes one item earlier than the original's.
* ``BucketBatchSampler``'s message for a 2-D ``bucket_boundaries`` says it must be 1-D (the
  original's says 2-D).
* ``collect_cuda_peak_alloc`` measures with fitbatch's tracker and logs out-of-memory items
  (``logging``) instead of printing to stderr; a non-CUDA device still raises ``ValueError``.

>>> from fitbatch.compat.bionemo import size_aware_batching
>>> list(size_aware_batching([3, 4, 9, 2, 2], lambda x: x, 8))
[[3, 4], [2, 2]]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fitbatch.compat.bionemo.sampler import Real, size_aware_batching
from fitbatch.compat.bionemo.utils import Buckets, collect_cuda_peak_alloc, create_buckets

__all__ = [
    "BucketBatchSampler",
    "Buckets",
    "PolynomialRegression",
    "Real",
    "SizeAwareBatchSampler",
    "collect_cuda_peak_alloc",
    "create_buckets",
    "size_aware_batching",
]

# classes with a torch base, built on first access by their module
_LAZY = {
    "BucketBatchSampler": "sampler",
    "SizeAwareBatchSampler": "sampler",
    "PolynomialRegression": "memory_model",
}

if TYPE_CHECKING:
    from fitbatch.compat.bionemo.memory_model import PolynomialRegression
    from fitbatch.compat.bionemo.sampler import BucketBatchSampler, SizeAwareBatchSampler
else:

    def __getattr__(name: str) -> Any:
        if name in _LAZY:
            value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
            globals()[name] = value
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
