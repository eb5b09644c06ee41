"""One step's sequences into capped, cost-balanced micro-batches on every rank: :func:`partition`.

The split has two levels. Units (a sequence, or a group kept on one rank) are dealt to the ranks
balancing their weight; then each rank's units are packed into ``m`` micro-batches whose cost is
under the budget, balancing weight again (:mod:`fitbatch.steps._pack`). ``m`` starts at the
lower bound of the fullest rank and rises only for a rank whose packing fails; every rank then
packs into the same ``m`` (a rank that needs fewer gets lighter micro-batches, or empty ones). A
rank's micro-batches, heaviest first, make the micro-steps: micro-step ``j`` runs the ``j``-th
heaviest micro-batch of every rank, so the ranks of a micro-step carry similar work.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._validate import choice, format_offenders, loss_sizes, parse_budget, positive_int
from fitbatch.costs import CostModel, PaddedCost, PaddedPolynomial, SumCost, resolve_cost
from fitbatch.sizes import as_sizes
from fitbatch.sizes._coerce import MAX_EXACT
from fitbatch.steps import _compiled, _pack, _refine
from fitbatch.steps._count import round_up, settle
from fitbatch.steps._pack import Bins, IntArray, Units, as_units, pack, rows_of
from fitbatch.steps._refine import refine, step_time

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
OVERSIZED = ("error", "single", "skip")
KEEP_GROUPS = ("rank", "micro")
WeightsLike = Any  # None | array-like | Callable[[sizes], array] | CostModel


@dataclass(frozen=True, eq=False)
class Partition:
    """The micro-batches of one step on each rank, with the step's totals.

    ``p[r]`` is rank ``r``'s list of ``n_micro`` micro-batches (int64 index arrays into the
    step's sizes, ascending); micro-batch ``j`` of every rank runs in micro-step ``j``. A
    micro-batch may be empty when there are fewer units than ``world * n_micro`` (``n_empty``
    counts them): the rank then runs the step without data, or a dummy forward.

    Attributes:
        world: the number of data-parallel ranks.
        ranks: the ranks whose micro-batches this object holds (all of them, or the calling
            rank's for :func:`~fitbatch.steps.partition_local`).
        order: the held ranks' sequence indices, micro-batch after micro-batch (rank-major).
        offsets: ``len(ranks) * n_micro + 1`` bounds of the micro-batches in ``order``.
        n_micro: micro-batches per rank (the same on every rank).
        lower_bound: the fewest micro-steps any split can have under the cap (a bound).
        step_samples, step_tokens, step_loss_tokens: per micro-step, the totals over all ranks
            (``step_loss_tokens``: of ``loss_sizes``, else of the sizes), for exact loss
            normalisation without communication.
        workload: ``(world, n_micro)`` weight of each rank's micro-batch of each micro-step.
        efficiency: ideal time / time: ``sum(weights) / world`` over the sum, over micro-steps,
            of the slowest rank's weight (1.0: perfect balance).
        efficiency_bound: an upper bound on the efficiency of any split of these sequences
            under the cap, into any number of micro-steps: the units heavier than ``t`` need
            at least as many micro-batches as they fill under the cap (each sequence over half
            of it, or over the budget, one of its own), so at least that many over ``world``
            micro-steps are slower than ``t``; summed over ``t``, a least time (and never below
            ``sum(weights) / world``). Under 1 where a few heavy sequences outweigh the mean.
            For :func:`~fitbatch.steps.partition_local`, from this rank's sequences (each in a
            micro-step of its own on the rank).
        n_oversized: sequences (or groups) over the budget alone, each in a micro-batch of its own.
        skipped: indices skipped as over the budget (``oversized="skip"``).
        n_empty: empty micro-batches over all ranks.

    >>> p = partition([900, 700, 400, 300, 200, 100], 1000, world=2, loss_sizes=[800, 600, 300, 250, 150, 50])
    >>> [b.tolist() for b in p[1]], p.step_samples.tolist(), p.step_loss_tokens.tolist(), p.loss_tokens
    ([[1], [2, 5]], [2, 4], [1400.0, 750.0], 2150.0)
    """

    world: int
    ranks: tuple[int, ...]
    order: IntArray
    offsets: IntArray
    n_micro: int
    lower_bound: int
    step_samples: NDArray[np.int64]
    step_tokens: FloatArray
    step_loss_tokens: FloatArray
    workload: FloatArray
    efficiency: float
    n_oversized: int
    skipped: IntArray
    n_empty: int
    efficiency_bound: float = 1.0

    def __getitem__(self, rank: int) -> list[IntArray]:
        """Rank ``rank``'s micro-batches: views of ``order``."""
        if rank not in self.ranks:
            raise IndexError(f"rank {rank!r} is not held here: this partition holds ranks {self.ranks}")
        start = self.ranks.index(rank) * self.n_micro
        bounds = self.offsets[start : start + self.n_micro + 1].tolist()
        return [self.order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def __len__(self) -> int:
        return len(self.ranks)

    def __iter__(self) -> Iterator[list[IntArray]]:
        return (self[r] for r in self.ranks)

    @property
    def loss_tokens(self) -> float:
        """The step's loss tokens over all ranks: the denominator of a token-mean loss."""
        return float(self.step_loss_tokens.sum())

    def __repr__(self) -> str:
        return (
            f"Partition(world={self.world}, n_micro={self.n_micro}, lower_bound={self.lower_bound}, "
            f"efficiency={self.efficiency:.4f}, samples={int(self.step_samples.sum())}, "
            f"n_oversized={self.n_oversized}, skipped={self.skipped.size}, n_empty={self.n_empty})"
        )


def partition(
    sizes: Any,
    budget: float | str,
    *,
    world: int,
    weights: WeightsLike = None,
    cost: str | CostModel = "sum",
    micro_multiple: int = 1,
    min_micro: int | None = None,
    groups: Any = None,
    keep_groups: str = "rank",
    loss_sizes: Any = None,
    oversized: str = "error",
    cp_size: int | None = None,
) -> Partition:
    """Split one step's sequences into capped, balanced micro-batches on ``world`` ranks.

    Args:
        sizes: one length per sequence (1-D, e.g. tokens of each rollout).
        budget: the cap on each micro-batch's cost (a number, or ``"24GiB"`` with a byte model).
        world: data-parallel ranks.
        weights: what is balanced: ``None`` (the sizes), one number per sequence, a function of
            the sizes array (e.g. ``lambda L: 24576 * L + L**2``), or a :class:`CostModel`
            (each sequence's cost alone).
        cost: the cost model the cap applies to (``"sum"``: tokens of a packed micro-batch,
            ``"padded"``: count x longest, or a :class:`CostModel`).
        micro_multiple: the micro-batch count is a multiple of this (Megatron's virtual
            pipeline group).
        min_micro: at least this many micro-batches per rank.
        groups: one id per sequence (a GRPO prompt's responses, a DPO pair): a group's
            sequences go to one rank (``keep_groups="rank"``) or one micro-batch (``"micro"``).
        keep_groups: ``"rank"`` or ``"micro"``, where a group is kept whole.
        loss_sizes: each sequence's tokens that carry loss, for ``step_loss_tokens``.
        oversized: a sequence (a group under ``"micro"``) over the budget alone: ``"error"``,
            ``"single"`` (a micro-batch of its own, counted in ``n_oversized``) or ``"skip"``
            (left out, listed in ``skipped``).
        cp_size: context-parallel size: each counted length is rounded up to a multiple of
            ``2 * cp_size`` (what :func:`~fitbatch.steps.cp_shard` pads each document to).

    Returns:
        A :class:`Partition`. Every kept sequence is in exactly one micro-batch, every
        micro-batch (but an oversized one's) costs at most ``budget``, every rank has
        ``n_micro`` micro-batches, a multiple of ``micro_multiple`` and at least ``min_micro``.

    Raises:
        ValueError: bad sizes, budget or options (the message names the parameter), or a
            sequence over the budget with ``oversized="error"``.
        TypeError: an option of the wrong type.

    >>> p = partition([7] * 8, 8, world=2)       # the cap is a cap: no micro-batch of 14
    >>> p.n_micro, [len(b) for b in p[0]], p.efficiency
    (4, [1, 1, 1, 1], 1.0)
    >>> p = partition([500, 300, 200, 200, 100, 100], 600, world=2, weights=lambda L: 24576 * L + L**2)
    >>> [b.tolist() for b in p[0]], [b.tolist() for b in p[1]], p.step_tokens.tolist()
    ([[0], [3, 5]], [[1], [2, 4]], [800.0, 600.0])
    """
    world = world if type(world) is int and world > 0 else _int_option("world", world)
    if groups is None and cp_size is None:  # one pool: the whole partition in one compiled call where it applies
        done = _pooled(sizes, budget, world, weights, cost, micro_multiple, min_micro, keep_groups, loss_sizes, oversized)
        if isinstance(done, Partition):
            return done
        if done is not None:  # the weights it took: a function of the sizes is called once
            weights = done
    plan = _Plan.build(sizes, budget, weights, cost, micro_multiple, min_micro, groups, keep_groups,
                       loss_sizes, oversized, cp_size)
    ranks = tuple(range(world))
    if plan.keep_groups_on_rank and world > 1:  # groups that may span micro-batches: ranks first
        rank_of_group = plan.split_ranks(world)
        order, alone, bound = plan.micro_rows(rank_of_group, world)
        m, bins = _balanced(plan, order, alone, int(bound.max()), rank_of_group[plan.group], world, pooled=False)
        return plan.result(*by_rank(bins, m, rank_of_group[plan.group[plan.kept]], plan.unit_of[plan.kept]), m, ranks, world, gather=None)
    # else one pool of world * m bins, dealt to the micro-steps heaviest first, `world` at a time
    order, alone, bound = plan.micro_rows(np.zeros(plan.group.size, dtype=np.int64), 1)
    m, bins = _balanced(plan, order, alone, -(-int(bound[0]) // world), np.zeros(plan.units.weight.size, dtype=np.int64),
                        world, pooled=True)
    module = _compiled.kernels()
    if module is not None:  # by_step and the result's sums compiled: the same values
        order, offsets, samples, tokens, loss_tokens, workload, n_empty = module.lay_out_pool(
            bins.load[0], bins.bin_of, plan.unit_of, plan.kept, m, world, plan.sizes, np.ascontiguousarray(plan.loss))
        return plan.finish(order, offsets, samples, tokens, loss_tokens, workload, int(n_empty), m, ranks, world,
                              per_step=world)
    return plan.result(*by_step(bins, m, world, plan.unit_of[plan.kept]), m, ranks, world, gather=None)


#: the built-in cost models by name (frozen: one instance each will do)
_MODELS: dict[str, CostModel] = {}


def _pooled(sizes: Any, budget: Any, world: int, weights: WeightsLike, cost: Any, micro_multiple: Any, min_micro: Any,
            keep_groups: Any, loss: Any, oversized: Any) -> Partition | FloatArray | None:
    """:func:`partition` of a step without groups or ``cp_size``, by one compiled call
    (:func:`fitbatch._kernels.steps.partition_pool`: the calls the general form makes, on the
    same values, so the same partition), or ``None`` where it does not apply (not loaded, a
    cost model of its own, a unit over the budget alone, weights that are not whole numbers,
    a packing that needs more micro-batches than the bound, bad input): the general form then
    runs (and raises what is bad), given the weights taken here if any (a function is called once).

    The checks here are the cheap ones (types, options); the compiled call checks the values
    (sizes and weights whole or finite, >= 0, below ``2**53``) and declines what it does not take."""
    module = _compiled.kernels()
    if module is None:
        return None
    try:
        values = _plain_sizes(sizes)
        if values is None:
            return None
        model = _MODELS.get(cost) if type(cost) is str else cost
        if model is None:
            model = _MODELS.setdefault(cost, resolve_cost(cost))
        kind = _compiled.cost_kind(model)
        if kind is None:
            return None
        step = micro_multiple if type(micro_multiple) is int and micro_multiple > 0 else _int_option(
            "micro_multiple", micro_multiple)
        floor = 0 if min_micro is None else _int_option("min_micro", min_micro)
        cap = float(budget) if type(budget) in _NUMBER and 0 < budget < math.inf else parse_budget(budget)
        if keep_groups not in KEEP_GROUPS or type(keep_groups) is not str:
            choice("keep_groups", keep_groups, KEEP_GROUPS)
        if oversized not in OVERSIZED or type(oversized) is not str:
            choice("oversized", oversized, OVERSIZED)
        loss_values = values if loss is None else np.ascontiguousarray(loss_sizes(loss, values.size))
    except (TypeError, ValueError):
        return None
    try:  # sizes not checked yet: whatever goes wrong, the general form says what (sizes first)
        weight = _taken(weights, values)
    except Exception:  # noqa: BLE001 - the general form checks the sizes, then calls the weights again
        return None
    status, m, ints, floats, n_empty, lower, efficiency, bound = module.partition_pool(
        values, weight, loss_values, cap, kind[0], kind[1], bool(model.uses_max), step, floor,
        world, _pack.EXACT_ROUNDS, _refine._CONSTS, _tune())
    if status:
        return weight if weight is not values else None
    m = int(m)
    at = ints.size - m - (world * m + 1)  # order, offsets, samples one after the other
    ranks = _RANKS.get(world)
    if ranks is None:
        ranks = _RANKS.setdefault(world, tuple(range(world)))
    out = _new(Partition)  # the fields set at once (a frozen dataclass's __init__ sets each through object's)
    out.__dict__.update(world=world, ranks=ranks, order=ints[:at], offsets=ints[at:-m], n_micro=m,
                        lower_bound=int(lower), step_samples=ints[-m:], step_tokens=floats[:m],
                        step_loss_tokens=floats[m:2 * m], workload=floats[2 * m:].reshape(world, m),
                        efficiency=float(efficiency), efficiency_bound=float(bound), n_oversized=0,
                        skipped=_NONE_SKIPPED, n_empty=int(n_empty))
    return out


_NUMBER = (int, float)
_new = object.__new__
#: ``tuple(range(world))`` by world (a tuple is immutable: one will do)
_RANKS: dict[int, tuple[int, ...]] = {}
#: the ``skipped`` of a partition that skipped none (read-only: one will do)
_NONE_SKIPPED = np.zeros(0, dtype=np.int64)
_NONE_SKIPPED.flags.writeable = False


def _taken(weights: WeightsLike, sizes: FloatArray) -> FloatArray:
    """``weights`` as one float64 per sequence, unchecked (the compiled call checks them:
    whole numbers >= 0, or the general form runs and :func:`_weights` says what is wrong)."""
    if weights is None:
        return sizes
    arr = np.ascontiguousarray(_evaluated(weights, sizes), dtype=np.float64)
    if arr.shape != sizes.shape:
        raise ValueError("weights")  # the general form says it
    return arr


def _evaluated(weights: WeightsLike, sizes: FloatArray) -> Any:
    """``weights`` on these sizes as given (a model's or a function's values, or the numbers), not
    yet checked; ``TypeError`` for text."""
    if isinstance(weights, CostModel):
        return weights.sample_cost(sizes)
    if callable(weights):
        return weights(sizes.copy())
    if isinstance(weights, (str, bytes)):
        raise TypeError(f"weights must be numbers, a function of the sizes or a CostModel, got {weights!r}")
    return weights


def _plain_sizes(sizes: Any) -> FloatArray | None:
    """1-D sizes as float64, or ``None`` (2-D sizes). A numpy array of int64, int32 or float64
    is taken as it is, unchecked: the compiled call declines a size that is not in
    ``[0, 2**53)`` (NaN included) and the general form then checks it as
    :func:`~fitbatch.sizes.as_sizes` does; other sizes are checked here by it."""
    if type(sizes) is np.ndarray and sizes.ndim == 1 and sizes.dtype in _PLAIN:
        if sizes.dtype == np.float64:
            return np.ascontiguousarray(sizes)
        return sizes.astype(np.float64)
    values = as_sizes(sizes).values
    return values if values.ndim == 1 else None


_PLAIN = (np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.int32))


#: the packing into the fewest micro-batches is tried when the forced count's step is this much
#: slower than its mean (a spread of the work; below it, the other packing cannot gain more)
SPREAD = 1e-3
#: one more micro-step is tried when the refined step is still this much slower than its mean
#: and its micro-batches are on average this full of the budget (below, there is room to balance)
MORE = 5e-5
FULL = 0.98


def _balanced(plan: _Plan, order: IntArray, alone: IntArray, bound: int, row_of_unit: IntArray, world: int, *,
              pooled: bool) -> tuple[int, Bins]:
    """The micro-batch count and the refined bins (``pooled``: one row of ``world * m``).

    Where ``micro_multiple`` or ``min_micro`` raise the count above what the cap needs, the
    packing into the fewest micro-batches, padded with empty ones, is the start if its step
    runs faster (spreading the same work over more micro-steps adds the slowest rank's share
    of each); the refinement may then move work into the empty ones. A step already as fast as
    any split of its units can run (:meth:`_Plan.least_time`) is not refined.
    """
    width = world if pooled else 1
    exact = plan.units.whole  # every load a whole number below 2**52: step times summed in any order
    least = plan.least_time(world)  # no split of these units runs faster: at it, nothing to gain
    forced = round_up(max(bound, plan.floor), plan.step) > max(bound, 1) and (plan.step > 1 or plan.floor > 0)
    early: tuple[int, Bins] | None = None
    if forced and least * world > _placed_weight(plan, order, alone) * (1 + SPREAD):
        # a few heavy units set the least time: any packing is slow, so the fewest micro-batches
        # are packed first; padded to the forced count, at the least time, nothing can beat them
        early = settle(order, alone, plan.units, bound, dataclasses.replace(plan, step=1, floor=0), agree=None,
                       width=width)
        target = round_up(max(bound, plan.floor), plan.step)
        if early[0] < target:
            padded = early[1].padded(target * width)
            if step_time(padded.load, pooled, world, exact) <= least:
                return target, padded
    m, bins = settle(order, alone, plan.units, bound, plan, agree=None, width=width)
    padded_start = False
    first = step_time(bins.load, pooled, world, exact) if m else 0.0
    slow = first * world > bins.load.sum() * (1 + SPREAD) if m else False
    if slow and first > least and m > max(bound, 1) and (plan.step > 1 or plan.floor > 0):
        fewest, fewer = early if early is not None else settle(
            order, alone, plan.units, bound, dataclasses.replace(plan, step=1, floor=0), agree=None, width=width)
        if fewest < m:
            fewer = fewer.padded(m * width)
            if step_time(fewer.load, pooled, world, exact) < first:
                bins, padded_start = fewer, True
    top = round_up(max(bound, plan.floor, 1), plan.step)

    def spread_and_full(t: float) -> bool:  # one more micro-step is tried at a step time t of `bins`
        return bool(m and t > least and t > bins.load.sum() / world * (1 + MORE) and m <= top
                    and _fill(bins, plan) >= FULL)

    def wider_bins() -> Bins | None:  # packed into one more micro-step (refined); None: it did not fit
        more = m + plan.step
        got, wider = settle(order, alone, plan.units, more, dataclasses.replace(plan, floor=more), agree=None,
                            width=width)
        if got != more:
            return None
        if step_time(wider.load, pooled, world, exact) > least:
            wider = refine(wider, row_of_unit, plan.units, plan.budget, plan.model, pooled=pooled, world=world)
        return wider

    tried, wider = False, None
    if not padded_start and spread_and_full(first):
        # already spread and full to the cap as packed: one more micro-step first; one within MORE
        # of its mean is kept without refining this count (its refinement could gain at most that)
        tried, wider = True, wider_bins()
        if wider is not None and step_time(wider.load, pooled, world, exact) <= bins.load.sum() / world * (1 + MORE):
            return m + plan.step, wider
    if step_time(bins.load, pooled, world, exact) > least:
        # a padded start is refined without balance passes: they pair its loaded bins with the
        # empty ones, splitting each over two micro-steps (slower, and undone: a pass for nothing)
        bins = refine(bins, row_of_unit, plan.units, plan.budget, plan.model, pooled=pooled, world=world,
                      balance=not padded_start)
    now = step_time(bins.load, pooled, world, exact)
    if spread_and_full(now):
        # still spread after refining at the least count, micro-batches full to the cap: no room
        # to even out; one more micro-step (``micro_multiple`` more) is kept if it runs faster
        if not tried:
            wider = wider_bins()
        if wider is not None and step_time(wider.load, pooled, world, exact) < now:
            return m + plan.step, wider
    return m, bins


def _placed_weight(plan: _Plan, order: IntArray, alone: IntArray) -> float:
    """The total weight of the units dealt (``order``) or alone in a bin (``alone``)."""
    w = plan.units.weight
    return float(w[order[order >= 0]].sum() + w[alone[alone >= 0]].sum())


def _tune() -> FloatArray:
    """The compiled whole partition's constants (:func:`fitbatch._kernels.steps.partition_pool`),
    read at each call as the numpy form reads them."""
    return np.array([SPREAD, MORE, FULL, _refine.CLOSE, _refine.PASSES, _refine.PASSES_SMALL, _refine.UNITS_PER_PASS,
                     _refine.BALANCED_UP_TO, _compiled.EXACT_BELOW, float(MAX_EXACT)], dtype=np.float64)


def _fill(bins: Bins, plan: _Plan) -> float:
    """How full of the budget the step's micro-batches are, on average (their costs over the budget)."""
    cost = plan.model.evaluate(bins.count.ravel(), bins.longest.ravel(), bins.total.ravel())
    return float(np.minimum(cost, plan.budget).sum() / (cost.size * plan.budget)) if cost.size and plan.budget > 0 else 0.0



# --------------------------------------------------------------------------- the plan of a step


@dataclass
class _Plan:
    """A step's validated inputs, and the units its micro-batches are packed from."""

    sizes: FloatArray  # the real lengths (totals)
    counted: FloatArray  # the lengths the cost counts (CP-rounded)
    weight: FloatArray
    model: CostModel
    budget: float
    step: int
    floor: int
    group: IntArray  # group code of each sequence (its own index without groups)
    keep_micro: bool
    loss: FloatArray
    oversized: str
    kept: NDArray[np.bool_]  # sequences not skipped
    units: Units = None  # type: ignore[assignment]
    unit_of: IntArray = None  # type: ignore[assignment]  # unit of each sequence
    big: NDArray[np.bool_] = None  # type: ignore[assignment]  # units over the budget alone
    any_big: bool = False
    all_kept: bool = True  # no sequence skipped
    grouped: bool = False  # groups were given
    heaviest: IntArray | None = None  # every unit, heaviest first (ties by id), once micro_rows found it
    _least: dict[int, float] = dataclasses.field(default_factory=dict)  # least_time by micro-batches a micro-step

    @cached_property
    def fixed(self) -> float:
        """The model's cost of an empty batch (what each bin pays before any unit)."""
        return float(self.model.evaluate(np.zeros(1), np.zeros(1), np.zeros(1))[0])

    @cached_property
    def _extra_all(self) -> FloatArray | None:
        """Each unit's cost alone over the empty batch's, for the built-in models (one
        element-wise expression: the same values as on any subset); ``None`` for another."""
        if type(self.model) not in (SumCost, PaddedCost, PaddedPolynomial):
            return None
        return self._marginal(slice(None))

    @cached_property
    def _extra_exact(self) -> bool:
        """Whether the units' marginal costs are whole numbers whose total is below ``2**52``
        (every running sum of them exact in any order), for the built-in models."""
        every = self._extra_all
        return every is not None and _compiled.whole(every)

    def _extra(self, ids: IntArray | None) -> FloatArray:
        """The units ``ids``' (``None``: all, in order) costs alone over the empty batch's (>= 0)."""
        every = self._extra_all
        if every is not None:
            return every if ids is None else every[ids]
        return self._marginal(slice(None) if ids is None else ids)

    def _marginal(self, at: IntArray | slice) -> FloatArray:
        """The model's cost of each unit ``at`` alone over the empty batch's (>= 0)."""
        u = self.units
        return np.maximum(self.model.evaluate(u.count[at], u.longest[at], u.total[at]) - self.fixed, 0.0)

    @classmethod
    def build(cls, sizes: Any, budget: Any, weights: WeightsLike, cost: Any, micro_multiple: Any,
              min_micro: Any, groups: Any, keep_groups: str, loss: Any, oversized: str, cp_size: Any) -> _Plan:
        values = as_sizes(sizes).values
        if values.ndim != 1:
            raise ValueError(f"sizes must be 1-D (one length per sequence), got shape {values.shape}")
        n = values.size
        counted = values
        if cp_size is not None:
            unit = 2 * _int_option("cp_size", cp_size)
            counted = np.ceil(values / unit) * unit
        plan = cls(
            sizes=values,
            counted=counted,
            weight=_weights(weights, counted),
            model=resolve_cost(cost),
            budget=parse_budget(budget),
            step=_int_option("micro_multiple", micro_multiple),
            floor=0 if min_micro is None else _int_option("min_micro", min_micro),
            group=_groups(groups, n),
            keep_micro=choice("keep_groups", keep_groups, KEEP_GROUPS) == "micro",
            loss=values if loss is None else loss_sizes(loss, n),  # type: ignore[arg-type]
            oversized=choice("oversized", oversized, OVERSIZED),
            kept=np.ones(n, dtype=bool),
            grouped=groups is not None,
        )
        plan._make_units()
        return plan

    def _make_units(self) -> None:
        """Units (groups under ``keep_groups="micro"``, else sequences), over-budget ones found."""
        n = self.sizes.size
        count: NDArray[Any]
        total: NDArray[Any]
        longest: NDArray[Any]
        weight: NDArray[Any]
        if self.keep_micro:
            code = self.group
            k = int(code.max()) + 1 if n else 0
            count = np.bincount(code, minlength=k).astype(np.float64)
            total = np.bincount(code, self.counted, minlength=k)
            longest = np.zeros(k)
            np.maximum.at(longest, code, self.counted)
            weight = np.bincount(code, self.weight, minlength=k)
        else:  # a unit per sequence: the sums over one sequence are its own values (sizes >= 0)
            code, k = np.arange(n, dtype=np.int64), n
            count, total, longest, weight = np.ones(n), self.counted, self.counted, self.weight
        alone = self.model.evaluate(count, longest, total) if k else np.zeros(0)
        big = alone > self.budget
        self.any_big = bool(big.any())
        if self.any_big:
            what = "group" if self.keep_micro else "sequence"
            bad = np.flatnonzero(big)
            if self.oversized == "error":
                raise ValueError(
                    f"{bad.size} {what}{'s' if bad.size > 1 else ''} cost more than budget={self.budget:g} alone "
                    f"({format_offenders(bad, alone[bad])}); raise the budget, or pass oversized='single' "
                    f"(a micro-batch each) or oversized='skip' (left out, listed in Partition.skipped)"
                )
            logger.warning("%d %s(s) over budget=%g alone: oversized=%r", bad.size, what, self.budget, self.oversized)
            if self.oversized == "skip":
                self.kept = ~big[code]
                big = np.zeros_like(big)
                self.any_big = False  # left out: none over the budget among the kept
        self.unit_of = code
        self.units = as_units(weight, count, longest, total)
        self.big = big
        self.all_kept = bool(self.kept.all())

    def split_ranks(self, world: int) -> IntArray:
        """The rank of each group: groups dealt to ``world`` ranks balancing weight (no cap)."""
        k = int(self.group.max()) + 1 if self.group.size else 0
        w = np.bincount(self.group[self.kept], self.weight[self.kept], minlength=k).astype(np.float64)
        present = np.bincount(self.group[self.kept], minlength=k) > 0
        ids = np.flatnonzero(present)
        order = rows_of(np.zeros(ids.size, dtype=np.int64), w[ids], 1)
        groups = as_units(w[ids], np.ones(ids.size), np.zeros(ids.size), np.zeros(ids.size))
        bins = pack(order, groups, world, math.inf, None)
        rank = np.full(k, -1, dtype=np.int64)
        rank[ids] = bins.bin_of
        return rank

    def micro_rows(self, rank_of_group: IntArray, rows: int) -> tuple[IntArray, IntArray, NDArray[np.int64]]:
        """Each row's units to deal (heaviest first), its oversized units, its lower bound."""
        if rows == 1 and self.all_kept and not self.any_big and not self.keep_micro:
            # the pool of every sequence, none over the budget: what the general form gives
            order = rows_of(rank_of_group, self.units.weight, 1)
            self.heaviest = order[0]
            return order, np.full((1, 0), -1, dtype=np.int64), np.array([self._bound(order[0])], dtype=np.int64)
        seq = np.flatnonzero(self.kept)
        k = self.units.weight.size
        row = np.full(k, -1, dtype=np.int64)
        row[self.unit_of[seq]] = rank_of_group[self.group[seq]]
        live = row >= 0
        normal, big = live & ~self.big, live & self.big
        order = rows_of(row[normal], self.units.weight[normal], rows)
        order = np.where(order >= 0, np.flatnonzero(normal)[np.maximum(order, 0)], -1)
        alone = rows_of(row[big], self.units.weight[big], rows)
        alone = np.where(alone >= 0, np.flatnonzero(big)[np.maximum(alone, 0)], -1)
        bound = np.array([self._bound(order[r][order[r] >= 0]) for r in range(rows)], dtype=np.int64)
        bound += (alone >= 0).sum(axis=1)
        return order, alone, bound

    def _bound(self, ids: IntArray | None) -> int:
        """Fewest bins the units ``ids`` (``None``: all) fit: their marginal costs over the usable
        budget, and the units over half of it (no two share a bin); 1 for a model known only monotone."""
        if (self.big.size if ids is None else ids.size) == 0:
            return 0
        if not self.model.superadditive:
            return 1
        extra = self._extra(ids)
        room = self.budget - self.fixed
        if room <= 0:
            return int(extra.size)
        by_sum = math.ceil(float(extra.sum()) / room * (1 - 1e-12))
        return max(1, by_sum, int((extra > room / 2).sum()))

    @property
    def keep_groups_on_rank(self) -> bool:
        return self.grouped and not self.keep_micro and self.group.size > 0 and int(self.group.max()) + 1 < self.group.size

    def result(self, row: IntArray, micro: IntArray, workload: FloatArray, m: int, ranks: tuple[int, ...],
               world: int, gather: Callable[[FloatArray], FloatArray] | None) -> Partition:
        """The partition, from the row (index into ``ranks``) and micro-step of each kept
        sequence and the ``(rows, m)`` workloads; ``gather`` shares them with the other ranks."""
        rows = len(ranks)
        key = row * m + micro
        if self.all_kept:  # the kept sequences are all of them: no gathers
            order = _compiled.argsort(key)  # ascending indices within a micro-batch
            sizes, loss = self.sizes, self.loss
        else:
            seq = np.flatnonzero(self.kept)
            order = seq[_compiled.argsort(key)]
            sizes, loss = self.sizes[seq], self.loss[seq]
        n_sizes = np.bincount(key, minlength=rows * m)
        offsets = np.zeros(rows * m + 1, dtype=np.int64)
        np.cumsum(n_sizes, out=offsets[1:])
        local = np.stack([
            n_sizes.reshape(rows, m).sum(axis=0).astype(np.float64),  # the micro-steps' counts
            np.bincount(micro, sizes, minlength=m),
            np.bincount(micro, loss, minlength=m),
        ])
        if gather is not None:  # the other ranks' totals and workloads
            shared = gather(np.vstack([local, workload]))  # (world, 4, m)
            local, workload = shared[:, :3].sum(axis=0), shared[:, 3]
            n_empty = int((shared[:, 0] == 0).sum())
        else:
            n_empty = int((n_sizes == 0).sum())
        return self.finish(order, offsets, local[0].astype(np.int64), local[1], local[2], workload, n_empty, m,
                              ranks, world, per_step=world if gather is None else 1)

    def finish(self, order: IntArray, offsets: IntArray, samples: NDArray[np.int64], tokens: FloatArray,
                  loss_tokens: FloatArray, workload: FloatArray, n_empty: int, m: int, ranks: tuple[int, ...],
                  world: int, per_step: int) -> Partition:
        """The :class:`Partition` of the laid-out micro-batches, with the step's bounds and
        efficiency (``per_step`` micro-batches a micro-step for the efficiency bound)."""
        slowest = workload.max(axis=0).sum() if m else 0.0
        total = workload.sum()
        n_big = int((np.bincount(self.unit_of[self.kept], minlength=self.big.size) > 0)[self.big].sum()) if self.any_big else 0
        return Partition(
            world=world,
            ranks=ranks,
            order=order,
            offsets=offsets,
            n_micro=m,
            lower_bound=self._step_bound(world),
            step_samples=samples,
            step_tokens=tokens,
            step_loss_tokens=loss_tokens,
            workload=workload,
            efficiency=float(total / world / slowest) if slowest > 0 else 1.0,
            efficiency_bound=self._efficiency_bound(per_step, float(total) / world),
            n_oversized=n_big,
            skipped=np.zeros(0, dtype=np.int64) if self.all_kept else np.flatnonzero(~self.kept),
            n_empty=n_empty,
        )

    def _efficiency_bound(self, per_step: int, mean: float) -> float:
        """The best efficiency any split can reach (see :class:`Partition`), where ``per_step``
        micro-batches run in a micro-step and ``mean`` is the ideal time."""
        least = self.least_time(per_step)
        return mean / max(least, mean) if mean > 0 else 1.0

    def least_time(self, per_step: int) -> float:
        """A lower bound on the time of any split of the kept units, where ``per_step``
        micro-batches run in a micro-step (the efficiency bound's least time, before it is
        raised to the mean)."""
        if per_step not in self._least:
            self._least[per_step] = self._least_time(per_step)
        return self._least[per_step]

    def _least_time(self, per_step: int) -> float:
        if self.all_kept and self.heaviest is not None and self._extra_exact:
            # a tie adds nothing until its last unit, whose running sums are over the same units
            # in any order: exact (whole numbers) for whole marginal costs, so any tie order will do
            ids = self.heaviest
            w = self.units.weight[ids]
        elif self.all_kept:  # every unit holds a kept sequence
            w = self.units.weight
            ids = np.argsort(-w)  # ties in any order: a tie adds nothing until its last unit
            w = w[ids]
        else:
            live = np.flatnonzero(np.bincount(self.unit_of[self.kept], minlength=self.big.size))
            w = self.units.weight[live]
            heavy = np.argsort(-w)  # ties in any order: a tie adds nothing until its last unit
            ids, w = live[heavy], w[heavy]
        big = self.big[ids] if self.any_big else np.zeros(ids.size, dtype=bool)
        module = _compiled.kernels()
        if module is not None:  # the running sums compiled, in the same order
            room = self.budget - self.fixed
            extra = self._extra(ids) if self.model.superadditive else w
            terms = module.bound_terms(w, extra, big, self.any_big, bool(self.model.superadditive), room, per_step)
            return float(terms.sum())
        normal = np.cumsum(~big) if self.any_big else np.arange(1, ids.size + 1)
        if self.model.superadditive:  # the prefix's bins, as _bound counts them
            room = self.budget - self.fixed
            extra = self._extra(ids)
            if self.any_big:
                extra = np.where(big, 0.0, extra)
            if room > 0:
                need = np.maximum(np.ceil(np.cumsum(extra) / room * (1 - 1e-12)), np.cumsum(extra > room / 2))
            else:
                need = normal.astype(np.float64)
        else:
            need = np.zeros(w.size)
        bins = (np.cumsum(big) + np.maximum(need, normal > 0)) if self.any_big else np.maximum(need, 1.0)
        steps = np.ceil(bins / per_step)
        return float(((w - np.r_[w[1:], 0.0]) * steps).sum())

    def _step_bound(self, world: int) -> int:
        """A lower bound on the micro-steps of any split of the kept units on ``world`` ranks."""
        if self.all_kept and not self.any_big:  # every unit, none over the budget
            need = self._bound(None)
        else:
            live = np.flatnonzero(np.bincount(self.unit_of[self.kept], minlength=self.big.size))
            n_big = int(self.big[live].sum())
            need = n_big + self._bound(live[~self.big[live]])
        m = max(-(-need // world), self.floor)
        return round_up(m, self.step)


# --------------------------------------------------------------------------- micro-steps from bins


def by_rank(bins: Bins, m: int, row: IntArray, unit: IntArray) -> tuple[IntArray, IntArray, FloatArray]:
    """Each row's ``m`` bins as its micro-batches, heaviest first: the row and micro-step of
    each kept sequence (given its row and unit), and the ``(rows, m)`` workloads."""
    heaviest = np.argsort(-bins.load, axis=1, kind="stable")
    step_of_bin = np.empty_like(heaviest)
    np.put_along_axis(step_of_bin, heaviest, np.arange(m)[None, :], axis=1)
    return row, step_of_bin[row, bins.bin_of[unit]], np.take_along_axis(bins.load, heaviest, axis=1)


def by_step(bins: Bins, m: int, world: int, unit: IntArray) -> tuple[IntArray, IntArray, FloatArray]:
    """One row of ``world * m`` bins laid out as micro-steps: the heaviest ``world`` bins make
    micro-step 0, the next ``world`` micro-step 1, ..., dealt to the ranks in snake order."""
    heaviest = np.argsort(-bins.load[0], kind="stable")
    pos = np.empty_like(heaviest)
    pos[heaviest] = np.arange(heaviest.size)
    step, lane = pos // world, pos % world
    rank = np.where(step % 2 == 0, lane, world - 1 - lane)
    workload = np.zeros((world, m))
    workload[rank, step] = bins.load[0]
    b = bins.bin_of[unit]
    return rank[b], step[b], workload


# --------------------------------------------------------------------------- option checks


def _int_option(name: str, value: Any) -> int:
    out = positive_int(name, value)
    assert out is not None
    return out


def _weights(weights: WeightsLike, sizes: FloatArray) -> FloatArray:
    """``weights`` as one finite number >= 0 per sequence."""
    if weights is None:  # the sizes: checked finite and >= 0 already
        return sizes
    out = _evaluated(weights, sizes)
    try:
        arr = np.asarray(out, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"weights must give one number per sequence, got {type(out).__name__}") from None
    if arr.shape != sizes.shape:
        raise ValueError(f"weights must have one entry per sequence: shape {sizes.shape}, got shape {arr.shape}")
    if arr.size and not (arr.min() >= 0 and arr.max() < np.inf):  # NaN fails the first
        bad = np.flatnonzero(~(np.isfinite(arr) & (arr >= 0)))
        raise ValueError(f"weights must be finite and >= 0; {bad.size} bad: {format_offenders(bad, arr[bad])}")
    return np.ascontiguousarray(arr)


def _groups(groups: Any, n: int) -> IntArray:
    """A dense code (0..k-1, in order of first appearance) per sequence."""
    if groups is None:
        return np.arange(n, dtype=np.int64)
    ids = np.asarray(groups)
    if ids.ndim != 1 or ids.size != n:
        raise ValueError(f"groups must hold one id per sequence: {n} (the length of sizes), got shape {ids.shape}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, first, code = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[code.ravel()]
