"""Peak memory measurement: how many bytes a piece of work adds at its peak, on any device.

On CUDA the allocator's own statistics answer (``torch.cuda.max_memory_allocated``). Everywhere
else (CPU, ``meta``, fake tensors) a :class:`PeakTracker` watches every tensor operation through
a ``TorchDispatchMode`` and keeps a running total of the bytes of tensor storage created inside
it that are still alive, so memory behaviour can be measured, fitted and tested without a GPU.

torch is imported lazily: importing this module never imports torch.

>>> import torch
>>> def work():
...     a = torch.empty(1000)            # 4000 bytes live
...     b = torch.empty(2000)            # 12000 bytes live: the peak
...     del a
...     return torch.empty(500)          # 8000 + 2000
>>> measure_peak(work)
12000
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

T = TypeVar("T")


def as_device(device: Any) -> torch.device:
    """Coerce ``"cpu"``, ``"cuda:0"``, ``"meta"`` or a ``torch.device`` into a ``torch.device``."""
    import torch

    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as exc:
            raise ValueError(
                f"device {device!r} is not a torch device name such as 'cpu' or 'cuda:0'"
            ) from exc
    raise TypeError(f"device must be a str or torch.device, got {device!r}")


def _usable_cuda(dev: torch.device) -> torch.device:
    """``dev`` if it is not CUDA or names a CUDA device this process can use, else an error
    naming it and the devices that can measure instead (torch itself fails with an
    ``AssertionError``: "Torch not compiled with CUDA enabled").

    Raises:
        RuntimeError: CUDA is not available (torch built without it, or no GPU visible).
        ValueError: ``cuda:N`` with N past the last visible device.

    >>> import torch
    >>> _usable_cuda(torch.device("cpu"))
    device(type='cpu')
    """
    if dev.type != "cuda":
        return dev
    import torch

    if not torch.cuda.is_available():
        reason = (
            f"torch {torch.__version__} is built without CUDA" if torch.version.cuda is None
            else f"no CUDA device is visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
        raise RuntimeError(
            f"device {str(dev)!r} needs CUDA, but {reason}; measure on device='cpu' or device='meta' "
            "(the live-tensor tracker, no GPU needed), or run where a GPU is visible"
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(
            f"device {str(dev)!r} does not exist: {count} CUDA device{'s' if count > 1 else ''} visible "
            f"(cuda:0{f'..cuda:{count - 1}' if count > 1 else ''})"
        )
    return dev


def is_oom_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (CUDA, CPU allocator or another backend).

    >>> import torch
    >>> is_oom_error(torch.OutOfMemoryError("CUDA out of memory"))
    True
    >>> is_oom_error(ValueError("bad"))
    False
    """
    import torch

    oom_types: tuple[type[BaseException], ...] = (torch.cuda.OutOfMemoryError,)
    if hasattr(torch, "OutOfMemoryError"):
        oom_types += (torch.OutOfMemoryError,)
    if isinstance(exc, oom_types + (MemoryError,)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def free_memory(device: Any = "cpu") -> None:
    """Collect garbage and, on CUDA, return cached blocks so a retry starts from a clean heap."""
    gc.collect()
    dev = as_device(device)
    if dev.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def allocated_bytes(device: Any) -> int:
    """Bytes held by live tensors on ``device`` as far as the allocator knows (CUDA), else 0.

    The live-tensor tracker cannot see tensors created before it starts, so off CUDA the
    baseline is 0 and peaks are relative to the start of the measured work.
    """
    dev = _usable_cuda(as_device(device))
    if dev.type == "cuda":
        import torch

        return int(torch.cuda.memory_allocated(dev))
    return 0


def detect_capacity(device: Any) -> float:
    """Bytes this process may allocate on ``device``.

    CUDA: the free memory plus what this process's caching allocator already reserved, capped
    by ``torch.cuda.set_per_process_memory_fraction`` when one is set. CPU: the available
    physical memory. Other devices have no capacity to detect.

    Args:
        device: ``"cuda"``/``"cuda:N"``, ``"cpu"`` or a ``torch.device``.

    Returns:
        The capacity in bytes, a float.

    Raises:
        ValueError: for devices such as ``meta`` (pass ``capacity=`` explicitly).

    >>> detect_capacity("cpu") > 0
    True
    >>> detect_capacity("meta")
    Traceback (most recent call last):
    ...
    ValueError: cannot detect the memory capacity of device 'meta'; pass capacity= (bytes or '70GiB')
    """
    dev = _usable_cuda(as_device(device))
    if dev.type == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info(dev)
        capacity = float(free + torch.cuda.memory_reserved(dev))
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if get_fraction is not None:
            capacity = min(capacity, float(get_fraction(dev)) * float(total))
        return capacity
    if dev.type == "cpu" and hasattr(os, "sysconf"):
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    raise ValueError(
        f"cannot detect the memory capacity of device {str(dev)!r}; pass capacity= (bytes or '70GiB')"
    )


class PeakTracker:
    """Context manager measuring the peak bytes added by the work inside it.

    On CUDA it resets and reads the allocator's peak statistics (so trackers must not be
    nested on one CUDA device). On every other device it counts the storages that tensor
    operations create inside the block (views and in-place results of earlier tensors are not
    new memory) and forgets each one when it is freed. Tensors created by code that bypasses
    the dispatcher (``torch.from_numpy``) are not seen, and tensors that existed before the
    block are not counted when freed inside it.

    Attributes:
        device: the device measured.
        peak: the largest number of bytes added at any moment (final on exit).
        current: bytes added and still alive (final on exit: frees after it are not seen).
        baseline: bytes allocated on the device on entry (CUDA only; 0 elsewhere).

    >>> import torch
    >>> with PeakTracker("cpu") as t:
    ...     x = torch.ones(256, dtype=torch.float64)
    ...     y = x.view(16, 16).t()           # a view: no new storage
    ...     z = x * 2
    >>> t.peak, t.current
    (4096, 4096)
    """

    def __init__(self, device: Any = "cpu") -> None:
        self.device = _usable_cuda(as_device(device))
        self.peak = 0
        self.current = 0
        self.baseline = 0
        self._mode: Any = None

    def __enter__(self) -> PeakTracker:
        import torch

        self.peak = self.current = 0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.baseline = int(torch.cuda.memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.baseline = 0
            self._mode = _live_tensor_mode_class()(self)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = max(0, int(torch.cuda.max_memory_allocated(self.device)) - self.baseline)
            self.current = int(torch.cuda.memory_allocated(self.device)) - self.baseline
        elif self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None

    # called by the dispatch mode; kept here so that the counts live on one object
    def _add(self, nbytes: int) -> None:
        self.current += nbytes
        if self.current > self.peak:
            self.peak = self.current

    def _remove(self, box: list[int]) -> None:
        self.current -= box[0]


_MODE_CLASS: list[type] = []


def _forget(tracker: PeakTracker, box: list[int], _ref: object) -> None:
    """Weak-reference callback: a tracked storage was freed."""
    tracker._remove(box)


def _live_tensor_mode_class() -> type:
    """Build (once) the dispatch mode class; deferred so that importing this module needs no torch."""
    if _MODE_CLASS:
        return _MODE_CLASS[0]
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    def storages(tree: Any) -> list[tuple[Any, str]]:
        # (storage, the tensor's device type): a fake tensor's storage lives on "meta"
        out = []
        for leaf in tree_flatten(tree)[0]:
            if isinstance(leaf, torch.Tensor):
                try:
                    out.append((leaf.untyped_storage(), leaf.device.type))
                except (
                    RuntimeError,
                    NotImplementedError,
                ):  # sparse, nested and other storage-less tensors
                    continue
        return out

    class _LiveTensorMode(TorchDispatchMode):  # type: ignore[misc]
        def __init__(self, tracker: PeakTracker) -> None:
            super().__init__()
            self.tracker = tracker
            self.device_type = tracker.device.type
            # storage -> (weakref whose callback subtracts the bytes, [bytes counted])
            self.seen: Any = WeakIdKeyDictionary()

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            # storages of the inputs existed before this op: an output sharing one is a view or
            # an in-place result, not new memory (unless we already track it and it was resized)
            before = {id(s) for s, _ in storages((args, kwargs))}
            out = func(*args, **(kwargs or {}))
            for st, device_type in storages(out):
                if device_type != self.device_type:
                    continue
                entry = self.seen.get(st)
                if entry is not None:
                    box = entry[1]
                    nbytes = int(st.nbytes())
                    if nbytes != box[0]:
                        self.tracker._add(nbytes - box[0])
                        box[0] = nbytes
                elif id(st) not in before:
                    box = [int(st.nbytes())]
                    ref = weakref.ref(st, functools.partial(_forget, self.tracker, box))
                    self.seen[st] = (ref, box)
                    self.tracker._add(box[0])
            return out

    _MODE_CLASS.append(_LiveTensorMode)
    return _LiveTensorMode


def measure_peak(fn: Callable[..., Any], *args: Any, device: Any = "cpu", **kwargs: Any) -> int:
    """Peak bytes that ``fn(*args, **kwargs)`` adds on ``device`` (see :class:`PeakTracker`).

    Args:
        fn: the work to measure; its result is discarded (use :func:`collect_peak_memory` to
            keep results).
        *args: positional arguments for ``fn``.
        device: ``"cuda"``/``"cuda:N"`` (allocator statistics), or ``"cpu"``, ``"meta"``
            (live-tensor tracker; also for fake tensors of those devices).
        **kwargs: keyword arguments for ``fn``.

    Returns:
        The peak number of bytes added, an ``int``.

    Raises:
        RuntimeError: ``device`` is CUDA but CUDA is not available (the message says why and
            which devices measure without it).
        ValueError: ``cuda:N`` past the last visible device, or not a device name.

    >>> import torch
    >>> measure_peak(lambda n: torch.zeros(n, n, device="meta"), 64, device="meta")
    16384
    """
    with PeakTracker(device) as tracker:
        fn(*args, **kwargs)
    return tracker.peak


@dataclasses.dataclass(frozen=True)
class MemoryProfile:
    """What :func:`collect_peak_memory` measured.

    Attributes:
        features: ``work``'s results for the items that completed, in dataset order.
        peaks: peak bytes of those items (absolute on CUDA: the allocator's peak during the
            item; elsewhere bytes added by the item), an int64 array aligned with ``features``.
        indices: dataset positions of the completed items.
        failed: dataset positions of the items that ran out of memory.
        errors: the error message of each failed item, aligned with ``failed``.

    >>> import torch
    >>> def work(n):
    ...     if n > 100:
    ...         raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
    ...     return torch.empty(n, device="meta").numel()
    >>> prof = collect_peak_memory([10, 1000, 20], work, device="meta", progress=False)
    >>> len(prof), prof.features, prof.peaks.tolist(), prof.indices.tolist()
    (2, [10, 20], [40, 80], [0, 2])
    >>> prof.failed, prof.errors
    ((1,), ('OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB',))
    """

    features: list[Any]
    peaks: NDArray[np.int64]
    indices: NDArray[np.int64]
    failed: tuple[int, ...] = ()
    errors: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.features)


def _progress(iterable: Iterable[T], *, total: int | None, desc: str, enabled: bool) -> Iterator[T]:
    """Wrap in a tqdm bar when asked for and installed (the ``progress`` extra)."""
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            logger.info("%s: install tqdm (the 'progress' extra) for a progress bar", desc)
        else:
            yield from tqdm(iterable, total=total, desc=desc)
            return
    yield from iterable


def collect_peak_memory(
    dataset: Iterable[Any],
    work: Callable[[Any], Any],
    *,
    device: Any,
    cleanup: Callable[[], None] | None = None,
    warmup: int = 1,
    progress: bool = True,
) -> MemoryProfile:
    """Run ``work`` on every item of ``dataset`` and record the peak memory of each.

    The seed tool's ``collect_cuda_peak_alloc``, generalised: any device (CPU and ``meta``
    through the live-tensor tracker), warm-up runs whose measurements are discarded (the first
    runs allocate lazily created buffers such as optimizer state), a progress bar, and items
    that run out of memory recorded in ``failed`` instead of being dropped or aborting the run.

    Args:
        dataset: the items (any iterable; it is consumed once).
        work: called on each item inside the measurement; its result becomes the item's feature.
        device: where the work allocates (``"cuda:0"``, ``"cpu"``, ``"meta"``).
        cleanup: called after each item, before garbage collection (e.g. ``zero_grad``).
        warmup: how many times ``work`` runs, unmeasured, on the first item before measuring;
            the first item is then measured like every other one.
        progress: show a tqdm bar when tqdm is installed.

    Returns:
        A :class:`MemoryProfile`.

    Raises:
        ValueError: if ``warmup`` is negative.

    >>> import torch
    >>> prof = collect_peak_memory([10, 20, 30], lambda n: n, device="cpu", progress=False,
    ...                            cleanup=None, warmup=0)
    >>> prof.features, prof.peaks.tolist()
    ([10, 20, 30], [0, 0, 0])
    >>> prof = collect_peak_memory([10, 20], lambda n: torch.empty(n).numel(), device="cpu",
    ...                            progress=False)
    >>> prof.peaks.tolist()
    [40, 80]
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    dev = as_device(device)
    features: list[Any] = []
    peaks: list[int] = []
    indices: list[int] = []
    failed: list[int] = []
    errors: list[str] = []
    total = len(dataset) if hasattr(dataset, "__len__") else None  # type: ignore[arg-type]
    for index, item in enumerate(
        _progress(dataset, total=total, desc="peak memory", enabled=progress)
    ):
        if index == 0:
            for _ in range(warmup):
                _run_once(work, item, dev, cleanup)
        feature, peak, error = _run_once(work, item, dev, cleanup)
        if error is None:
            features.append(feature)
            peaks.append(peak)
            indices.append(index)
        else:
            failed.append(index)
            errors.append(error)
    if failed:
        logger.warning(
            "collect_peak_memory: %d of %d items ran out of memory on %s (positions %s%s)",
            len(failed),
            len(failed) + len(features),
            dev,
            failed[:5],
            " ..." if len(failed) > 5 else "",
        )
    return MemoryProfile(
        features=features,
        peaks=np.asarray(peaks, dtype=np.int64),
        indices=np.asarray(indices, dtype=np.int64),
        failed=tuple(failed),
        errors=tuple(errors),
    )


def _run_once(
    work: Callable[[Any], Any], item: Any, device: torch.device, cleanup: Callable[[], None] | None
) -> tuple[Any, int, str | None]:
    """(feature, absolute-or-added peak, error message or None) for one item."""
    feature: Any = None
    error: str | None = None
    tracker = PeakTracker(device)
    try:
        with tracker:
            feature = work(item)
    except Exception as exc:
        if not is_oom_error(exc):
            raise
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if cleanup is not None:
        cleanup()
    if error is not None or device.type == "cuda":  # off CUDA, refcounting already freed the item
        free_memory(device)
    return feature, tracker.baseline + tracker.peak, error
