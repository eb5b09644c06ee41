"""Windowed planning: an epoch planned one window of samples at a time, in memory O(window).

An epoch of ``n`` samples is cut into **blocks** of ``block`` consecutive indices; a keyed
permutation of the blocks (``(seed, epoch)``; identity when the strategy does not shuffle) is cut
into **windows** of ``window // block`` blocks. Each window is planned on its own, with any
strategy and cost model, from its samples' sizes alone (gathered from a memory-mapped
:class:`~fitbatch.SizeIndex` block by block), and arranged into equal steps for the ranks.

Equal steps without a ragged step per window: window ``w`` arranges the batches it was handed
(``carry`` in, fewer than a world's worth, from window ``w - 1``) and its own, and hands on
``(carried + own) % world`` of its own batches, picked by a keyed permutation, to ``w + 1``. Only
the last window splits or drops what is left over (``policy``), as an unwindowed epoch does once.
A window's own batches never depend on what it was handed, so window ``w`` is rebuilt from the
own plans of ``w - 1`` and ``w`` and the count ``carry`` (what a state saves): a resume plans two
windows, whatever the epoch's length.

A carried batch is re-measured under the options in force where it lands; one that a smaller
budget no longer holds (a ``set_budget`` after an out-of-memory error in the window before) is
planned again into batches that fit.

>>> import numpy as np
>>> from fitbatch.plan._options import PlanOptions
>>> windows = Windows.keyed(10, window=4, block=2, seed=0, epoch=0, shuffle=False)
>>> windows.n_windows, [windows.ids(w).tolist() for w in range(windows.n_windows)]
(3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])
>>> column = Column.of([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
>>> opts = PlanOptions.build(8, cost="sum", strategy="sequential")
>>> first = build_window(column, windows, 0, opts, world=2, epoch=0, carry_in=())
>>> first.steps.n_steps, [b.tolist() for b in first.carry]
(1, [])
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch import _rng
from fitbatch._state import NUM_REPLICAS_KEY, _good_event, _refuse
from fitbatch.costs import CostModel
from fitbatch.costs._limits import check_limits, describer
from fitbatch.epoch._arrange import Steps, arrange
from fitbatch.epoch._timeline import Timeline, changed
from fitbatch.plan._batch_plan import BatchPlan, measure_batches
from fitbatch.plan._options import PlanOptions
from fitbatch.plan._planner import plan_with
from fitbatch.plan._rules import screen_oversized
from fitbatch.sizes import Sizes, SizesLike, as_sizes
from fitbatch.strategies import Sorted

logger = logging.getLogger(__name__)

IntArray = NDArray[np.int64]

#: samples per window by default (about 1 M: ~40 MB of plan per rank)
WINDOW = 1 << 20
#: samples per block, the unit the keyed permutation moves (a window holds window // block blocks)
BLOCK = 1 << 12
WINDOW_KEY = "window"  # a state's window: the one its step is in
WINDOW_STEP_KEY = "window_step"  # the step of the epoch at which that window's first step runs
CARRY_KEY = "carry"  # batches that window was handed by the one before it
CENSUS = ("collective", "local")

#: ``window="auto"``: plan in windows from this many samples on (a global plan of 2**25 samples
#: peaks at about 1.2 GB per rank)
AUTO_ABOVE = 1 << 25


@dataclasses.dataclass(frozen=True)
class Windows:
    """The windows of one epoch: ``ids(w)`` are the sample indices of window ``w``.

    Attributes:
        n: samples in the epoch.
        window: samples per window (a multiple of ``block``); the last window holds the rest, up
            to one and a half windows, so that no window is much smaller than the others.
        block: samples per block.
        blocks: the permutation of the whole blocks; window ``w`` holds ``blocks[w * k:(w + 1) *
            k]`` with ``k = window // block``, and the last window also the samples after the
            last whole block.
    """

    n: int
    window: int
    block: int
    blocks: IntArray

    @classmethod
    def whole(cls, n: int) -> Windows:
        """The epoch as one window, its samples in index order: an unwindowed epoch.

        >>> Windows.whole(5).n_windows, Windows.whole(5).ids(0).tolist()
        (1, [0, 1, 2, 3, 4])
        """
        block = max(int(n), 1)
        return cls(int(n), block, block, np.zeros(1 if n else 0, np.int64))

    @property
    def one(self) -> bool:
        """Whether the epoch is one window (planned as an unwindowed epoch is)."""
        return self.n_windows == 1

    @classmethod
    def keyed(cls, n: int, *, window: int, block: int, seed: int, epoch: int, shuffle: bool) -> Windows:
        """The windows of epoch ``epoch``: blocks in a ``(seed, epoch)`` permutation when ``shuffle``."""
        block = max(1, min(block, window))
        window = max(block, window // block * block)
        n_blocks = n // block  # whole blocks; the samples after them go to the last window
        blocks = (
            _rng.generator(seed, epoch, "window-blocks").permutation(n_blocks)
            if shuffle
            else np.arange(n_blocks, dtype=np.int64)
        )
        return cls(n, window, block, blocks.astype(np.int64))

    @property
    def per_window(self) -> int:
        """Blocks per window."""
        return self.window // self.block

    @property
    def n_windows(self) -> int:
        """Windows in the epoch: a last part of less than half a window joins the window before it."""
        full, rest = divmod(self.blocks.size, self.per_window)
        return max(1, full + (1 if 2 * rest >= self.per_window else 0))

    def ids(self, w: int) -> IntArray:
        """The sample indices of window ``w``, block after block (ascending within a block)."""
        last = w == self.n_windows - 1
        starts = self.blocks[w * self.per_window : self.blocks.size if last else (w + 1) * self.per_window] * self.block
        # every index: its block's start plus its place in the block
        out = np.repeat(starts, self.block) + np.tile(np.arange(self.block, dtype=np.int64), starts.size)
        return np.concatenate([out, np.arange(self.blocks.size * self.block, self.n, dtype=np.int64)]) if last else out


@dataclasses.dataclass(frozen=True)
class Column:
    """The sizes of every sample as planning reads them: one window's at a time.

    ``values`` is a memory map (a :class:`~fitbatch.SizeIndex` column, int32 or int64 as
    stored) or a validated float64 array; :meth:`take` gathers and converts one window's.
    """

    values: NDArray[Any]
    integral: bool
    columns: tuple[str, ...] | None
    #: an index's digest (its manifest's); ``""`` for sizes in memory (the sampler hashes them with
    #: their ``loss_sizes``, :func:`fitbatch._state.sizes_digest`)
    digest: str
    #: the largest size (an index's manifest ``max``), for one-size columns; else ``None``
    largest: float | None = None
    #: the mean size (of the first column for several), for :func:`auto_window`
    mean: float = 0.0
    #: the :class:`~fitbatch.SizeIndex` the column maps, if any
    index: Any = None

    def whole(self) -> Sizes:
        """Every sample's size as the planner takes them (an index's: converted once, by the index)."""
        if self.index is not None:
            return as_sizes(self.index)
        return Sizes(self.values, self.integral, self.columns)

    @classmethod
    def of(cls, sizes: SizesLike, n: int | None = None) -> Column:
        """The column of ``sizes``: an index is read through its memory map, anything else validated once.

        >>> Column.of([3, 1, 4]).take(np.array([2, 0])).values.tolist()
        [4.0, 3.0]
        """
        from fitbatch.index import SizeIndex

        if isinstance(sizes, SizeIndex):
            if n is not None and n != len(sizes):
                raise ValueError(f"n={n} but the size index at {sizes.path} holds {len(sizes)} sizes; leave n out")
            if not sizes._trust:  # SizeIndex.open(trust=False): its sizes checked once, in chunks
                sizes._verify()
            stats = sizes.stats
            top, average = float(stats["max"]), float(stats["sum"]) / max(len(sizes), 1)
            return cls(sizes.sizes, sizes.integral, None, sizes.digest, top, average, sizes)
        checked = as_sizes(sizes, n)
        one = checked.values.ndim == 1 and len(checked) > 0
        largest = float(checked.values.max()) if one else None
        mean = float(checked.values.mean()) if one else 0.0
        return cls(checked.values, checked.integral, checked.columns, "", largest, mean)

    def screen(self, opts: PlanOptions) -> None:
        """Under ``oversized="error"``, refuse options that the largest sample exceeds alone (before a change).

        Sizes in memory are screened sample by sample (every limit of several); an index's by its
        largest size, without reading the column (a sample's cost alone grows with its size).

        >>> Column.of([3, 9, 4]).screen(PlanOptions.build(8))
        Traceback (most recent call last):
        ...
        ValueError: 1 sample cost more than the budget 8 even alone; largest: index 1 (cost 9.0). Pass oversized='single' to give each its own batch, or oversized='skip' to leave them out (they are counted in the plan's stats).
        """
        if opts.oversized != "error":
            return
        if self.index is None:  # in memory: every sample, every limit, named as the planner names them
            from fitbatch.epoch._timeline import screen

            screen(self.whole(), opts)
            return
        if self.largest is None:
            return
        alone = float(opts.cost.sample_cost(np.array([self.largest]))[0])
        if alone > opts.budget:
            raise ValueError(
                f"the largest sample (size {self.largest:g}) costs {alone:g} even alone, more than the budget "
                f"{opts.budget:g}; pass oversized='single' or 'skip', or a larger budget"
            )

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def take(self, ids: IntArray) -> Sizes:
        """The sizes of samples ``ids``, as the planner takes them (float64)."""
        return Sizes(np.asarray(self.values[ids], dtype=np.float64), self.integral, self.columns)


def auto_window(column: Column, opts: PlanOptions, world: int) -> int:
    """Samples per window: :data:`WINDOW`, or enough for two batches per rank by the mean size.

    A batch holds at most ``budget / cost(mean size)`` samples of the mean size, so a window of
    ``2 * world * budget / cost(mean)`` samples makes about two batches per rank or more: what
    handing leftovers on needs (a window with fewer own batches than it must hand on splits its
    leftover instead). Rounded up to whole blocks.

    >>> auto_window(Column.of([100] * 10), PlanOptions.build(16384), 8), auto_window(Column.of([100] * 10), PlanOptions.build(16384), 10_000)
    (1048576, 3276800)
    """
    mean = column.mean
    if not mean > 0:
        return WINDOW
    alone = float(opts.cost.sample_cost(np.array([mean]))[0]) if column.columns is None else mean
    need = 2.0 * world * opts.budget / max(alone, 1e-300)
    return max(WINDOW, -(-int(min(need, float(1 << 40))) // BLOCK) * BLOCK)


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    """One window as arranged: its samples, its steps, and the batches it hands on.

    Attributes:
        index: the window.
        ids: the dataset index of each local sample (the samples handed in first, then the
            window's own); ``steps`` and every batch index local samples.
        sizes: the local samples' sizes.
        steps: the window's steps on every rank.
        carry: the batches handed on to the next window, as dataset indices.
        carried_in: how many batches it was handed.
        loss: the local samples' ``loss_sizes`` (``None``: none given).
    """

    index: int
    ids: IntArray | None
    sizes: Sizes
    steps: Steps
    carry: tuple[IntArray, ...]
    carried_in: int
    loss: NDArray[np.float64] | None = None


def window_seed(opts: PlanOptions, epoch: int, w: int) -> int:
    """The seed window ``w`` is planned with: a keyed stream of its own (no seed arithmetic)."""
    return int(_rng.generator(opts.seed, epoch, "window", w).integers(1 << 62))


def own_plan(column: Column, windows: Windows, w: int, opts: PlanOptions, epoch: int) -> tuple[IntArray, Sizes, BatchPlan]:
    """Window ``w``'s own samples and their plan (local indices): what a census counts."""
    ids = windows.ids(w)
    sizes = column.take(ids)
    if opts.oversized == "error":  # named by their dataset index, not their place in the window
        model = check_limits(sizes.columns, opts.cost)
        alone = model.sample_cost(sizes.values)
        describe = describer(model, sizes.values)
        screen_oversized(alone, opts.budget, "error", sizes=sizes.values, positions=ids, describe=describe)
    plan = plan_with(sizes, dataclasses.replace(opts, seed=window_seed(opts, epoch, w)), epoch, population=windows.n)
    return ids, sizes, plan


def handed_on(plan: BatchPlan, count: int, opts: PlanOptions, epoch: int, w: int) -> IntArray:
    """Which ``count`` of window ``w``'s own batches it hands on (a keyed pick, independent of what it got)."""
    return _rng.generator(opts.seed, epoch, "window-carry", w).permutation(len(plan))[:count]


def carry_count(carried: int, own: int, world: int) -> int:
    """How many own batches a window that is not the last hands on (0: it splits its leftover instead).

    >>> carry_count(3, 10, 4), carry_count(0, 2, 4), carry_count(3, 2, 8)
    (1, 2, 0)
    """
    left = (carried + own) % world
    return left if left <= own else 0


def absorbs(carried: int, own: int, last: BatchPlan | int, world: int, policy: str) -> bool:
    """Whether the window before the last takes the last window's batches and becomes the last.

    The last window splits what does not divide among the ranks (``policy="split"``); it joins
    the window before it when its own batches (``last``: its own plan, or the samples they hold
    more than batches) could not absorb that split, whatever it is handed: the window before
    then hands nothing on and arranges its batches and the last's together.

    >>> absorbs(0, 3, 0, 2, "split"), absorbs(0, 3, 1, 2, "split"), absorbs(0, 4, 0, 2, "split")
    (True, False, False)
    """
    if policy != "split" or world == 1:
        return False
    slack = last if isinstance(last, int) else last.n_samples - len(last)
    n_last = 0 if isinstance(last, int) else len(last)
    extra = -(carry_count(carried, own, world) + n_last) % world
    return slack < extra


def window_steps(
    counts: Sequence[int], world: int, policy: str, carried: int = 0, refit: int | None = None,
    last: tuple[int, int] | None = None,
) -> list[int]:
    """The steps of each window from the own batch counts of it and the windows after it (the last last).

    What :func:`build_window` arranges, without the batches: a window that is not the last runs
    ``(carried + own) // world`` steps and hands on the rest, unless it has fewer own batches
    than that rest (then it splits its leftover, like the last window under ``"split"``).
    ``refit``: the batches the ``carried`` ones handed to the first window are there (more
    when a smaller budget since plans them again, :func:`carried_batches`). ``last``: the last
    window's (own batches, own samples less own batches), for :func:`absorbs` (the last window
    joins the one before when it could not be split); ``None``: never.

    >>> window_steps([10, 10, 10], 4, "split"), window_steps([10, 10, 10], 4, "drop")
    ([2, 3, 3], [2, 3, 2])
    >>> window_steps([10, 10], 4, "split", carried=2, refit=3)  # 13 batches, 0 handed on: 4 steps
    [4, 3]
    """
    out: list[int] = []
    batches_in = carried if refit is None else refit
    for i, own in enumerate(counts):
        if i == len(counts) - 2 and last is not None and _absorbs_counts(carried, int(own), last, world, policy):
            rest = batches_in + int(own) + last[0]
            return [*out, -(-rest // world), 0]
        is_last = i == len(counts) - 1
        handed = 0 if is_last else carry_count(carried, int(own), world)
        rest = batches_in + int(own) - handed  # the window's batches, arranged into steps
        out.append(-(-rest // world) if policy == "split" else rest // world)
        carried = batches_in = handed
    return out


def _absorbs_counts(carried: int, own: int, last: tuple[int, int], world: int, policy: str) -> bool:
    if policy != "split" or world == 1:
        return False
    return last[1] < -(carry_count(carried, own, world) + last[0]) % world


def carried_batches(column: Column, carry_in: Sequence[IntArray], opts: PlanOptions, epoch: int, w: int) -> int:
    """How many batches the ``carry_in`` batches handed to window ``w`` are there under ``opts``
    (as many, unless some are over a budget lowered since: :func:`_refit` plans them again)."""
    if not carry_in:
        return 0
    handed = np.concatenate(carry_in)
    _, offsets, _ = _refit(carry_in, handed.size, column.take(handed), opts, epoch, w, log=False)
    return int(offsets.size - 1)


def build_window(
    column: Column,
    windows: Windows,
    w: int,
    opts: PlanOptions,
    *,
    world: int,
    epoch: int,
    carry_in: Sequence[IntArray],
    policy: str = "split",
    own: tuple[IntArray, Sizes, BatchPlan] | None = None,
    loss: NDArray[np.float64] | None = None,
    absorb: tuple[IntArray, Sizes, BatchPlan] | None = None,
) -> WindowPlan:
    """Window ``w`` arranged for ``world`` ranks with the batches ``carry_in`` (dataset indices) it was handed.

    ``own`` is window ``w``'s :func:`own_plan` when the caller has it already; ``loss`` the
    epoch's ``loss_sizes`` (the window's steps count those of its samples); ``absorb`` the last
    window's own plan when this window takes its batches and becomes the last (:func:`absorbs`).
    """
    ids_w, sizes_w, mine = own if own is not None else own_plan(column, windows, w, opts, epoch)
    last = w == windows.n_windows - 1
    if absorb is not None:  # the last window's own batches join this window's
        ids_n, sizes_n, theirs = absorb
        mine = _concat(mine, theirs, ids_w.size)
        ids_w = np.concatenate([ids_w, ids_n])
        sizes_w = Sizes(np.concatenate([sizes_w.values, sizes_n.values]), column.integral, column.columns)
        last = True
    handed = np.concatenate([np.zeros(0, np.int64), *carry_in])
    ids = np.concatenate([handed, ids_w])
    sizes = column.take(handed) if handed.size else None
    local = sizes_w if sizes is None else Sizes(np.concatenate([sizes.values, sizes_w.values]), column.integral, column.columns)
    nc = handed.size
    count = 0 if last else carry_count(len(carry_in), len(mine), world)
    out = handed_on(mine, count, opts, epoch, w)
    keep = np.setdiff1d(np.arange(len(mine)), out, assume_unique=True)
    kept = mine.select(keep)
    # the window's batches: those handed in (re-fitted to the options in force), then its own kept
    handed_order, handed_offsets, handed_skipped = _refit(carry_in, nc, local, opts, epoch, w)
    order = np.concatenate([handed_order, kept.order + nc])
    offsets = np.concatenate([handed_offsets, handed_offsets[-1] + np.cumsum(kept.counts)]).astype(np.int64)
    _, costs, real, padded = measure_batches(local, opts.cost, order, offsets)
    plan = mine.rebatched(order, offsets, (costs, real, padded), index_map=np.arange(nc, nc + ids_w.size))
    plan.skipped = np.concatenate([handed_skipped, plan.skipped])  # over a new budget alone, oversized="skip"
    local_loss = None if loss is None else loss[ids]
    plan.loss_sizes = local_loss
    steps = arrange(plan, local, opts.cost, world, seed=opts.seed, epoch=epoch, policy=policy, purpose=f"window-steps-{w}")
    carry = tuple(ids_w[b] for b in mine.select(out))
    return WindowPlan(w, ids, local, steps, carry, len(carry_in), local_loss)


def _concat(a: BatchPlan, b: BatchPlan, shift: int) -> BatchPlan:
    """The batches of ``a`` then those of ``b`` (whose local indices follow ``a``'s ``shift`` samples)."""
    order = np.concatenate([a.order, b.order + shift])
    offsets = np.concatenate([a.offsets, a.offsets[-1] + b.offsets[1:]]).astype(np.int64)
    per = tuple(np.concatenate([getattr(a, f), getattr(b, f)]) for f in ("costs", "real_units", "padded_units"))
    return a._derived(
        order, offsets, per,  # type: ignore[arg-type]
        skipped=np.concatenate([a.skipped, b.skipped + shift]), dropped=np.concatenate([a.dropped, b.dropped + shift]),
        lower_bound=a.lower_bound + b.lower_bound, dropped_batches=a.dropped_batches + b.dropped_batches,
    )


def _refit(
    carry_in: Sequence[IntArray], nc: int, local: Sizes, opts: PlanOptions, epoch: int, w: int, log: bool = True
) -> tuple[IntArray, IntArray, IntArray]:
    """The handed-in batches as (local order, offsets, skipped): as they came, unless one is over the budget now.

    Planned again, a sample that a smaller budget cannot hold alone is skipped under
    ``oversized="skip"`` (and counted in the window's ``skipped``).
    """
    none = np.zeros(0, np.int64)
    if not carry_in:
        return none, np.zeros(1, np.int64), none
    offsets = np.concatenate([[0], np.cumsum([b.size for b in carry_in])]).astype(np.int64)
    order = np.arange(nc, dtype=np.int64)
    _, costs, _, _ = measure_batches(local, opts.cost, order, offsets)
    over = costs > opts.budget
    if opts.oversized == "single":  # a sample over the budget alone has a batch of its own: it stays so
        over &= np.diff(offsets) > 1
    if not over.any():
        return order, offsets, none
    # a smaller budget since they were planned: their samples planned again, sorted, to fit
    sub = local.subset(order)
    again = plan_with(sub, dataclasses.replace(opts, strategy=Sorted(), seed=window_seed(opts, epoch, w)), epoch)
    if log:
        logger.info("window %d: %d handed-in batches over the budget %g planned again as %d", w, len(carry_in), opts.budget, len(again))
    return order[again.order], again.offsets, order[again.skipped]


def window_events(name: str, value: Any) -> None:
    """A check for a windowed epoch's events: each a sampler event with its ``window``.

    >>> window_events("events", [{"window": 2, "step": 3, "budget": 100.0}])
    >>> window_events("events", [{"step": 3, "budget": 100.0}])
    Traceback (most recent call last):
    ...
    ValueError: events must be a list of events {'window': int >= 0, 'step': int >= 0 (of the window), and one change}; item 0 is {'step': 3, 'budget': 100.0}, got [{'step': 3, 'budget': 100.0}]; pass what state_dict() returned, unchanged
    """
    expected = "a list of events {'window': int >= 0, 'step': int >= 0 (of the window), and one change}"
    if not isinstance(value, list):
        _refuse(name, value, expected)
    for i, event in enumerate(value):
        w = event.get(WINDOW_KEY) if isinstance(event, Mapping) else None
        ok = isinstance(w, int) and not isinstance(w, bool) and w >= 0
        if not ok or not _good_event({k: v for k, v in event.items() if k != WINDOW_KEY}):
            _refuse(name, value, f"{expected}; item {i} is {event!r}")


@dataclasses.dataclass
class Live:
    """A window as it runs: its arrangement, the step of the epoch its step 0 runs at, its timeline.

    After a resume on another world size whose rest of the window cannot be split among the new
    ranks, the rest is carried into the next window, which then runs as part of this one
    (:func:`carry_rest`).
    """

    plan: WindowPlan
    first: int
    timeline: Timeline
    last: bool
    #: windows it runs: 2 once a resume on more ranks carried a rest it could not split into the next
    span: int = 1

    @property
    def end(self) -> int:
        return self.first + self.timeline.total


def carry_rest(live: Live, column: Column, windows: Windows, step: int, world: int, opts: PlanOptions, *,
               epoch: int, policy: str, loss: NDArray[np.float64] | None) -> Live:
    """``live`` with its rest from ``step`` on (of its window, as batches) carried into the next window,
    which is arranged with it for ``world`` ranks and runs as part of ``live`` from ``step`` on.

    What a resume on more ranks does when the rest of the window cannot be split among them.
    """
    tl, plan = live.timeline, live.plan
    assert plan.ids is not None
    rest = tl.rest_plan(step, plan.sizes)
    bounds = rest.offsets.tolist()
    batches = tuple(plan.ids[rest.order[bounds[k] : bounds[k + 1]]] for k in range(len(rest)))
    w = plan.index + live.span
    nxt = build_window(column, windows, w, opts, world=world, epoch=epoch, carry_in=(*batches, *plan.carry), policy=policy, loss=loss)
    assert nxt.ids is not None
    shift = plan.ids.size
    moved = nxt.steps.plan
    per = (moved.costs, moved.real_units, moved.padded_units)
    renamed = moved.rebatched(moved.order + shift, moved.offsets, per, index_map=np.arange(shift, shift + nxt.ids.size))
    sizes = Sizes(np.concatenate([plan.sizes.values, nxt.sizes.values]), column.integral, column.columns)
    joined_loss = None if plan.loss is None or nxt.loss is None else np.concatenate([plan.loss, nxt.loss])
    renamed.loss_sizes = joined_loss
    steps = dataclasses.replace(nxt.steps, plan=renamed, grid=nxt.steps.grid)
    joined = WindowPlan(plan.index, np.concatenate([plan.ids, nxt.ids]), sizes, steps, nxt.carry, plan.carried_in, joined_loss)
    timeline = tl.then(step, steps, opts.cost, opts.budget, world_change=True)
    logger.info("window %d: the %d batches left cannot be split for %d ranks; carried into window %d", plan.index, len(rest), world, w)
    return Live(joined, live.first, timeline, w == windows.n_windows - 1, live.span + 1)


def options_at(
    begun: PlanOptions, world0: int, events: Sequence[Mapping[str, Any]], w: int, known: CostModel
) -> tuple[PlanOptions, int]:
    """The options and the world in force when window ``w`` began: the epoch's, with the events of earlier windows.

    >>> opts, world = options_at(PlanOptions.build(100), 2, [{"window": 0, "step": 3, "budget": 80.0}], 1, PlanOptions.build(100).cost)
    >>> opts.budget, world
    (80.0, 2)
    """
    opts, world = begun, world0
    for event in events:
        if event[WINDOW_KEY] >= w:
            break
        if NUM_REPLICAS_KEY in event:
            world = int(event[NUM_REPLICAS_KEY])
        else:
            opts = changed(opts, None, event, (known, opts.cost))[0]
    return opts, world


def window_of(marks: Mapping[int, tuple[int, int]], cursor: int, live: Live) -> int:
    """The first window passed (``marks``: window -> first step, batches handed in) whose steps reach ``cursor``.

    A window's end is the next one's first step; ``live`` is the window running now.
    """
    known = sorted(marks)
    for i, w in enumerate(known):
        first = marks[w][0]
        end = marks[known[i + 1]][0] if i + 1 < len(known) else live.end if w == live.plan.index else None
        if end is not None and first <= cursor <= end:
            return w
    return live.plan.index


def census(
    column: Column, windows: Windows, opts: PlanOptions, epoch: int, todo: list[int], rank: int, world: int, shared: bool
) -> list[int]:
    """The own batch counts of windows ``todo`` (what ``len()`` needs of the windows not planned yet).

    ``shared``: rank ``rank`` of ``world`` counts every ``world``-th of them and one
    ``all_reduce`` over ``torch.distributed`` sums the counts (every rank must call it together);
    else this process counts them all.

    >>> windows = Windows.keyed(10, window=4, block=2, seed=0, epoch=0, shuffle=False)
    >>> census(Column.of([3, 1, 4, 1, 5, 9, 2, 6, 5, 3]), windows, PlanOptions.build(9, cost="sum"), 0, [0, 1], 0, 1, False)
    [1, 3]
    """
    share = todo[rank::world] if shared else todo
    counts = np.zeros(len(todo), np.int64)
    for w in share:
        counts[todo.index(w)] = len(own_plan(column, windows, w, opts, epoch)[2])
    if shared:
        import torch
        import torch.distributed as dist

        t = torch.from_numpy(counts)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        counts = t.numpy()
    logger.info("epoch %d: census of %d windows (%d here)", epoch, len(todo), len(share))
    return [int(c) for c in counts]


__all__ = [
    "AUTO_ABOVE",
    "BLOCK",
    "CARRY_KEY",
    "CENSUS",
    "WINDOW",
    "Column",
    "Live",
    "WINDOW_KEY",
    "WINDOW_STEP_KEY",
    "WindowPlan",
    "Windows",
    "auto_window",
    "build_window",
    "census",
    "absorbs",
    "carry_count",
    "carry_rest",
    "handed_on",
    "options_at",
    "own_plan",
    "window_seed",
    "window_events",
    "window_of",
    "window_steps",
]
