"""``aistore.pytorch.DynamicBatchSampler`` on fitbatch's engine, for any map-style dataset.

Migrating: ``from aistore.pytorch import DynamicBatchSampler`` becomes
``from fitbatch.compat.aistore import DynamicBatchSampler``; nothing else changes. Any data
source works whose object byte sizes are known: an AIS map-style dataset
(``get_obj_list()``, each object's ``props_cached.size``), or simply a sequence of sizes.

The batches are the original's: greedy in index order (or a shuffled order), a batch takes
samples while their summed size stays at most ``max_batch_size``; a sample larger than
``max_batch_size`` is dropped (logged and counted), or with ``allow_oversized_samples=True``
gets a batch of its own; with ``drop_last=True`` the last batch is dropped unless it is filled
to ``saturation_factor``. They are planned by :func:`fitbatch.plan._planner.plan_batches`
(``strategy="sequential"``, ``cost="sum"``, ``oversized="skip"`` or ``"single"``,
``drop_last``, ``saturation``).

Deliberate differences from aistore 2.0.0 (bugs not reproduced):

* ``len()`` is the number of batches the next iteration yields (the original returns the
  number of samples, so ``DataLoader`` lengths and progress bars are wrong).
* ``shuffle=True`` draws the order from ``seed`` and the epoch (``set_epoch``), reproducibly;
  the original uses torch's global RNG.
* A last batch filled exactly to ``saturation_factor`` is kept, as the documentation says
  ("dropped if the batch is not at least 80% of max_batch_size"); the original drops it too
  (it tests ``fill > saturation_factor``).
* With ``allow_oversized_samples=True`` an oversized sample closes the batch before it, so
  every batch holds consecutive samples of the order; the original yields the oversized sample
  at once and keeps filling the batch that was open before it.
* Zero-byte objects are batched like any other (the original drops them with a warning).
* Fractional sizes are planned against ``max_batch_size * (1 - 1e-12)`` (see
  :func:`fitbatch.plan._planner.plan_with`); ties within that margin may close a batch earlier.

>>> from fitbatch.compat.aistore import DynamicBatchSampler
>>> sampler = DynamicBatchSampler([400, 300, 900, 2000, 200], max_batch_size=1000)
>>> list(sampler), len(sampler)
([[0, 1], [2], [4]], 3)
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fitbatch._rng import SeedLike
from fitbatch._validate import fraction, parse_budget
from fitbatch.compat import lazy_torch_classes
from fitbatch.plan._planner import BatchPlan, PlanOptions, plan_with
from fitbatch.sampler._protocol import PlanSampler, RankLayout
from fitbatch.sizes import as_sizes

__all__ = ["DynamicBatchSampler", "SATURATION_FACTOR", "object_sizes"]

# Default saturation of a batch needed to not be dropped with drop_last=True
SATURATION_FACTOR = 0.8


def object_sizes(data_source: Any) -> list[float]:
    """Byte sizes of a data source: an AIS dataset's objects, or a sequence of numbers.

    >>> object_sizes([3, 5.5])
    [3, 5.5]
    """
    if hasattr(data_source, "get_obj_list"):
        return [obj.props_cached.size for obj in data_source.get_obj_list()]
    try:
        sizes = list(data_source)
    except TypeError:
        raise TypeError(
            "data_source must be an AIS map-style dataset (with get_obj_list()) or a sequence of "
            f"byte sizes, got {type(data_source).__name__}"
        ) from None
    if any(isinstance(s, bool) or not isinstance(s, numbers.Real) for s in sizes):
        raise TypeError("data_source must hold byte sizes (numbers); got " + repr(sizes[:3]))
    return sizes


class _DynamicBatchSampler(PlanSampler):
    """Mini-batches of indices whose summed object sizes fit ``max_batch_size`` bytes.

    A :class:`~fitbatch.sampler._budget.PlanSampler` (``set_epoch``, ``plan()`` with its stats:
    dropped, skipped), and a subclass of torch's ``Sampler`` when torch is installed.

    Args:
        data_source: an AIS map-style dataset (``get_obj_list()``) or a sequence of byte sizes.
        max_batch_size: the most bytes one mini-batch may hold.
        drop_last: drop the last batch unless it holds at least ``saturation_factor`` of
            ``max_batch_size`` (counted in :meth:`plan`'s stats).
        allow_oversized_samples: give a sample over ``max_batch_size`` a batch of its own
            instead of dropping it (dropped samples are logged and counted).
        saturation_factor: see ``drop_last``; in [0, 1].
        shuffle: randomise the order of samples before batching.
        seed: the shuffle's seed (int or ``numpy.random.SeedSequence``; keyword only).

    Raises:
        TypeError, ValueError: invalid arguments (``max_batch_size`` not positive,
            ``saturation_factor`` outside [0, 1]).

    >>> from fitbatch.compat.aistore import DynamicBatchSampler
    >>> sampler = DynamicBatchSampler([400, 300, 900], max_batch_size=1000, shuffle=True, seed=1)
    >>> sampler.set_epoch(3)
    >>> sorted(i for batch in sampler for i in batch), len(sampler)
    ([0, 1, 2], 2)
    """

    def __init__(
        self,
        data_source: Any,
        max_batch_size: float,
        drop_last: bool = False,
        allow_oversized_samples: bool = False,
        saturation_factor: float = SATURATION_FACTOR,
        shuffle: bool = False,
        *,
        seed: SeedLike = 0,
    ) -> None:
        for name, flag in (("drop_last", drop_last), ("allow_oversized_samples", allow_oversized_samples), ("shuffle", shuffle)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        self._data_source = data_source
        self._max_batch_size = parse_budget(max_batch_size, "max_batch_size")
        self._samples_list = object_sizes(data_source)
        self._drop_last = drop_last
        self._allow_oversized_samples = allow_oversized_samples
        self._saturation_factor = fraction("saturation_factor", saturation_factor)
        self._shuffle = shuffle
        self._sizes = as_sizes(self._samples_list)
        self._options = PlanOptions.build(
            self._max_batch_size,
            cost="sum",
            strategy="sequential",
            shuffle=shuffle,
            seed=seed,
            oversized="single" if allow_oversized_samples else "skip",
            drop_last=drop_last,
            saturation=self._saturation_factor,
        )
        self._cache: tuple[int, BatchPlan] | None = None

    _epoch_given = False  # set_epoch was called: the epoch is the caller's, not counted here

    def set_epoch(self, epoch: int) -> None:
        self._epoch_given = True
        super().set_epoch(epoch)

    def _generate(self) -> Iterator[tuple[int, list[int]]]:
        yield from super()._generate()
        if self._shuffle and not self._epoch_given:
            # code written for the original never calls set_epoch, and the original reshuffles
            # every iteration: a complete iteration moves on to the next epoch
            super().set_epoch(self.epoch + 1)

    def _layout(self, epoch: int) -> RankLayout:
        # a new shuffle per epoch, the same for the same seed and epoch
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, plan_with(self._sizes, self._options, epoch))
        return RankLayout.alone(self._cache[1])

    def __repr__(self) -> str:
        return (
            f"DynamicBatchSampler(n={len(self._samples_list)}, max_batch_size={self._max_batch_size:g}, "
            f"drop_last={self._drop_last}, allow_oversized_samples={self._allow_oversized_samples}, "
            f"shuffle={self._shuffle}, epoch={self.epoch})"
        )


if TYPE_CHECKING:
    DynamicBatchSampler = _DynamicBatchSampler
else:
    # torch's Sampler as a base class costs importing torch: paid on first use only
    __getattr__ = lazy_torch_classes(__name__, {"DynamicBatchSampler": (_DynamicBatchSampler, "Sampler")})
