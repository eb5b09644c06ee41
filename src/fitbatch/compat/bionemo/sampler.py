"""``bionemo.size_aware_batching.sampler`` on fitbatch's engine.

* :func:`size_aware_batching` — greedy batches of an iterable (or a map-style dataset, read
  through the sequence protocol) whose summed ``sizeof`` stays at most ``max_total_size``;
  items over it alone are skipped (``warn_logger`` is told). Built on
  :func:`fitbatch.streaming.batch_stream` (``strategy="sequential"``, ``cost="sum"``,
  ``oversized="skip"``).
* :class:`SizeAwareBatchSampler` — the same over the indices a sampler yields, planned by
  :func:`fitbatch.compat.plan_in_order` over the sampler's order, with a ``len()``.
* :class:`BucketBatchSampler` — indices grouped into size buckets, each bucket batched by its
  own base batch sampler (a :class:`SizeAwareBatchSampler` plans with fitbatch), the buckets
  interleaved at random (or in order); each iteration is drawn as one
  :class:`~fitbatch.plan._planner.BatchPlan`, so ``len()`` is exact and ``plan().stats()`` measures it.

The differences from the original are listed in :mod:`fitbatch.compat.bionemo`.

>>> from fitbatch.compat.bionemo.sampler import size_aware_batching
>>> list(size_aware_batching([3, 4, 9, 2, 2], lambda x: x, 8))
[[3, 4], [2, 2]]
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from fitbatch.compat import OrderedPlanSampler, lazy_torch_classes, measure, plan_in_order
from fitbatch.plan._planner import BatchPlan

__all__ = ["BucketBatchSampler", "Real", "SizeAwareBatchSampler", "size_aware_batching"]

#: The original's name for the type of sizes and budgets.
Real = Union[int, float]  # noqa: UP007 - a runtime alias, as the original exports it

Logger = Callable[[str], None]

_TORCH_NUMBERS = ("uint8", "int8", "int16", "int32", "int64")


def _max_total_size(value: Any) -> float:
    # the original's type check (numpy scalars accepted, bools not), then the positive finite
    # budget it documents but does not check
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"max_total_size should be int or float but got {type(value)}")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"max_total_size must be a positive finite number, got {value!r}")
    return number


def _size_function(sizeof: Any) -> Callable[[Any], Any]:
    if callable(sizeof):
        return sizeof  # type: ignore[no-any-return]
    if isinstance(sizeof, (Mapping, Sequence)) and not isinstance(sizeof, str):
        return sizeof.__getitem__
    raise TypeError(f"sizeof must be a callable, a dictionary or a sequence container, got {type(sizeof).__name__}")


def _checked_size(sizeof: Callable[[Any], Any], limit: Any, warn: Logger | None) -> Callable[[Any], Any]:
    """``sizeof`` with the original's error wrapping, comparison and per-item oversize warning."""

    def size(data: Any) -> Any:
        try:
            value = sizeof(data)
        except Exception as exc:
            raise RuntimeError(f"sizeof raises error at data={data}: {exc}") from exc
        # compared with the caller's max_total_size, as the original does: a size of another
        # type raises the same TypeError ("'>' not supported between ...")
        if value > limit and warn is not None:
            warn(f"Size of element {data} exceeds max_total_size ({value} > {limit}), skipping")
        return value

    return size


def _report(batched: int, total: int, batches: int, shown: Any, info: Logger | None, warn: Logger | None) -> None:
    if warn is not None and batched < total:
        warn(
            f"{batched} samples were batched from {total} of the input data. Missing samples are "
            f"due to exceeding max_total_size={shown})"
        )
    if info is not None:
        info(
            f"Batched {batched} samples into {batches} batches. If this doesn't match the your "
            "expectation, consider adjusting max_total_size or the sizeof functor"
        )


def _readable(dataset: Any) -> Iterable[Any]:
    # a map-style dataset (only __len__/__getitem__) is read through the sequence protocol,
    # as a for loop reads it: items 0, 1, ... until IndexError
    if isinstance(dataset, Iterable) or not hasattr(dataset, "__getitem__"):
        return dataset  # type: ignore[no-any-return]
    return iter(dataset)


def size_aware_batching(
    dataset: Iterable[Any],
    sizeof: Callable[[Any], float] | Mapping[Any, float],
    max_total_size: float,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    info_logger: Logger | None = None,
    warn_logger: Logger | None = None,
) -> Iterator[Any]:
    """Batches of ``dataset`` whose summed ``sizeof`` is at most ``max_total_size``.

    Args:
        dataset: the items, read once: an iterable, or a map-style dataset (``__getitem__``
            from 0 until ``IndexError``).
        sizeof: item -> size (a function or a mapping).
        max_total_size: the most summed size one batch may have (> 0).
        collate_fn: applied to each batch (a list of items).
        info_logger: told how many items were batched into how many batches, at the end.
        warn_logger: told about each item over ``max_total_size`` (skipped) and their count.

    Returns:
        An iterator of batches (lists of items, or what ``collate_fn`` returns).

    Raises:
        TypeError: ``sizeof`` or ``collate_fn`` of the wrong type, ``dataset`` not iterable.
        ValueError: ``max_total_size`` not a positive number; while iterating, bad sizes.
        RuntimeError: while iterating, ``sizeof`` raised (the original error is its cause).

    >>> list(size_aware_batching(["ab", "cde", "f", "ghij"], len, 4, collate_fn="".join))
    ['ab', 'cdef', 'ghij']
    """

    from fitbatch.streaming import batch_stream

    size = _size_function(sizeof)
    budget = _max_total_size(max_total_size)
    stream = batch_stream(
        _readable(dataset),
        sizeof=_checked_size(size, max_total_size, warn_logger),
        budget=budget,
        cost="sum",
        strategy="sequential",
        oversized="skip",
        collate_fn=collate_fn,
    )

    def batches() -> Iterator[Any]:
        yield from stream
        s = stream.summary
        _report(s.items_emitted, s.items_read, s.batches, max_total_size, info_logger, warn_logger)

    return batches()


class _SizeAwareBatchSampler(OrderedPlanSampler):
    """Batches of the sampler's indices whose summed ``sizeof`` is at most ``max_total_size``.

    A subclass of torch's ``Sampler`` when torch is installed. Indices whose own size exceeds
    ``max_total_size`` are skipped (``warn_logger`` is told). ``len()`` draws the order of the
    next iteration, so ``len()`` and the iteration after it agree even for a random sampler.

    Args:
        sampler: a torch ``Sampler`` or any iterable of indices; its order is kept.
        sizeof: index -> size (a function, a dictionary or a sequence).
        max_total_size: the most summed size of a mini-batch (> 0).
        info_logger: told how many indices were batched into how many batches.
        warn_logger: told about each skipped index and their count.

    Raises:
        TypeError: ``sampler`` not iterable, ``sizeof`` not a callable, dictionary or sequence.
        ValueError: ``max_total_size`` not a number (checked before ``sizeof``, as in the
            original), or not positive.

    >>> from fitbatch.compat.bionemo import SizeAwareBatchSampler
    >>> sampler = SizeAwareBatchSampler(range(5), [2, 2, 3, 1, 4].__getitem__, 4)
    >>> len(sampler), list(sampler)
    (3, [[0, 1], [2, 3], [4]])
    """

    def __init__(
        self,
        sampler: Iterable[int],
        sizeof: Callable[[int], float] | Mapping[int, float] | Sequence[float],
        max_total_size: float,
        info_logger: Logger | None = None,
        warn_logger: Logger | None = None,
    ) -> None:
        if not isinstance(sampler, Iterable) or isinstance(sampler, str):
            raise TypeError("sampler should be an instance of torch.utils.data.Sampler or Iterable")
        if isinstance(max_total_size, bool) or not isinstance(max_total_size, numbers.Real):
            raise ValueError(f"max_total_size should be int or float but got {type(max_total_size)}")
        self._sizeof: Callable[[Any], Any] = _size_function(sizeof)
        self._budget: float = _max_total_size(max_total_size)
        self._max_total_size: Any = max_total_size
        self._sampler: Iterable[Any] = sampler
        self._info_logger: Logger | None = info_logger
        self._warn_logger: Logger | None = warn_logger

    def _draw(self) -> tuple[list[Any], BatchPlan]:
        order = list(self._sampler)
        size = _checked_size(self._sizeof, self._max_total_size, self._warn_logger)
        plan = plan_in_order(order, measure(order, size, "sizeof"), self._budget, oversized="skip")
        return order, plan

    def _after(self, order: list[Any], plan: BatchPlan) -> None:
        _report(plan.n_samples, len(order), len(plan), self._max_total_size, self._info_logger, self._warn_logger)


def _number_tensor(torch: Any, name: str, value: Any) -> None:
    if not torch.is_tensor(value):
        raise TypeError(f"{name} should be a torch tensor, but got {name}={value}")
    if value.ndim != 1:
        raise ValueError(f"{name} should be a 1D tensor, but got {name} with shape {value.shape}")


def _numeric(torch: Any, name: str, value: Any, kinds: str) -> None:
    if not (torch.is_floating_point(value) or str(value.dtype).removeprefix("torch.") in _TORCH_NUMBERS):
        raise ValueError(f"{name} should contain only {kinds}, but got {name}.dtype={value.dtype}")


def _float64(tensor: Any) -> np.ndarray:
    return tensor.detach().cpu().double().numpy()  # type: ignore[no-any-return]


def _kwargs(name: str, value: Any) -> dict[str, Any]:
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise TypeError(f"{name} should be a dictionary, but got {name}={value}")
    if not all(isinstance(key, str) for key in value):
        raise TypeError(f"{name} should have string keys, but got keys={list(value.keys())}")
    return value


class _BucketBatchSampler(OrderedPlanSampler):
    """Batches of indices from one size bucket each, made by a base batch sampler per bucket.

    ``bucket_boundaries`` (sorted here) make ``len - 1`` left-closed, right-open buckets; an
    element whose size is in none is skipped (a ``UserWarning`` says how many). Bucket ``k``'s
    element indices (in index order) are the data source of
    ``base_batch_sampler_class(indices, **shared_kwargs, **{key: values[k] ...})``. Each
    iteration, with ``shuffle``, every bucket's indices are shuffled in place and each batch
    comes from a bucket drawn with probability proportional to its remaining elements (the
    original's draws from ``generator``, so the same seed gives the same batches); without it,
    the buckets follow each other in ascending order.

    A subclass of torch's ``Sampler``. ``len()`` draws the next iteration (so it is exact,
    even when a base sampler skips elements), and ``plan()`` is that iteration as a
    :class:`~fitbatch.plan._planner.BatchPlan` over ``sizes`` (``plan().stats()``).

    Raises:
        TypeError, ValueError: arguments of the wrong type or shape (the original's checks,
            in its order); RuntimeError: no element falls into a bucket.

    >>> import torch
    >>> from fitbatch.compat.bionemo import BucketBatchSampler, SizeAwareBatchSampler
    >>> sampler = BucketBatchSampler(torch.arange(10), torch.tensor([0, 4, 10]), SizeAwareBatchSampler,
    ...     {"sizeof": lambda i: i}, {"max_total_size": [4, 12]}, shuffle=False)
    >>> len(sampler), list(sampler)
    (7, [[0, 1, 2], [3], [4, 5], [6], [7], [8], [9]])
    """

    def __init__(
        self,
        sizes: Any,
        bucket_boundaries: Any,
        base_batch_sampler_class: type,
        base_batch_sampler_shared_kwargs: dict[str, Any] | None = None,
        base_batch_sampler_individual_kwargs: dict[str, Iterable[Any]] | None = None,
        shuffle: bool | None = True,
        generator: Any = None,
    ) -> None:
        import torch

        _number_tensor(torch, "sizes", sizes)
        _numeric(torch, "sizes", sizes, "integers or floating point numbers")
        _number_tensor(torch, "bucket_boundaries", bucket_boundaries)
        if len(bucket_boundaries) < 2:
            raise ValueError(f"bucket_boundaries should have at least 2 numbers, but got bucket_boundaries={bucket_boundaries.shape}")
        _numeric(torch, "bucket_boundaries", bucket_boundaries, "integers or floating point numbers")
        bucket_boundaries = torch.sort(bucket_boundaries)[0]
        if torch.any(bucket_boundaries[:-1] >= bucket_boundaries[1:]):
            raise ValueError(
                "bucket_boundaries should not have duplicate values, and should specify the lower endpoint of each "
                f"interval smaller than the upper endpoint, but got sorted bucket_boundaries={bucket_boundaries}"
            )
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle should be a boolean value, but got shuffle={shuffle}")
        self.sizes, self.bucket_boundaries = sizes, bucket_boundaries
        self.num_buckets = len(bucket_boundaries) - 1
        self.shuffle, self.generator = shuffle, generator
        if shuffle and generator is None:  # seeded from torch's global generator, as the original
            self.generator = torch.Generator().manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        if not (isinstance(base_batch_sampler_class, type) and issubclass(base_batch_sampler_class, torch.utils.data.Sampler)):
            raise TypeError(
                "base_batch_sampler_class should be a batch sampler class inherited from torch.utils.data.Sampler, "
                f"but got base_batch_sampler_class={base_batch_sampler_class}"
            )
        shared = _kwargs("base_batch_sampler_shared_kwargs", base_batch_sampler_shared_kwargs)
        individual = {k: list(v) for k, v in _kwargs("base_batch_sampler_individual_kwargs", base_batch_sampler_individual_kwargs).items()}
        if any(len(v) != self.num_buckets for v in individual.values()):
            raise ValueError(
                f"Each value in base_batch_sampler_individual_kwargs should have a length of {self.num_buckets}, "
                f"but got lengths {[len(v) for v in individual.values()]}"
            )
        self.base_batch_sampler_class = base_batch_sampler_class
        self.base_batch_sampler_shared_kwargs = shared
        self.base_batch_sampler_individual_kwargs = [{k: v[b] for k, v in individual.items()} for b in range(self.num_buckets)]
        # bucket b + 1 of searchsorted is [boundaries[b], boundaries[b + 1]); 0 and the last are outside
        where = np.searchsorted(_float64(bucket_boundaries), _float64(sizes), side="right")
        self.bucket_element_indices: list[list[int]] = [np.flatnonzero(where == b + 1).tolist() for b in range(self.num_buckets)]
        self.bucket_sizes = torch.tensor([len(ids) for ids in self.bucket_element_indices], dtype=torch.int64)
        self.num_samples = int(self.bucket_sizes.sum())
        if self.num_samples == 0:
            raise RuntimeError("The sizes of all elements in the dataset are outside the bucket ranges provided")
        if self.num_samples < len(sizes):
            warnings.warn(f"{len(sizes) - self.num_samples} elements are outside the buckets provided and will be skipped", stacklevel=2)
        make: Any = base_batch_sampler_class
        self.base_batch_samplers = [
            make(ids, **shared, **kw)
            for ids, kw in zip(self.bucket_element_indices, self.base_batch_sampler_individual_kwargs)
        ]

    def _draw(self) -> tuple[list[Any], BatchPlan]:
        batches = list(self._interleave())
        order = [i for batch in batches for i in batch]
        offsets = np.cumsum([0] + [len(b) for b in batches])
        values = _float64(self.sizes)[np.asarray(order, dtype=np.int64)] if order else np.zeros(0)
        plan = BatchPlan.from_batches(values, "sum", np.arange(len(order)), offsets, budget=None, strategy_name="buckets")
        return order, plan

    def _interleave(self) -> Iterator[list[int]]:
        import torch

        if self.shuffle:  # in place: the base samplers hold these lists
            for ids in self.bucket_element_indices:
                ids[:] = torch.tensor(ids, dtype=torch.int64)[torch.randperm(len(ids), generator=self.generator)].tolist()
        for sampler in self.base_batch_samplers:
            if isinstance(sampler, OrderedPlanSampler):
                sampler._next = None  # a draw cached by len() predates the shuffle
        iters = [iter(s) for s in self.base_batch_samplers]
        remaining, total = self.bucket_sizes.clone(), torch.tensor(self.num_samples)
        while total > 0:
            if self.shuffle:
                b = int(torch.multinomial(remaining / total, 1, generator=self.generator))
            else:
                b = int(torch.argmax((remaining > 0).to(torch.int64)))
            try:
                batch = next(iters[b])
            except StopIteration:  # the bucket is done, whatever its count says
                remaining[b] = 0
                total = torch.sum(remaining)
                continue
            remaining[b] -= len(batch)
            total -= len(batch)
            yield batch


if TYPE_CHECKING:
    SizeAwareBatchSampler = _SizeAwareBatchSampler
    BucketBatchSampler = _BucketBatchSampler
else:
    # torch's Sampler as a base class costs importing torch: paid on first use only
    __getattr__ = lazy_torch_classes(
        __name__,
        {"SizeAwareBatchSampler": (_SizeAwareBatchSampler, "Sampler"), "BucketBatchSampler": (_BucketBatchSampler, "Sampler")},
    )
