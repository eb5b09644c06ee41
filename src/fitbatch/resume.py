"""Resuming: the state schema every stateful object checks, and the timeline of an epoch that changed.

The contract, for every object with ``state_dict()``/``load_state_dict()`` (the samplers, the
stream, ``equal_steps``, the accumulator, ``OOMGuard``, the compat optimizers):

* ``state_dict()`` is a plain JSON-able dict with a ``version`` key, built by the object's
  :class:`StateSchema` (:meth:`StateSchema.envelope`); a composed object nests its parts'
  states under named keys.
* ``load_state_dict(state)`` first runs :meth:`StateSchema.check`: ``state`` must be a mapping
  of this version, with no unknown key, no missing key, and every value of the type and range
  its schema declares, else a ``ValueError`` names the object, the key, the value and what to
  pass instead. It never mutates ``state`` and sets no "just restored" flag: the object
  re-plans from (seed, epoch, options) and jumps to the saved cursor in O(1), with no replay of
  what was consumed.
* An epoch whose budget, cost model or world size changed part-way is a :class:`Timeline`: the
  epoch's first arrangement, then one arrangement per change, each holding the samples its
  predecessor had not run yet. A sampler saves the changes as *events* and rebuilds the same
  timeline on resume, so every sample of the epoch still runs exactly once.

>>> COUNTER = StateSchema("counter", version=1, required={"count": integer()})
>>> state = COUNTER.envelope(count=3)
>>> state
{'version': 1, 'count': 3}
>>> COUNTER.check({**state, "count": -1})
Traceback (most recent call last):
...
ValueError: counter state key 'count' must be an int >= 0, got -1; pass what state_dict() returned, unchanged
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.costs import CostModel
from fitbatch.distributed import Steps, straggler_ratio
from fitbatch.plan import BatchPlan, lower_bound
from fitbatch.sizes import Sizes

#: keys that more than one kind of state uses (as torchdata names its ``*_KEY`` constants)
VERSION_KEY = "version"
EPOCH_KEY = "epoch"
STEP_KEY = "step"  # steps of the epoch consumed
MICRO_KEY = "micro"  # micro-batches of the epoch consumed
STEPS_KEY = "steps"  # optimizer steps taken
NUM_REPLICAS_KEY = "num_replicas"
N_SAMPLES_KEY = "n_samples"
SIZES_DIGEST_KEY = "sizes_digest"  # sizes_digest() of the samples
CONFIG_KEY = "config"
OPTIONS_KEY = "options"
EVENTS_KEY = "events"
BUDGET_KEY = "budget"
COST_KEY = "cost"

#: a value check: ``None`` when the value is fine, else what it must be (``"an int >= 0"``)
Check = Callable[[Any], "str | None"]

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


# ---------------------------------------------------------------------- value checks


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(low: int = 0) -> Check:
    """A check for an int ``>= low`` (bools refused).

    >>> integer(1)(0), integer(1)(2)
    ('an int >= 1', None)
    """
    return lambda value: None if _is_int(value) and value >= low else f"an int >= {low}"


def positive_number(value: Any) -> str | None:
    """A check for a positive finite number (a budget).

    >>> positive_number(0.5), positive_number(float("inf"))
    (None, 'a positive finite number')
    """
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return "a positive finite number"
    return None if math.isfinite(value) and float(value) > 0 else "a positive finite number"


def hex_digest(length: int) -> Check:
    """A check for a lower-case hexadecimal string of ``length`` characters."""
    expected = f"a hexadecimal digest of {length} characters"

    def check(value: Any) -> str | None:
        ok = isinstance(value, str) and len(value) == length and all(c in "0123456789abcdef" for c in value)
        return None if ok else expected

    return check


def mapping(value: Any) -> str | None:
    """A check for a mapping (a nested configuration or state)."""
    return None if isinstance(value, Mapping) else "a mapping"


def events(value: Any) -> str | None:
    """A check for a list of epoch events (see :class:`Timeline`): each a mapping of ``step`` and one change.

    >>> events([{"step": 3, "budget": 3686.4}, {"step": 5, "num_replicas": 3}]) is None
    True
    >>> events([{"step": 3, "budget": -1}])
    "a list of events {'step': int >= 0, and one of 'num_replicas' (an int >= 1), 'budget' (a positive finite number), 'cost' (a cost model's to_dict())}; item 0 is {'step': 3, 'budget': -1}"
    """
    expected = (
        "a list of events {'step': int >= 0, and one of 'num_replicas' (an int >= 1), "
        "'budget' (a positive finite number), 'cost' (a cost model's to_dict())}"
    )
    if not isinstance(value, list):
        return expected
    for i, event in enumerate(value):
        if not _good_event(event):
            return f"{expected}; item {i} is {event!r}"
    return None


_CHANGES: dict[str, Check] = {
    NUM_REPLICAS_KEY: integer(1),
    BUDGET_KEY: positive_number,
    COST_KEY: lambda v: None if isinstance(v, Mapping) and isinstance(v.get("kind"), str) else "a cost",
}


def _good_event(event: Any) -> bool:
    if not isinstance(event, Mapping) or set(event) - {STEP_KEY, *_CHANGES} or STEP_KEY not in event:
        return False
    changes = [key for key in event if key in _CHANGES]
    return integer()(event[STEP_KEY]) is None and len(changes) == 1 and _CHANGES[changes[0]](event[changes[0]]) is None


def sizes_digest(values: NDArray[Any]) -> str:
    """A stable fingerprint of sizes: blake2b (128 bits) of the shape and the float64 values.

    A state carries it so that a state saved over other samples with the same count is refused.

    >>> sizes_digest(np.array([3, 1, 4])) == sizes_digest(np.array([3.0, 1.0, 4.0]))
    True
    >>> sizes_digest(np.array([3, 1, 4])) == sizes_digest(np.array([3, 1, 5]))
    False
    """
    values = np.ascontiguousarray(values, dtype=np.float64)
    h = hashlib.blake2b(repr(values.shape).encode(), digest_size=16)
    h.update(values.tobytes())
    return h.hexdigest()


#: the check of a :func:`sizes_digest`
DIGEST = hex_digest(32)


# ---------------------------------------------------------------------- the schema


@dataclasses.dataclass(frozen=True)
class StateSchema:
    """The keys, version and value checks of one kind of state, and the one check of a state to load.

    Args:
        name: the owner, as messages name it (``"sampler"``, ``"stream"``, ``"OOMGuard"``).
        version: the version this release writes and reads.
        required: the keys besides ``version`` that every state of this kind has; a mapping
            gives each key its value check (:func:`integer`, :func:`positive_number`,
            :func:`mapping`, ... or any function returning ``None`` or what the value must be).
        optional: keys a state may have (written only in some configurations), likewise.

    >>> schema = StateSchema("sampler", version=1, required={"epoch": integer(), "step": integer()})
    >>> schema.check({"version": 1, "epoch": 0, "step": 4, "cursor": 4})
    Traceback (most recent call last):
    ...
    ValueError: unknown sampler state keys ['cursor']; expected ['epoch', 'step', 'version']
    >>> schema.check({"version": 1, "epoch": 0, "step": 1.5})
    Traceback (most recent call last):
    ...
    ValueError: sampler state key 'step' must be an int >= 0, got 1.5; pass what state_dict() returned, unchanged
    """

    name: str
    version: int
    required: frozenset[str]
    optional: frozenset[str] = frozenset()
    checks: Mapping[str, Check] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    def __init__(
        self,
        name: str,
        version: int,
        required: Iterable[str] | Mapping[str, Check],
        optional: Iterable[str] | Mapping[str, Check] = (),
    ) -> None:
        checks = {
            **(dict(required) if isinstance(required, Mapping) else {}),
            **(dict(optional) if isinstance(optional, Mapping) else {}),
        }
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "required", frozenset(required) | {VERSION_KEY})
        object.__setattr__(self, "optional", frozenset(optional))
        object.__setattr__(self, "checks", checks)

    def check(self, state: Any) -> Mapping[str, Any]:
        """Return ``state`` unchanged if it is a state of this schema, else raise naming what is wrong.

        The version is checked first (it decides which keys are valid), then unknown keys, then
        missing keys, then each value against its check.

        Raises:
            TypeError: ``state`` is not a mapping.
            ValueError: another version, unknown keys, missing keys, or a value of the wrong
                type or range (checked in this order).

        >>> StateSchema("stream", version=1, required=("read",)).check({"version": 1})
        Traceback (most recent call last):
        ...
        ValueError: stream state lacks keys ['read']; pass what state_dict() returned, unchanged
        """
        if not hasattr(state, "keys"):
            raise TypeError(f"{self.name} state must be a mapping (what state_dict() returned), got {type(state).__name__}")
        if VERSION_KEY in state and state[VERSION_KEY] != self.version:
            raise ValueError(
                f"unsupported {self.name} state version {state[VERSION_KEY]!r}; expected {self.version} "
                "(resume with the fitbatch release that saved it)"
            )
        allowed = self.required | self.optional
        unknown = set(state) - allowed
        if unknown:
            raise ValueError(f"unknown {self.name} state keys {sorted(unknown)}; expected {sorted(allowed)}")
        missing = self.required - set(state)
        if missing:
            raise ValueError(f"{self.name} state lacks keys {sorted(missing)}; pass what state_dict() returned, unchanged")
        for key in sorted(set(state) & set(self.checks)):
            expected = self.checks[key](state[key])
            if expected is not None:
                raise ValueError(
                    f"{self.name} state key {key!r} must be {expected}, got {state[key]!r}; "
                    "pass what state_dict() returned, unchanged"
                )
        return state  # type: ignore[no-any-return]

    def envelope(self, **fields: Any) -> dict[str, Any]:
        """A state of this schema: ``{"version": ..., **fields}`` (checked, so it always loads).

        >>> StateSchema("accumulator", version=1, required=("steps",)).envelope(steps=7)
        {'version': 1, 'steps': 7}
        """
        return dict(self.check({VERSION_KEY: self.version, **fields}))


# ---------------------------------------------------------------------- the timeline of an epoch


@dataclasses.dataclass(frozen=True)
class Segment:
    """One arrangement of an epoch and where it runs: its row ``k`` is step ``first + k`` of the epoch.

    Attributes:
        first: the step of the epoch its first row runs at.
        steps: the arrangement (all ranks).
        model, budget: the cost model and the (largest) budget its batches were planned with,
            for the lower bound of a part of it.
    """

    first: int
    steps: Steps
    model: CostModel
    budget: float


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The steps of one epoch as they run: the first arrangement, then one per change.

    Step ``k`` of the epoch runs row ``k - first`` of the last segment that begins at or before
    ``k``. A change at step ``s`` (:meth:`then`) keeps steps ``0 .. s-1`` and replaces the rest
    with an arrangement of the samples the rest held (:meth:`rest_samples`, :meth:`rest_plan`),
    so every sample of the epoch still runs exactly once. ``base`` is the step at which the
    world size last changed: a rank of the current world runs steps ``base ..`` only.

    >>> from fitbatch.distributed import arrange
    >>> from fitbatch.plan import PlanOptions, plan_with
    >>> from fitbatch.sizes import as_sizes
    >>> sizes, opts = as_sizes([1] * 12), PlanOptions.build(2, cost="sum", strategy="sequential")
    >>> steps = arrange(plan_with(sizes, opts), sizes, opts.cost, 2, seed=0, epoch=0)
    >>> epoch = Timeline.start(steps, opts.cost, opts.budget)
    >>> epoch.total, len(epoch.rest_samples(1))  # 6 batches of 2 on 2 ranks; 2 steps left after step 1
    (3, 8)
    >>> rest = arrange(epoch.rest_plan(1, sizes), sizes, opts.cost, 4, seed=0, epoch=0, purpose="resume-steps-1")
    >>> after = epoch.then(1, rest, opts.cost, opts.budget, world_change=True)
    >>> after.total, after.base, after.world, after.step_totals()[0].tolist()
    (2, 1, 4, [4, 8])
    """

    segments: tuple[Segment, ...]
    base: int = 0

    @classmethod
    def start(cls, steps: Steps, model: CostModel, budget: float) -> Timeline:
        """An epoch as first arranged."""
        return cls((Segment(0, steps, model, budget),))

    @property
    def steps(self) -> Steps:
        """The arrangement in force (that of the last change)."""
        return self.segments[-1].steps

    @property
    def total(self) -> int:
        """Steps in the epoch."""
        last = self.segments[-1]
        return last.first + last.steps.n_steps

    @property
    def world(self) -> int:
        """Ranks of the arrangement in force."""
        return int(self.steps.grid.shape[1])

    def pieces(self, start: int = 0) -> list[tuple[Segment, int, int]]:
        """``(segment, first row, end row)`` of the segments that run steps ``start ..`` of the epoch."""
        out = []
        for i, seg in enumerate(self.segments):
            end = self.segments[i + 1].first if i + 1 < len(self.segments) else self.total
            lo, hi = max(start, seg.first), end
            if lo < hi:
                out.append((seg, lo - seg.first, hi - seg.first))
        return out

    def then(self, step: int, steps: Steps, model: CostModel, budget: float, *, world_change: bool = False) -> Timeline:
        """This timeline with the steps from ``step`` on replaced by ``steps`` (``0 <= step <= total``)."""
        kept = tuple(seg for seg in self.segments if seg.first < step)
        return Timeline((*kept, Segment(step, steps, model, budget)), step if world_change else self.base)

    def rest_samples(self, step: int) -> IntArray:
        """The samples of the steps from ``step`` on (all ranks), sorted."""
        parts = [_batches(seg.steps, lo, hi).order for seg, lo, hi in self.pieces(step)]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def rest_plan(self, step: int, sizes: Sizes) -> BatchPlan:
        """The batches of the steps from ``step`` on (all ranks), as one plan with the bound of its samples."""
        pieces = self.pieces(step)
        parts = [_batches(seg.steps, lo, hi) for seg, lo, hi in pieces]
        bound = sum(_bound(seg, lo, hi, sizes) for seg, lo, hi in pieces)
        return _join(parts, self.steps.plan, lower_bound=bound, straggler=None)

    def step_totals(self) -> tuple[IntArray, FloatArray]:
        """Per step of the epoch: samples and real units over all ranks."""
        pieces = self.pieces()
        samples = [seg.steps.step_samples[lo:hi] for seg, lo, hi in pieces]
        units = [seg.steps.step_units[lo:hi] for seg, lo, hi in pieces]
        return np.concatenate([np.zeros(0, np.int64), *samples]), np.concatenate([np.zeros(0), *units])

    def rank_plan(self, rank: int, sizes: Sizes) -> BatchPlan:
        """The batches rank ``rank`` runs at steps ``base ..``, in step order."""
        if len(self.segments) == 1:
            return self.steps.rank_plan(rank)
        pieces = self.pieces(self.base)
        parts = [seg.steps.plan.select(seg.steps.grid[lo:hi, rank]) for seg, lo, hi in pieces]
        bound = sum(_bound(seg, lo, hi, sizes) for seg, lo, hi in pieces)
        ratio = None
        if self.world > 1 and pieces:
            ratio = straggler_ratio(np.concatenate([_step_costs(seg.steps, lo, hi) for seg, lo, hi in pieces]))
        return _join(parts, self.steps.plan, lower_bound=-(-bound // self.world), straggler=ratio)


def _batches(steps: Steps, lo: int, hi: int) -> BatchPlan:
    """The batches of rows ``lo .. hi-1`` of an arrangement, all ranks, in plan order."""
    return steps.plan.select(np.sort(steps.grid[lo:hi].ravel()))


def _bound(seg: Segment, lo: int, hi: int, sizes: Sizes) -> int:
    """A lower bound of the batches of rows ``lo .. hi-1`` of a segment (its plan's own when whole)."""
    if lo == 0 and hi == seg.steps.n_steps:
        return int(seg.steps.plan.lower_bound)
    samples = _batches(seg.steps, lo, hi).order
    alone = seg.model.sample_cost(sizes.values[samples])
    return lower_bound(seg.model, seg.budget, float(np.sum(alone)), int(samples.size))


def _step_costs(steps: Steps, lo: int, hi: int) -> FloatArray:
    costs: FloatArray = steps.plan.costs[steps.grid[lo:hi]]
    return costs / np.asarray(steps.budgets)[None, :] if steps.budgets is not None else costs


def _join(parts: Sequence[BatchPlan], like: BatchPlan, *, lower_bound: int, straggler: float | None) -> BatchPlan:
    """One plan of the batches of ``parts`` in order, with the epoch's metadata from ``like``."""
    counts = np.concatenate([np.zeros(0, np.int64), *(p.counts for p in parts)])
    arrays = [np.concatenate([np.zeros(0), *(getattr(p, name) for p in parts)]) for name in ("costs", "real_units", "padded_units")]
    out = BatchPlan(
        np.concatenate([np.zeros(0, np.int64), *(p.order for p in parts)]),
        np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        costs=arrays[0], real_units=arrays[1], padded_units=arrays[2],
        budget=like.budget, cost_name=like.cost_name, strategy_name=like.strategy_name, lower_bound=lower_bound,
        skipped=like.skipped, dropped=like.dropped, dropped_batches=like.dropped_batches,
        plan_seconds=like.plan_seconds, straggler_ratio=straggler,
    )
    return out


__all__ = [
    "BUDGET_KEY",
    "CONFIG_KEY",
    "COST_KEY",
    "DIGEST",
    "EPOCH_KEY",
    "EVENTS_KEY",
    "MICRO_KEY",
    "NUM_REPLICAS_KEY",
    "N_SAMPLES_KEY",
    "OPTIONS_KEY",
    "SIZES_DIGEST_KEY",
    "STEPS_KEY",
    "STEP_KEY",
    "VERSION_KEY",
    "Check",
    "Segment",
    "StateSchema",
    "Timeline",
    "events",
    "hex_digest",
    "integer",
    "mapping",
    "positive_number",
    "sizes_digest",
]
