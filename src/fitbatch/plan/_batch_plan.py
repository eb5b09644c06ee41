"""``BatchPlan``: one epoch's batches as index arrays, with per-batch costs, units and shapes.

Made by :func:`fitbatch.plan_batches` (see :mod:`fitbatch.plan._planner`, which re-exports it) or, for
batches made elsewhere, by :meth:`BatchPlan.from_batches`; :func:`measure_batches` measures them.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import operator
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np
from numpy.typing import NDArray

from fitbatch import _lazy
from fitbatch._kernels import batches as K
from fitbatch._kernels import jit as _jit
from fitbatch._validate import parse_budget
from fitbatch.costs import CostModel, Limits, resolve_cost
from fitbatch.costs._limits import check_limits, column_costs, limit_fills, limit_index
from fitbatch.plan import _shapes as S
from fitbatch.plan._stats import PlanStats
from fitbatch.sizes import Sizes, SizesLike, as_sizes

if TYPE_CHECKING:
    from fitbatch._kernels import pattern_layout
else:  # loaded by the first plan that measures its batches by pattern (not by import fitbatch)
    pattern_layout = _lazy.module("fitbatch._kernels.pattern_layout")

logger = logging.getLogger("fitbatch.plan._planner")

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
# BatchPlan.__iter__ turns this many batches' heads and counts into Python ints at a time
ITER_CHUNK = 1 << 16
# plans of at most this many batches are iterated as slices of the order (see __iter__)
SLICED_BATCHES = 2048


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused (if it runs) while many lists of ints are made.

    Such lists form no reference cycles, but each one counts towards the next collection and
    each full collection walks every list made so far: 2.3 s of a 3 s :meth:`BatchPlan.to_lists`
    at 10M samples in 1.4M batches. Reference counting still frees whatever dies meanwhile.
    """
    running = gc.isenabled()
    if running:
        gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()


class _Windows(dict):  # type: ignore[type-arg]
    """``count`` -> the 2-D view of ``order`` whose row ``h`` is ``order[h:h + count]`` (made on first use)."""

    def __init__(self, order: IntArray) -> None:
        super().__init__()
        self.order = order

    def __missing__(self, count: int) -> IntArray:
        order = self.order
        step = order.itemsize
        view: IntArray = np.ndarray((order.size - count + 1, count), order.dtype, buffer=order, strides=(step, step))
        self[count] = view
        return view


class _Later:
    """A per-batch array a plan gathers on first use: ``values[kind]`` (given to
    :class:`BatchPlan` in place of the array; see :func:`_measure_kinds`). Plain data, so the
    plan pickles."""

    def __init__(self, kind: NDArray[Any], values: FloatArray) -> None:
        self.kind, self.values = kind, values

    def make(self) -> FloatArray:
        return pattern_layout.per_batch(self.kind, self.values[np.newaxis])[0]


class _Base(dict):  # type: ignore[type-arg]
    """A plan's per-batch arrays over its (order, offsets), by name; the counts are taken from the
    offsets on first use (millions of batches: 8 B each, that a plan nobody iterates never reads),
    and an array given as :class:`_Later` is made then."""

    def __init__(self, offsets: IntArray, **arrays: Any) -> None:
        self.later = {name: a for name, a in arrays.items() if isinstance(a, _Later)}
        super().__init__({name: a for name, a in arrays.items() if name not in self.later}, heads=offsets[:-1])
        self.offsets = offsets

    def __missing__(self, name: str) -> Any:
        if name in self.later:
            made = self[name] = self.later.pop(name).make()
            return made
        if name != "counts":
            raise KeyError(name)
        counts = self["counts"] = np.diff(self.offsets)
        return counts


def _per_batch(name: str, doc: str) -> Any:
    """A read-only per-batch array of a plan (selected for the plan's batches on first use)."""
    return property(lambda plan: plan._pick(name), doc=doc)


class BatchPlan(Sequence[IntArray]):
    """One epoch's batches: a sequence of int64 index arrays (views of one ``order`` array).

    Attributes:
        order: sample indices in batch order; ``offsets`` cut it into batches.
        offsets: int64, ``len(plan) + 1`` entries.
        costs: cost of each batch under the plan's cost model.
        counts, real_units, padded_units: per batch, samples, real (unpadded) size units and
            padded units (count x padded length), for padding statistics and loss normalisation.
        skipped, dropped: indices of samples left out (oversized, ``drop_last``).
        loss_sizes, loss_units: the tokens of each sample that carry loss, when given
            (``loss_sizes=``), and their sum per batch; without them ``loss_units`` is ``real_units``.
        shape_set: with ``max_shapes``, the (K, 2) int64 ``(rows, length)`` shapes every batch
            fits (by length), the same every epoch and rank; else ``None``. See :attr:`shapes`.

    Made by :func:`plan_batches`; batches made elsewhere become a plan with :meth:`from_batches`.

    >>> import fitbatch
    >>> plan = fitbatch.plan_batches([4, 1, 9, 3, 2, 5], 6, cost="sum", strategy="sequential", oversized="skip")
    >>> plan
    BatchPlan(3 batches, 5 samples, strategy='sequential', cost='sum')
    >>> plan[1].tolist(), plan.order.tolist(), plan.offsets.tolist()
    ([3, 4], [0, 1, 3, 4, 5], [0, 2, 4, 5])
    >>> plan.costs.tolist(), plan.skipped.tolist()
    ([5.0, 5.0, 5.0], [2])
    """

    def __init__(
        self,
        order: IntArray,
        offsets: IntArray,
        *,
        costs: FloatArray, real_units: FloatArray, padded_units: FloatArray,
        budget: float, cost_name: str, strategy_name: str, lower_bound: int = 0,
        skipped: IntArray | None = None, dropped: IntArray | None = None, dropped_batches: int = 0,
        plan_seconds: float = 0.0, straggler_ratio: float | None = None,
        batch_ids: IntArray | None = None, ids_permute_all: bool = False, loss_sizes: FloatArray | None = None,
        shape_set: IntArray | None = None,
    ) -> None:
        # The plan's batch k is batch batch_ids[k] of (order, offsets); per-batch arrays given
        # here describe (order, offsets) and are selected on first use (a shuffled epoch of
        # millions of batches never pays for arrays nobody reads).
        self._base_order = order
        self._base_offsets = offsets
        self._ids = batch_ids
        self._base: dict[str, Any] = _Base(offsets, costs=costs, real_units=real_units, padded_units=padded_units)
        self._picked: dict[str, Any] = {}
        # whether batch_ids reorders every batch (then sums and extremes equal the base arrays')
        self._all = batch_ids is None or (ids_permute_all and batch_ids.size == offsets.size - 1)
        self.budget = budget
        self.cost_name = cost_name
        self.strategy_name = strategy_name
        self.lower_bound = lower_bound
        self.skipped = np.zeros(0, np.int64) if skipped is None else skipped
        self.dropped = np.zeros(0, np.int64) if dropped is None else dropped
        self.dropped_batches = dropped_batches
        self.plan_seconds = plan_seconds
        self.straggler_ratio = straggler_ratio
        self._order: IntArray | None = order if batch_ids is None else None
        self.loss_sizes = loss_sizes  # per sample of the dataset; None: loss units are real units
        self.shape_set = shape_set
        self._limits: tuple[Limits, FloatArray] | None = None  # several limits: (model, sizes)
        self._column_costs: FloatArray | None = None

    @property
    def loss_units(self) -> FloatArray:
        """Tokens that carry loss in each batch: the sum of its ``loss_sizes`` (``real_units`` without them)."""
        return self._pick(self._loss_name())

    def _loss_name(self) -> str:
        if self.loss_sizes is not None and self._base.get("loss_of") is not self.loss_sizes:
            counts, heads = self._base["counts"], self._base_offsets[:-1]
            out, full = np.zeros(counts.size), counts > 0  # an empty batch carries no loss
            loss = self.loss_sizes[self._base_order[: int(self._base_offsets[-1])]]
            out[full] = np.add.reduceat(loss, heads[full]) if loss.size else 0.0
            self._base.update(loss_units=out, loss_of=self.loss_sizes)
            self._picked.pop("loss_units", None)
        return "real_units" if self.loss_sizes is None else "loss_units"

    @classmethod
    def from_batches(
        cls,
        sizes: SizesLike,
        cost: str | CostModel | Any,
        order: Any,
        offsets: Any,
        *,
        budget: float | str | None,
        strategy_name: str,
        lower_bound: int | None = None,
        skipped: IntArray | None = None,
        dropped: IntArray | None = None,
        dropped_batches: int = 0,
        plan_seconds: float = 0.0,
        shape_set: IntArray | None = None,
    ) -> BatchPlan:
        """A plan of given batches, measured: the constructor for batches not planned here.

        Batch ``k`` is ``order[offsets[k]:offsets[k + 1]]``; costs, real and padded units come
        from :func:`measure_batches` under ``cost``, so baselines, schedules, per-rank plans
        and other planners' batches get the same statistics as :func:`plan_batches`' plans.

        Args:
            sizes: every sample's size (see :func:`fitbatch.as_sizes`).
            cost: the cost model the batches are measured with (its name names the plan's cost).
            order: sample indices in batch order.
            offsets: batch boundaries in ``order``: 0, ..., ``len(order)``, non-decreasing.
            budget: the budget fills are measured against; ``None`` when the batches were not
                planned against one (the costliest batch stands for it, at least 1).
            strategy_name: how the batches were made (shown in stats and reports).
            lower_bound: as in the plan's stats.
            skipped: indices of the samples left out as oversized (``oversized="skip"``).
            dropped: indices of the samples left out by ``drop_last``.
            dropped_batches: as in the plan's stats.
            plan_seconds: as in the plan's stats.
            shape_set: the shapes the batches were planned to fit (``max_shapes``), if any.

        Raises:
            ValueError: offsets that do not cut ``order``, or indices outside ``sizes``.

        >>> plan = BatchPlan.from_batches([4, 1, 3, 2], "padded", [1, 3, 2, 0], [0, 2, 4], budget=8, strategy_name="by hand")
        >>> plan.to_lists(), plan.costs.tolist(), plan.stats().max_fill
        ([[1, 3], [2, 0]], [4.0, 8.0], 1.0)
        """
        sz = as_sizes(sizes)
        model = check_limits(sz.columns, resolve_cost(cost))
        order, offsets = _indices("order", order), _indices("offsets", offsets)
        if order.ndim != 1 or (order.size and (order.min() < 0 or order.max() >= len(sz))):
            raise ValueError(f"order must be a 1-D array of indices of the {len(sz)} samples, got {order[:8].tolist()}")
        if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0 or offsets[-1] != order.size:
            raise ValueError(f"offsets must run from 0 to len(order) = {order.size}, got {offsets[:8].tolist()}")
        if np.any(np.diff(offsets) < 0):
            raise ValueError(f"offsets must not decrease, got {offsets[:8].tolist()}")
        _, costs, real, padded = measure_batches(sz, model, order, offsets)
        cap = float(max(costs.max(initial=0.0), 1.0)) if budget is None else parse_budget(budget)
        if lower_bound is None:  # the bound of the samples the batches hold
            from fitbatch.plan._stats import samples_bound

            lower_bound = samples_bound(model, cap, sz.values[order])
        plan = cls(
            order, offsets, costs=costs, real_units=real, padded_units=padded, budget=cap, cost_name=model.name,
            strategy_name=strategy_name, lower_bound=lower_bound, skipped=skipped, dropped=dropped,
            dropped_batches=dropped_batches, plan_seconds=plan_seconds, shape_set=shape_set,
        )
        plan._limits = (model, sz.values) if isinstance(model, Limits) else None
        return plan

    def _pick(self, name: str) -> Any:
        if self._ids is None:
            return self._base[name]
        if name not in self._picked:
            self._picked[name] = self._base[name][self._ids]
        return self._picked[name]

    # per-batch arrays (read-only properties; see _per_batch)
    costs: FloatArray = _per_batch("costs", "Cost of each batch under the plan's cost model.")
    real_units: FloatArray = _per_batch("real_units", "Real (unpadded) size units of each batch.")
    padded_units: FloatArray = _per_batch("padded_units", "Padded units of each batch: count x padded length.")
    counts: IntArray = _per_batch("counts", "Samples in each batch.")
    _heads: IntArray = _per_batch("heads", "Where each batch starts in the base order.")

    @property
    def shapes(self) -> IntArray | None:
        """Each batch's ``(rows, length)`` of :attr:`shape_set` ((n_batches, 2) int64), or ``None``.

        The shape the collates pick: among the shapes with rows >= the batch's samples and length
        >= its longest sample, the smallest length, then the smallest rows.

        >>> import fitbatch
        >>> plan = fitbatch.plan_batches([3, 5, 9, 10, 4, 10], 40, strategy="sorted", max_shapes=2)
        >>> plan.shape_set.tolist(), plan.shapes.tolist()
        ([[8, 5], [4, 10]], [[8, 5], [4, 10]])
        """
        if self.shape_set is None:
            return None
        if "shapes" not in self._base:
            counts = self._base["counts"]
            longest = S.batch_longest(counts, self._base["padded_units"])
            self._base["shapes"] = S.pick_shapes(self.shape_set, counts, longest)
        shapes: IntArray = self._pick("shapes")
        return shapes

    def _totals(self, name: str) -> Any:
        """The per-batch array for order-free reductions (the base one when no batch is left out)."""
        return self._base[name] if self._all else self._pick(name)

    @property
    def order(self) -> IntArray:
        """Sample indices in batch order (materialised on first use)."""
        if self._order is None:
            self._order = self._base_order[K._concat_ranges(self._heads, self.counts)]
        return self._order

    @property
    def offsets(self) -> IntArray:
        """Batch boundaries in :attr:`order` (``len(plan) + 1`` entries)."""
        if self._ids is None:
            return self._base_offsets
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    @property
    def n_samples(self) -> int:
        return int(self._base_offsets[-1] - self._base_offsets[0]) if self._all else int(self._pick("counts").sum())

    def __len__(self) -> int:
        return int(self._base_offsets.size - 1 if self._ids is None else self._ids.size)

    @overload
    def __getitem__(self, i: int) -> IntArray: ...

    @overload
    def __getitem__(self, i: slice) -> list[IntArray]: ...

    def __getitem__(self, i: int | slice) -> IntArray | list[IntArray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"batch index must be an int or a slice, got {i!r}")
        if not -n <= i < n:
            raise IndexError(f"batch {i} out of range for a plan of {n} batches")
        i = int(i) % n
        head = int(self._heads[i])
        return self._base_order[head : head + int(self.counts[i])]

    def __iter__(self) -> Iterator[IntArray]:
        # Batch k is row heads[k] of a 2-D view of the order whose rows are its counts[k]-long
        # windows (one view per batch length, made on first use): an int index makes the view
        # faster than a slice, and map() walks the batches with no Python step each (0.60 s
        # instead of 0.76 s for 3.2M batches). Heads and counts become Python ints ITER_CHUNK
        # batches at a time, so no list over all the batches is held while iterating (the
        # batches are still views of the order, made one at a time as they are asked for).
        order, heads, counts = self._base_order, self._heads, self.counts
        # a few batches: one slice each (a view per batch length would be made for about as
        # many lengths as batches: 16 us against 71 for 113 batches of 20k samples)
        if heads.size <= SLICED_BATCHES or not order.flags.c_contiguous:
            return (order[head : head + count] for head, count in zip(heads.tolist(), counts.tolist()))
        windows = _Windows(order)

        def chunk(lo: int) -> Iterator[IntArray]:
            hi = lo + ITER_CHUNK
            return map(operator.getitem, map(windows.__getitem__, counts[lo:hi].tolist()), heads[lo:hi].tolist())

        return itertools.chain.from_iterable(map(chunk, range(0, heads.size, ITER_CHUNK)))

    def to_lists(self) -> list[list[int]]:
        """The batches as lists of Python ints."""
        with _collector_paused():
            flat = self.order.tolist()
            bounds = self.offsets.tolist()
            return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def select(self, batches: IntArray, *, straggler_ratio: float | None = None) -> BatchPlan:
        """A plan of the given batches of this plan, in the given order (e.g. one rank's share)."""
        batches = _indices("batches", batches)
        if batches.size and (batches.min() < -len(self) or batches.max() >= len(self)):
            raise IndexError(f"batches must index the plan's {len(self)} batches, got {batches[:8].tolist()}")
        base_ids = batches if self._ids is None else self._ids[batches]
        per_batch = (self._base["costs"], self._base["real_units"], self._base["padded_units"])
        ratio = straggler_ratio if straggler_ratio is not None else self.straggler_ratio
        return self._derived(self._base_order, self._base_offsets, per_batch, straggler_ratio=ratio, batch_ids=base_ids)

    def rebatched(
        self,
        order: IntArray,
        offsets: IntArray,
        per_batch: tuple[FloatArray, FloatArray, FloatArray],
        *,
        index_map: IntArray | None = None,
    ) -> BatchPlan:
        """Other batches with this plan's metadata (budget, names, bound, skipped, dropped).

        ``per_batch`` is (costs, real units, padded units) of the new batches; ``index_map``
        renames sample indices (a plan of a subset mapped back to the whole dataset).
        """
        if index_map is None:
            return self._derived(order, offsets, per_batch)
        # loss sizes of a plan of a subset are not the dataset's: the caller attaches those
        skipped, dropped = index_map[self.skipped], index_map[self.dropped]
        return self._derived(order, offsets, per_batch, skipped=skipped, dropped=dropped, loss_sizes=None)

    def _derived(
        self, order: IntArray, offsets: IntArray, per_batch: tuple[FloatArray, FloatArray, FloatArray], **changes: Any
    ) -> BatchPlan:
        """A plan of other batches with this plan's metadata, ``changes`` applied."""
        costs, real, padded = per_batch
        meta: dict[str, Any] = {
            "budget": self.budget, "cost_name": self.cost_name, "strategy_name": self.strategy_name,
            "lower_bound": self.lower_bound, "skipped": self.skipped, "dropped": self.dropped,
            "dropped_batches": self.dropped_batches, "plan_seconds": self.plan_seconds,
            "straggler_ratio": self.straggler_ratio, "loss_sizes": self.loss_sizes, "shape_set": self.shape_set,
        }
        plan = BatchPlan(order, offsets, costs=costs, real_units=real, padded_units=padded, **{**meta, **changes})
        plan._limits = None if "skipped" in changes else self._limits  # renamed samples: other sizes
        return plan

    def limit_costs(self, name: str) -> FloatArray:
        """Each batch's cost in the column ``name``, in its own units (several limits only).

        With several limits (a budget per named size column) ``costs`` are fills (the largest
        column cost / budget; the budget is 1), and real and padded units are those of the
        first column whose cost uses the max (else the first).

        >>> import fitbatch
        >>> plan = fitbatch.plan_batches({"tokens": [40, 30, 20], "images": [1, 2, 1]}, {"tokens": 64, "images": 3},
        ...                              cost={"images": "sum"}, strategy="sequential")
        >>> plan.to_lists(), plan.limit_costs("tokens").tolist(), plan.stats().fill_by_limit
        ([[0], [1, 2]], [40.0, 60.0], {'images': 0.6666666666666666, 'tokens': 0.78125})
        """
        if self._column_costs is None:
            self._column_costs = column_costs(self._limits, self.order, self.offsets)
        return self._column_costs[:, limit_index(self._limits, name)]

    def stats(self) -> PlanStats:
        """Statistics of this plan (see :class:`PlanStats`)."""
        padded = float(self._totals("padded_units").sum())
        fills = self._totals("costs") / self.budget
        by_limit, min_by_limit = (None, None) if self._limits is None else limit_fills(self._limits[0], self.limit_costs)
        return PlanStats(
            n_samples=self.n_samples,
            n_batches=len(self),
            lower_bound=self.lower_bound,
            padding_efficiency=float(self._totals("real_units").sum()) / padded if padded > 0 else 1.0,
            mean_fill=float(fills.mean()) if fills.size else 0.0,
            max_fill=float(fills.max()) if fills.size else 0.0,
            skipped=int(self.skipped.size),
            dropped=int(self.dropped.size),
            dropped_batches=self.dropped_batches,
            oversized_batches=int(np.count_nonzero(self.costs > self.budget)),
            budget=self.budget,
            cost=self.cost_name,
            strategy=self.strategy_name,
            plan_seconds=self.plan_seconds,
            straggler_ratio=self.straggler_ratio,
            loss_units=float(self._totals(self._loss_name()).sum()),
            fill_by_limit=by_limit,
            min_fill_by_limit=min_by_limit,
            **S.shape_stats(self.shapes, self._totals("real_units")),
        )

    def report(self) -> str:
        """A short human-readable report (the CLI prints the same numbers)."""
        s = self.stats()
        rows = [
            ("strategy / cost", f"{s.strategy} / {s.cost}"),
            ("budget", f"{s.budget:g}"),
            ("samples", f"{s.n_samples}"),
            ("batches", f"{s.n_batches} ({s.batches_vs_lower_bound:.3f}x lower bound {s.lower_bound})"),
            ("padding efficiency", f"{s.padding_efficiency:.4f}"),
            ("fill mean / max", f"{s.mean_fill:.3f} / {s.max_fill:.3f}"),
            ("skipped / dropped", f"{s.skipped} / {s.dropped} ({s.dropped_batches} batches)"),
            ("plan time", f"{s.plan_seconds * 1e3:.1f} ms"),
        ]
        if s.straggler_ratio is not None:
            rows.append(("straggler ratio", f"{s.straggler_ratio:.4f}"))
        if s.fill_by_limit is not None and s.min_fill_by_limit is not None:
            rows.append(("fill by limit mean (min)", s.limits_text()))
        if s.n_shapes is not None:
            rows.append(("shapes / efficiency", f"{s.n_shapes} / {s.shape_efficiency:.4f}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def __repr__(self) -> str:
        return f"BatchPlan({len(self)} batches, {self.n_samples} samples, strategy={self.strategy_name!r}, cost={self.cost_name!r})"


def _indices(name: str, values: Any) -> IntArray:
    """``values`` as int64 indices, refusing floats and booleans (a cast would truncate them, and a
    boolean mask would read as the indices 0 and 1)."""
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer indices, got {arr.dtype} values {arr.ravel()[:5].tolist()}")
    return arr.astype(np.int64, copy=False)


def measure_batches(
    sizes: Sizes, model: CostModel, order: IntArray | None, offsets: IntArray, *, laid: FloatArray | None = None,
    kinds: tuple[NDArray[Any], IntArray, FloatArray, FloatArray] | None = None,
) -> tuple[IntArray, FloatArray, FloatArray, FloatArray]:
    """Per batch: count, cost, real (unpadded) units and padded units (count x padded length).

    ``order=None`` means the samples are in index order (no gather); ``laid``, when given, is
    ``sizes.values[order]`` already gathered (by the planning kernel); ``kinds`` (1-D sizes),
    each batch's kind and per kind the count, max and sum of its batches (known to the
    strategy): the kinds are measured, nothing is read per sample.
    """
    values = sizes.values
    if kinds is not None and values.ndim == 1:
        costs, real, padded = _measure_kinds(model, kinds)
        return np.asarray(kinds[1], dtype=np.int64)[kinds[0]], costs, real, padded
    costs, real, padded = _measure(sizes, model, order, offsets, laid)
    return np.diff(offsets), costs, real, padded


def _measure_kinds(
    model: CostModel, kinds: tuple[NDArray[Any], IntArray, FloatArray, FloatArray], *, later: bool = False
) -> tuple[FloatArray, FloatArray, Any]:
    """:func:`measure_batches`' cost, real and padded units of batches of kinds (1-D sizes; see
    its ``kinds``): each kind measured once, then gathered per batch (one array shared by the
    costs and the real units under a sum cost; the counts are left to the offsets). With
    ``later``, the padded units come as :class:`_Later` (gathered when the plan is asked for them:
    the plan keeps the kinds, 2 B a batch, instead of 8)."""
    kind, count, mx, sm = kinds
    cost = model.evaluate(count.astype(np.float64), mx, sm)
    same = cost is sm  # (a sum cost: the costs are the real units)
    padded = np.asarray(count * mx, dtype=np.float64)
    rows = [cost] if same else [cost, sm]
    if not later:
        rows.append(padded)
    got = pattern_layout.per_batch(kind, np.stack(rows).astype(np.float64, copy=False))
    real = got[0] if same else got[1]
    if not later:
        return got[0], real, got[-1]
    return got[0], real, _Later(kind, padded)


def _measure(
    sizes: Sizes, model: CostModel, order: IntArray | None, offsets: IntArray, laid: FloatArray | None = None,
    measured: tuple[FloatArray, FloatArray] | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """:func:`measure_batches` without the kinds and the counts: per batch cost, real and padded
    units, with one per-batch array fewer alive at a time (the counts, as float64, become the
    padded units in place; the caller takes ``np.diff(offsets)`` where it needs the counts).
    ``measured``: each batch's longest and total size as the strategy found them (1-D sizes;
    see :attr:`fitbatch.strategies.Result.measured`), used instead of reading the sizes."""
    values = sizes.values
    # each batch's longest and total: the strategy's, else read in place by the compiled loop
    reduced = measured if values.ndim == 1 else None
    if reduced is None and sizes.integral and values.ndim == 1:  # read in place: no gathered copy of the sizes
        reduced = _jit.batch_reduce(values, order, offsets) if laid is None else _jit.batch_reduce(laid, None, offsets)
    if reduced is not None:
        mx, sm = reduced
        # float64 straight from the offsets (exact below 2**53): no int64 counts beside them
        counts = np.subtract(offsets[1:], offsets[:-1], dtype=np.float64)
    else:
        icounts, mx, sm = K.batch_reduce(values, offsets, order) if laid is None else K.batch_reduce(laid, offsets)
        counts = icounts.astype(np.float64)
        del icounts
    del laid
    costs = model.evaluate(counts, mx, sm)
    if values.ndim == 1:
        real, length = sm, mx
    elif isinstance(model, Limits):  # the units of the padded column (tokens), not a product
        j = next((j for j, c in enumerate(model.costs) if c.uses_max), 0)
        real, length = sm[:, j], mx[:, j]
    else:
        units = sizes.real_units() if order is None else sizes.real_units()[order]
        real = K.batch_reduce(units, offsets)[2]  # (an empty batch holds no units)
        length = np.prod(mx, axis=1)
    del mx
    length = np.asarray(length, dtype=np.float64)
    # the padded units (count x length) in place of the float counts, unless the costs hold them
    if np.may_share_memory(costs, counts) or np.may_share_memory(length, counts):
        padded = counts * length
    else:
        padded = np.multiply(counts, length, out=counts)
    return costs, np.asarray(real, dtype=np.float64), padded
