"""Size levels fitted for a target co-batch repeat rate: wide where batches hold many samples.

The repeat rate between two epochs (:func:`fitbatch.plan.repeat_rate`) is pair-weighted, so it is
decided by the batches of the smallest sizes: a batch of ``c`` samples holds ``c (c - 1) / 2``
pairs. If samples are shuffled inside a level and cut into batches of ``c``, a pair meets again
with probability about ``c / population``, so a level adds about ``c**2 / 2`` repeated pairs,
however many batches it holds. Padding, on the other hand, costs in proportion to a level's
tokens times its relative width. Minimising padding for a given sum of ``c_k**2`` gives levels
whose batches times log-width reach ``kappa**2 * c_k**2``: wide levels for small sizes (large
``c``), levels as narrow as ``spread`` for large ones. ``kappa`` is fitted (a few secant steps
in log space) so that the predicted repeat rate meets the target.

When the epoch is shuffled, every level boundary then moves between the middles of the levels
around it, to a share that turns by the golden ratio each epoch (:func:`shift_levels`). Two
samples batched together share a level in the next epoch with probability about 0.53 instead
of 1, which halves the repeat rate at about the same padding; the fit counts that in.

An epoch of fewer than ``AUTO_MIN_BATCHES`` batches cannot afford wide levels (each one would
cost a whole batch): ``"auto"`` cuts it into levels of 0.6 of a batch (:func:`_batch_levels`),
which the moving boundaries still mix; ``Pooled`` narrows them when an epoch would spend more
than ``auto_excess`` more batches than exact sorting (one batch is 2-5 % of a few dozen), and
cuts the shuffled order at the least total cost for the same batch count
(:mod:`fitbatch.strategies._recut`; one process only).

>>> import numpy as np
>>> from fitbatch._kernels import sorting as SK
>>> from fitbatch.costs import PaddedCost
>>> sizes = np.random.default_rng(0).lognormal(4, 1, 20000).round() + 1
>>> keys, edges = SK.size_keys(sizes, True)
>>> lut, tops = fit_mixed_buckets(keys, edges, 4096.0, PaddedCost(), None, 0.02, 0.05)
>>> bool(np.all(np.diff(tops) > 0)), float(tops[-1]) == float(sizes.max())
(True, True)
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from fitbatch import _rng
from fitbatch._kernels import sorting as SK
from fitbatch.costs import CostModel
from fitbatch.strategies._base import remembered

if TYPE_CHECKING:
    from fitbatch.strategies._base import Context

FloatArray = NDArray[np.float64]

# randomness="auto": the lowest repeat rate whose levels cost AUTO_EXCESS more batches than exact
# sorting at AUTO_EXCESS_AT samples: scaled by sqrt(AUTO_EXCESS_AT / n) above (large sets mix
# anyway) and by AUTO_EXCESS_AT / n below, up to AUTO_MAX_EXCESS (a small set is seen for many
# epochs: its repeats add up), within [AUTO_LOW, AUTO_HIGH]
AUTO_EXCESS = 0.02
AUTO_EXCESS_AT = 100_000.0
AUTO_MAX_EXCESS = 0.05
AUTO_MIN_BATCHES = 64.0  # "auto" on epochs of fewer (expected) batches: levels of LEVEL_BATCHES
LEVEL_BATCHES = 0.6
AUTO_LOW = 0.005
AUTO_HIGH = 0.15
_STEPS = 8  # secant steps on kappa
# Level boundaries sit TURN further along their range (about a level) each epoch, mod 1: those
# of consecutive epochs are 0.382 or 0.618 of it apart, and a pair of one level stays together
# with probability KEEP = 1 - 2 x 0.382 x 0.618 (0.667 for independent shifts; 0.5 at best, and
# only for alternate epochs).
TURN = (math.sqrt(5.0) - 1.0) / 2.0
KEEP = 1.0 - 2.0 * TURN * (1.0 - TURN)


def check_randomness(value: Any) -> None:
    """``randomness`` is ``"auto"``, ``None`` or a number in (0, 1].

    >>> check_randomness(0.1), check_randomness("auto"), check_randomness(None)
    (None, None, None)
    """
    if value is None or (isinstance(value, str) and value == "auto"):
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"randomness must be a number in (0, 1], 'auto' or None, got {value!r}")
    if not 0.0 < float(value) <= 1.0:
        raise ValueError(
            f"randomness must be in (0, 1] (the co-batch repeat rate aimed at; lower is more random), "
            f"got {value!r}; use 'auto' to pick it from the data or None for the narrowest buckets"
        )


def _per_batch(
    tops: FloatArray, budget: float, cost: CostModel, cap: int | None, ndim: int
) -> FloatArray:
    """Samples in a full batch whose largest sample is at each of ``tops``."""
    if ndim == 1:
        per_batch = cost.max_count(tops, budget)
        if per_batch is None:
            per_batch = budget / np.maximum(cost.sample_cost(tops), 1e-300)
    else:
        per_batch = budget / np.maximum(tops, 1e-300)
    return np.clip(np.floor(per_batch), 1, cap if cap is not None else np.inf)


def mixed_levels(
    ctx: Context,
    spread: float,
    randomness: float | str,
    level_width: float = LEVEL_BATCHES,
    excess_scale: float = 1.0,
) -> tuple[NDArray[Any], FloatArray, bool]:
    """:func:`fit_mixed_buckets` over the epoch's size keys, shifted for the epoch when shuffled,
    and whether they are few-batch levels of ``level_width`` of a batch (``"auto"``, an epoch
    of fewer than :data:`AUTO_MIN_BATCHES` batches). ``excess_scale`` scales the batches
    ``"auto"`` may spend (:func:`auto_excess`, :data:`AUTO_MAX_EXCESS`)."""
    keys, edges = ctx.keys()
    settings = (
        "level fit",
        ctx.budget,
        ctx.cost,
        ctx.cap,
        spread,
        randomness,
        ctx.sizes.values.ndim,
        ctx.population,
        KEEP if ctx.shuffle else 1.0,
        level_width,
        excess_scale,
    )
    lut, tops, below = remembered(ctx, settings, lambda: _fit_levels(ctx.key_counts(), edges, *settings[1:]))
    few = below == 0.0  # only few-batch levels move upward from the level below
    if not ctx.shuffle:
        return lut, tops, few
    shift = level_shift(ctx.seed, ctx.epoch)
    # the epoch's levels: kept like the fit (they depend on it, the histogram and the shift)
    moved = remembered(
        ctx, ("level shift", *settings[1:], shift), lambda: shift_levels(keys, edges, lut, tops, shift, below, ctx.key_counts())
    )
    return (*moved, few)


def level_shift(seed: int, epoch: int) -> float:
    """Where level boundaries sit in ``epoch`` (0: the middle of the level below, 1: the middle of
    the level above): a keyed start, turned by ``TURN`` each epoch.

    >>> a, b = level_shift(0, 0), level_shift(0, 1)
    >>> 0 <= a < 1 and round((b - a) % 1.0, 6) == round(TURN, 6)
    True
    """
    return (_shift_start(seed) + epoch * TURN) % 1.0


@functools.lru_cache(maxsize=64)
def _shift_start(seed: int) -> float:
    """The keyed start of :func:`level_shift` (kept: a generator costs more than the plan's
    other per-epoch steps at 20k samples)."""
    return float(_rng.generator(seed, 0, "level-shift").random())


def shift_levels(
    keys: NDArray[np.uint16],
    edges: FloatArray,
    lut: NDArray[Any],
    tops: FloatArray,
    shift: float,
    below: float = 0.5,
    hist: NDArray[np.int64] | None = None,
) -> tuple[NDArray[Any], FloatArray]:
    """Move every level boundary to ``shift`` of the way along its range, counted in samples:
    from ``below`` of the level under it to ``1 - below`` of the level above it.

    With ``below=0.5`` (from the middle of one level to the middle of the next), each boundary
    stays where the fit put it on average, and the levels pad about as much as the fitted ones;
    levels of a fraction of a batch (few batches, :func:`_batch_levels`) mix more with ``below=0``.

    Keys move whole (a key never splits), by the count of samples below each key's middle
    (``hist``: samples per key, counted from ``keys`` when not given). Returns the new lookup
    table and each level's largest key edge (a level may end empty).

    >>> import numpy as np
    >>> keys = np.array([1, 1, 2, 2, 3, 3, 4, 4], np.uint16)
    >>> edges = np.arange(8, dtype=np.float64)
    >>> lut = np.array([0, 0, 0, 1, 1, 0, 0, 0], np.uint16)
    >>> new, tops = shift_levels(keys, edges, lut, np.array([2.0, 4.0]), 0.9)
    >>> new[[1, 2, 3, 4]].tolist(), tops.tolist()
    ([0, 0, 0, 1], [3.0, 4.0])
    >>> shift_levels(keys, edges, lut, np.array([2.0, 4.0]), 0.1)[0][[1, 2, 3, 4]].tolist()
    [0, 1, 1, 1]
    """
    if hist is None:
        hist = np.bincount(keys, minlength=lut.size)
    present = np.flatnonzero(hist)
    level = lut[present].astype(np.int64)
    if present.size < 2 or level[0] == level[-1]:
        return lut, tops
    weight = hist[present].astype(np.float64)
    middle = np.cumsum(weight) - weight / 2.0
    change = np.flatnonzero(np.diff(level))  # the last key of each level but the top one
    bounds = np.cumsum(weight)[change]
    under = np.diff(bounds, prepend=0.0)  # samples of the level under each boundary
    over = np.diff(np.append(bounds, middle[-1] + weight[-1] / 2.0))  # ... and over it
    start = bounds - below * under
    moved = np.searchsorted(start + shift * (below * under + (1.0 - below) * over), middle)
    ids = np.append(level[0], level[change + 1])
    new_level = ids[moved]
    out = lut.copy()
    out[present] = new_level.astype(lut.dtype, copy=False)
    new_tops = np.full(tops.size, -np.inf)
    np.maximum.at(new_tops, new_level, edges[present])
    return out, np.where(np.isfinite(new_tops), new_tops, tops)


def fit_mixed_buckets(
    keys: NDArray[np.uint16],
    edges: FloatArray,
    budget: float,
    cost: CostModel,
    cap: int | None,
    spread: float,
    randomness: float | str,
    ndim: int = 1,
    population: int | None = None,
    keep: float = 1.0,
) -> tuple[NDArray[Any], FloatArray]:
    """Bucket boundaries aiming at co-batch repeat rate ``randomness`` (or ``"auto"``).

    ``population``: the samples of the epoch these keys are a window of (``None``: these), which
    ``"auto"`` scales its batch excess by. ``keep``: the share of a level's pairs that share a
    level again next epoch (:data:`KEEP` when boundaries move, :func:`shift_levels`).

    Returns a lookup table key -> bucket id (0 = smallest sizes) and each bucket's upper edge,
    like :func:`fitbatch.strategies.fit_buckets`.

    >>> import numpy as np
    >>> from fitbatch._kernels import sorting as SK
    >>> from fitbatch.costs import PaddedCost
    >>> keys, edges = SK.size_keys(np.array([1.0, 2, 2, 3, 50, 60, 61]), True)
    >>> lut, tops = fit_mixed_buckets(keys, edges, 128.0, PaddedCost(), None, 0.02, 0.5)
    >>> lut[[1, 2, 3, 50, 60, 61]].tolist(), tops.tolist()
    ([0, 0, 0, 0, 0, 0], [61.0])
    """
    hist = np.bincount(keys, minlength=SK.KEY_LEVELS)
    lut, tops, _ = _fit_levels(hist, edges, budget, cost, cap, spread, randomness, ndim, population, keep)
    return lut, tops


def _fit_levels(
    hist: NDArray[np.int64],
    edges: FloatArray,
    budget: float,
    cost: CostModel,
    cap: int | None,
    spread: float,
    randomness: float | str,
    ndim: int,
    population: int | None,
    keep: float,
    level_width: float = LEVEL_BATCHES,
    excess_scale: float = 1.0,
) -> tuple[NDArray[Any], FloatArray, float]:
    """:func:`fit_mixed_buckets` from the samples per key (``hist``), and the ``below`` that
    :func:`shift_levels` moves these levels with."""
    present = np.flatnonzero(hist)[::-1]
    group = _groups(edges[present], spread)  # keys closer than spread / 8 are fitted together
    firsts = np.flatnonzero(np.diff(group, prepend=-1))
    h = np.add.reduceat(hist[present].astype(np.float64), firsts)
    tops_all = edges[present[firsts]]
    c = np.minimum(_per_batch(tops_all, budget, cost, cap, ndim), max(float(h.sum()), 1.0))
    lasts = np.append(firsts[1:], present.size) - 1
    lows = np.concatenate([[0.0], edges[:-1]])[present[lasts]]
    low_logs = np.log(np.maximum(lows, 1e-300))  # where the bucket would reach if it took the key
    narrow_batches = float(np.sum(h / c))
    if float(np.sum(h * (c - 1.0))) == 0.0:
        return (*_lut_tops(np.zeros(present.size, np.int64), [float(edges[present[0]])], present), 0.5)

    def fit(x: float) -> tuple[NDArray[np.int64], list[float], float, float]:
        bucket, tops = _fit_once(h, c, tops_all, low_logs, spread, math.exp(x))
        ct = np.minimum(
            _per_batch(np.asarray(tops), budget, cost, cap, ndim), max(float(h.sum()), 1.0)
        )
        pairs = float(np.sum(h * (ct[bucket] - 1.0))) / 2.0
        repeat = keep * float(np.sum(ct * (ct - 1.0)) / 2.0) / pairs if pairs > 0 else 0.0
        return bucket[group], tops, repeat, float(np.sum(h / ct[bucket])) / narrow_batches - 1.0

    x0 = math.log(0.05 * keep / float(np.mean(c * c)))
    if randomness == "auto" and narrow_batches < AUTO_MIN_BATCHES:
        # a handful of batches cannot afford wide levels: levels of LEVEL_BATCHES of a batch
        bucket, tops = _batch_levels(h / c, tops_all, level_width)
        return (*_lut_tops(bucket[group], tops, present), 0.0)
    if randomness != "auto":
        got = _solve(fit, x0, 2, float(randomness), -1.0)
        return (*_lut_tops(got[0], got[1], present), 0.5)
    n = float(h.sum()) if population is None else float(population)
    got = _solve(fit, x0, 3, excess_scale * auto_excess(n), +1.0)
    if got[2] < AUTO_LOW:  # more random than needed: back off to AUTO_LOW, from either side
        got = _solve(fit, x0, 2, AUTO_LOW, -1.0, strict=False)
    elif got[2] > AUTO_HIGH:
        # at least as random as AUTO_HIGH unless that costs more than AUTO_MAX_EXCESS
        high = _solve(fit, x0, 2, AUTO_HIGH, -1.0)
        most = excess_scale * AUTO_MAX_EXCESS
        got = high if high[3] <= most else _solve(fit, x0, 3, most, +1.0)
    return (*_lut_tops(got[0], got[1], present), 0.5)


def _batch_levels(
    batches: FloatArray, tops: FloatArray, width: float = LEVEL_BATCHES
) -> tuple[NDArray[np.int64], list[float]]:
    """Levels of about ``width`` of a batch each over keys from the largest down (``batches``:
    each key's share of a full batch); a last level under half of that joins the one above.

    Narrower levels pad less and repeat more: on 20,000 samples of three synthetic shapes
    (about 40 batches), levels of 0.5 / 0.6 / 0.75 of a batch gave co-batch repeat rates of
    0.50-0.56 / 0.40-0.52 / 0.40-0.47 at padding efficiency 0.909-0.966 / 0.905-0.966 /
    0.896-0.962 (``docs/plan_quality.md``).

    >>> b, t = _batch_levels(np.array([0.3, 0.3, 0.3, 0.1, 0.05]), np.array([5.0, 4, 3, 2, 1]))
    >>> b.tolist(), t
    ([0, 0, 1, 1, 1], [5.0, 3.0])
    """
    before = np.cumsum(batches) - batches
    cell = np.floor(before / width + 1e-9)
    bucket = np.cumsum(np.diff(cell, prepend=cell[0]) != 0).astype(np.int64)
    last = int(bucket[-1])
    if last > 0 and float(np.sum(batches[bucket == last])) < width / 2:
        bucket = np.minimum(bucket, last - 1)
    firsts = np.flatnonzero(np.diff(bucket, prepend=-1))
    return bucket, tops[firsts].tolist()


def auto_excess(n: float) -> float:
    """How many more batches than exact sorting ``randomness="auto"`` spends on ``n`` samples.

    >>> [round(auto_excess(n), 4) for n in (10_000, 40_000, 100_000, 400_000, 10_000_000)]
    [0.05, 0.05, 0.02, 0.01, 0.002]
    """
    n = max(n, 1.0)
    if n >= AUTO_EXCESS_AT:
        return AUTO_EXCESS * math.sqrt(AUTO_EXCESS_AT / n)
    return min(AUTO_MAX_EXCESS, AUTO_EXCESS * AUTO_EXCESS_AT / n)


def _groups(tops: FloatArray, spread: float) -> NDArray[np.int64]:
    """Group index of each key (descending): keys within ``spread / 8`` in log size share one."""
    if spread <= 0 or tops.size == 0:
        return np.arange(tops.size, dtype=np.int64)
    cell = np.floor(np.log(np.maximum(tops, 1e-300)) / (spread / 8.0))
    return np.cumsum(np.diff(cell, prepend=cell[0] + 1) != 0).astype(np.int64) - 1


def _solve(fit: Any, x: float, index: int, target: float, sign: float, strict: bool = True) -> Any:
    """Secant steps on ``x`` (log kappa**2) towards ``fit(x)[index] == target``.

    Returns the fit nearest the target (in log terms) among those at most 5 % over it (with
    ``strict``), or the nearest of all.
    """
    tried: list[tuple[bool, float, Any]] = []
    prev: tuple[float, float] | None = None
    for _ in range(_STEPS):
        got = fit(x)
        err = math.log(max(got[index], 1e-12) / target)
        over = strict and got[index] > 1.05 * target
        tried.append((over, abs(err), got))
        if abs(err) < 0.05 and not over:  # (a fit within 5 % in log terms can be 5.1 % over)
            break
        slope = sign  # repeat ~ 1 / kappa**2 while every level is at its need
        if prev is not None and prev[0] != x and prev[1] != err:
            slope = sign * min(max(sign * (err - prev[1]) / (x - prev[0]), 0.1), 4.0)
        prev = (x, err)
        x -= max(min(err / slope, 4.0), -4.0)
    return min(tried, key=lambda t: (t[0], t[1]))[2]


def _fit_once(
    h: FloatArray,
    c: FloatArray,
    tops_all: FloatArray,
    low_logs: FloatArray,
    spread: float,
    kappa2: float,
) -> tuple[NDArray[np.int64], list[float]]:
    tops: list[float] = []
    firsts: list[int] = []  # each bucket's first key
    hl, cl, tl = h.tolist(), c.tolist(), tops_all.tolist()
    batches = 0.0
    top_log = need = ct = 0.0
    widen = math.log1p(spread)
    log = math.log
    # Invariant: keys before j are assigned; the open bucket has upper edge tops[-1], holds
    # `batches` batches of `ct` samples and may close once batches x log-width reaches `need`.
    for j, low_log in enumerate(low_logs.tolist()):
        # close once wide and full enough, at a key that widens it past ``spread`` or that would
        # fit more samples per batch than the bucket's top (a count cliff: padding for nothing)
        if batches:
            width = top_log - low_log
            if (width > widen or cl[j] != ct) and batches * width >= need:
                batches = 0.0
        if batches == 0.0:
            top = tl[j]
            top_log = log(max(top, 1e-300))
            ct = cl[j]
            need = kappa2 * ct * ct
            tops.append(top)
            firsts.append(j)
        batches += hl[j] / ct
    bucket = np.repeat(np.arange(len(tops), dtype=np.int64), np.diff(firsts, append=len(hl)))
    if len(tops) > 1 and batches * (top_log - float(low_logs[-1])) < need:
        # the smallest sizes ran out before the bucket was wide and full enough: join the one above
        bucket = np.minimum(bucket, len(tops) - 2)
        tops.pop()
    return bucket, tops


def _lut_tops(
    bucket: NDArray[np.int64], tops: list[float], present: NDArray[Any]
) -> tuple[NDArray[Any], FloatArray]:
    bucket_of = np.zeros(SK.KEY_LEVELS, dtype=np.int64)
    bucket_of[present] = bucket
    n = len(tops)
    lut = (n - 1 - bucket_of).astype(np.uint16 if n <= 1 << 16 else np.int64)
    return lut, np.asarray(tops[::-1], dtype=np.float64)
