"""``bionemo-size-aware-batching``'s API on fitbatch's engine.

Migrating: ``from bionemo.size_aware_batching.sampler import ...``,
``...utils import collect_cuda_peak_alloc`` and ``...memory_model import PolynomialRegression``
become ``from fitbatch.compat.bionemo import ...``; nothing else changes.

* :func:`size_aware_batching` — greedy batches of an iterable whose summed ``sizeof`` stays at
  most ``max_total_size``; items over it alone are skipped (``warn_logger`` is told). Built on
  :func:`fitbatch.streaming.batch_stream` (``strategy="sequential"``, ``cost="sum"``,
  ``oversized="skip"``).
* :class:`SizeAwareBatchSampler` — the same over the indices a sampler yields, planned by
  :func:`fitbatch.plan.plan_with` over the sampler's order, with a ``len()``.
* :func:`collect_cuda_peak_alloc` — :func:`fitbatch.memory.collect_peak_memory` on a CUDA device.
* :class:`PolynomialRegression` — :class:`fitbatch.memory.PolynomialRegression` (an
  ``nn.Module``; coefficients in buffers, so in its ``state_dict``) with the seed's argument
  checks; ``to_cost_model()`` turns it into a cost model to plan with.

Deliberate differences from bionemo-size-aware-batching 1.0.0 (bugs not reproduced):

* ``max_total_size`` must be a positive finite number (``ValueError``), as the documentation
  says; the original accepts 0, negative numbers and NaN, and then silently skips every item.
  Both functions check their arguments when called; the original generator checks ``sizeof``
  only at the first ``next()``.
* A ``sizeof`` returning a negative, NaN or infinite size raises ``ValueError``; a non-callable
  ``collate_fn`` raises ``TypeError`` (the original ignores it). A ``sizeof`` that is a mapping
  or a sequence (index -> size) is accepted, as the documentation says (the original requires
  a callable). ``sizeof`` errors are still re-raised as ``RuntimeError``.
* ``size_aware_batching`` reads its input in chunks of up to 8192 items, so the first batch
  comes after up to 8192 items were read (and their oversize warnings given); the original
  reads one item ahead. Batches are the same.
* ``collect_cuda_peak_alloc`` measures with fitbatch's tracker and logs out-of-memory items
  (``logging``) instead of printing to stderr; a non-CUDA device still raises ``ValueError``.
* ``PolynomialRegression.fit`` minimises *relative* error (memory spans orders of magnitude)
  on sizes mapped to [-1, 1], so it needs positive ``y`` and at least two distinct ``x``;
  degrees go up to 12.

>>> from fitbatch.compat.bionemo import size_aware_batching
>>> list(size_aware_batching([3, 4, 9, 2, 2], lambda x: x, 8))
[[3, 4], [2, 2]]
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fitbatch.compat import OrderedPlanSampler, measure, plan_in_order, torch_subclass
from fitbatch.plan import BatchPlan

if TYPE_CHECKING:
    import torch

__all__ = ["PolynomialRegression", "SizeAwareBatchSampler", "collect_cuda_peak_alloc", "size_aware_batching"]

Logger = Callable[[str], None]


def _max_total_size(value: Any) -> float:
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


def _checked_size(sizeof: Callable[[Any], Any], budget: float, shown: Any, warn: Logger | None) -> Callable[[Any], Any]:
    """``sizeof`` with the seed's error wrapping and per-item oversize warning."""

    def size(data: Any) -> Any:
        try:
            value = sizeof(data)
        except Exception as exc:
            raise RuntimeError(f"sizeof raises error at data={data}: {exc}") from exc
        if warn is not None and value > budget:
            warn(f"Size of element {data} exceeds max_total_size ({value} > {shown}), skipping")
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
        dataset: the items, read once.
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
        dataset,
        sizeof=_checked_size(size, budget, max_total_size, warn_logger),
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
        ValueError: ``max_total_size`` not a positive number.
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
        self._sizeof = _size_function(sizeof)
        self._max_total_size = max_total_size
        self._budget = _max_total_size(max_total_size)
        self._sampler = sampler
        self._info_logger = info_logger
        self._warn_logger = warn_logger

    def _draw(self) -> tuple[list[Any], BatchPlan]:
        order = list(self._sampler)
        size = _checked_size(self._sizeof, self._budget, self._max_total_size, self._warn_logger)
        plan = plan_in_order(order, measure(order, size, "sizeof"), self._budget, oversized="skip")
        return order, plan

    def _after(self, order: list[Any], plan: BatchPlan) -> None:
        _report(plan.n_samples, len(order), len(plan), self._max_total_size, self._info_logger, self._warn_logger)


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
    """
    from fitbatch.memory import collect_peak_memory
    from fitbatch.memory.profile import as_device

    dev = as_device(device)
    if dev.type != "cuda":
        raise ValueError(f"This function is intended for CUDA devices only, got device {str(dev)!r}.")
    profile = collect_peak_memory(dataset, work, device=dev, cleanup=cleanup, warmup=0, progress=False)
    return list(profile.features), profile.peaks.tolist()


def _fit_checked(base: Any) -> Callable[[Any, torch.Tensor, torch.Tensor], None]:
    import torch

    def fit(self: Any, x: torch.Tensor, y: torch.Tensor) -> None:
        """Fit to points ``(x, y)`` (1-D floating-point tensors of one length)."""
        for name, t in (("x", x), ("y", y)):
            if not isinstance(t, torch.Tensor) or t.ndim != 1:
                raise TypeError(f"{name} must be a 1D tensor, got {type(t).__name__} of shape {getattr(t, 'shape', None)}")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x and y must have the same number of samples, got {x.shape[0]} and {y.shape[0]}")
        for name, t in (("x", x), ("y", y)):
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating point tensor, got dtype {t.dtype}")
        base.fit(self, x, y)

    return fit


if TYPE_CHECKING:
    SizeAwareBatchSampler = _SizeAwareBatchSampler
    PolynomialRegression: Any
else:

    def __getattr__(name: str) -> Any:
        # torch base classes cost importing torch: paid on first use of the class only
        if name == "SizeAwareBatchSampler":
            cls = torch_subclass(_SizeAwareBatchSampler, "Sampler", __name__)
        elif name == "PolynomialRegression":
            from fitbatch import memory

            base = memory.PolynomialRegression
            cls = type(name, (base,), {"__module__": __name__, "__qualname__": name, "__doc__": base.__doc__, "fit": _fit_checked(base)})
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = cls
        return cls
