"""Resuming: the state schema every stateful object checks, and the resume of an epoch on a new world.

The contract, for every object with ``state_dict()``/``load_state_dict()`` (the samplers, the
stream, ``equal_steps``, the accumulator, ``OOMGuard``, the compat optimizers):

* ``state_dict()`` is a plain JSON-able dict with a ``version`` key, built by the object's
  :class:`StateSchema` (:meth:`StateSchema.envelope`); a composed object nests its parts'
  states under named keys.
* ``load_state_dict(state)`` first runs :meth:`StateSchema.check`: ``state`` must be a mapping
  with no unknown key, no missing key and this version, else a ``ValueError`` names the object,
  the offending keys or value and what to pass instead. It never mutates ``state`` and sets no
  "just restored" flag: the object re-plans from (seed, epoch, options) and jumps to the saved
  cursor in O(1), with no replay of what was consumed.
* A sampler whose world size changed between save and resume continues the epoch with
  :func:`continue_epoch`: the samples left are re-arranged for the new world, each sample
  still exactly once.

>>> COUNTER = StateSchema("counter", version=1, required=("count",))
>>> state = COUNTER.envelope(count=3)
>>> state
{'version': 1, 'count': 3}
>>> COUNTER.check({**state, "version": 2})
Traceback (most recent call last):
...
ValueError: unsupported counter state version 2; expected 1 (resume with the fitbatch release that saved it)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fitbatch.distributed import Steps, remaining_plan
from fitbatch.plan import BatchPlan

#: keys that more than one kind of state uses (as torchdata names its ``*_KEY`` constants)
VERSION_KEY = "version"
EPOCH_KEY = "epoch"
STEP_KEY = "step"  # steps of the epoch consumed
MICRO_KEY = "micro"  # micro-batches of the epoch consumed
STEPS_KEY = "steps"  # optimizer steps taken
NUM_REPLICAS_KEY = "num_replicas"
N_SAMPLES_KEY = "n_samples"
CONFIG_KEY = "config"
OPTIONS_KEY = "options"


@dataclasses.dataclass(frozen=True)
class StateSchema:
    """The keys and version of one kind of state, and the one check of a state to load.

    Args:
        name: the owner, as messages name it (``"sampler"``, ``"stream"``, ``"OOMGuard"``).
        version: the version this release writes and reads.
        required: the keys besides ``version`` that every state of this kind has.
        optional: keys a state may have (written only in some configurations).
        fields: checks of single values, ``{key: check(name, value)}``: each raises
            ``TypeError``/``ValueError`` naming ``name`` (``"<owner> state 'key'"``) and the value
            (for example :func:`fitbatch._validate.non_negative_int`).

    >>> schema = StateSchema("sampler", version=1, required=("epoch", "step"))
    >>> schema.check({"version": 1, "epoch": 0, "step": 4, "cursor": 4})
    Traceback (most recent call last):
    ...
    ValueError: unknown sampler state keys ['cursor']; expected ['epoch', 'step', 'version']
    """

    name: str
    version: int
    required: frozenset[str]
    optional: frozenset[str] = frozenset()
    fields: Mapping[str, Callable[[str, Any], object]] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __init__(
        self,
        name: str,
        version: int,
        required: Iterable[str],
        optional: Iterable[str] = (),
        fields: Mapping[str, Callable[[str, Any], object]] | None = None,
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "required", frozenset(required) | {VERSION_KEY})
        object.__setattr__(self, "optional", frozenset(optional))
        object.__setattr__(self, "fields", dict(fields or {}))

    def check(self, state: Any) -> Mapping[str, Any]:
        """Return ``state`` unchanged if it is a state of this schema, else raise naming what is wrong.

        Raises:
            TypeError: ``state`` is not a mapping.
            ValueError: unknown keys, another version, or missing keys (checked in this order),
                or a value its ``fields`` check refuses (which may raise ``TypeError`` instead).

        >>> StateSchema("stream", version=1, required=("read",)).check({"version": 1})
        Traceback (most recent call last):
        ...
        ValueError: stream state lacks keys ['read']; pass what state_dict() returned, unchanged
        """
        if not hasattr(state, "keys"):
            raise TypeError(f"{self.name} state must be a mapping (what state_dict() returned), got {type(state).__name__}")
        allowed = self.required | self.optional
        unknown = set(state) - allowed
        if unknown:
            raise ValueError(f"unknown {self.name} state keys {sorted(unknown)}; expected {sorted(allowed)}")
        if VERSION_KEY in state and state[VERSION_KEY] != self.version:
            raise ValueError(
                f"unsupported {self.name} state version {state[VERSION_KEY]!r}; expected {self.version} "
                "(resume with the fitbatch release that saved it)"
            )
        missing = self.required - set(state)
        if missing:
            raise ValueError(f"{self.name} state lacks keys {sorted(missing)}; pass what state_dict() returned, unchanged")
        for key, check in self.fields.items():
            if key in state:
                check(f"{self.name} state {key!r}", state[key])
        return state  # type: ignore[no-any-return]

    def envelope(self, **fields: Any) -> dict[str, Any]:
        """A state of this schema: ``{"version": ..., **fields}`` (checked, so it always loads).

        >>> StateSchema("accumulator", version=1, required=("steps",)).envelope(steps=7)
        {'version': 1, 'steps': 7}
        """
        return dict(self.check({VERSION_KEY: self.version, **fields}))


@dataclasses.dataclass(frozen=True)
class Continuation:
    """Where a resumed epoch goes on: its arrangement, the first step to run, the worlds before it.

    Attributes:
        steps: the epoch's arrangement to continue in (all ranks).
        start: the first step of ``steps`` to run (0 after a re-arrangement).
        history: ``[num_replicas, steps done]`` of each earlier arrangement, oldest first; a
            sampler saves it in its state so a later resume rebuilds the same chain.
        rearranged: whether ``steps`` differs from the epoch's fresh arrangement.

    >>> from fitbatch.distributed import arrange
    >>> from fitbatch.plan import PlanOptions, plan_with
    >>> from fitbatch.sizes import as_sizes
    >>> sizes, opts = as_sizes([1] * 6), PlanOptions.build(1, cost="sum")
    >>> def fresh(world):
    ...     return arrange(plan_with(sizes, opts), sizes, opts.cost, world, seed=0, epoch=0)
    >>> def rest(plan, world, purpose):
    ...     return arrange(plan, sizes, opts.cost, world, seed=0, epoch=0, purpose=purpose)
    >>> same = continue_epoch([[2, 1]], 2, fresh=fresh, rest=rest)  # same world: step 1 of the fresh one
    >>> same.start, same.history, same.rearranged, same.steps.n_steps
    (1, [], False, 3)
    """

    steps: Steps
    start: int
    history: list[list[int]]
    rearranged: bool


def continue_epoch(
    chain: Sequence[Sequence[int]],
    world: int,
    *,
    fresh: Callable[[int], Steps],
    rest: Callable[[BatchPlan, int, str], Steps],
) -> Continuation:
    """Rebuild the arrangement an epoch ran in when its state was taken, and continue it on ``world`` ranks.

    Each link of ``chain`` is ``[num_replicas, steps done]`` of one arrangement, oldest first;
    the last is the one the state was taken in. The first arrangement is the fresh one; each
    later one arranges the samples its predecessor had left. If the last world is not
    ``world``, the samples left are re-arranged once more, for ``world`` ranks. Everything is
    rebuilt from the chain: no consumed batch is replayed, and every sample runs exactly once.

    Args:
        chain: the arrangements, as a sampler's saved ``history`` plus ``[num_replicas, step]``.
        world: the number of ranks now.
        fresh: ``fresh(num_replicas)`` -> the epoch as first arranged for that many ranks.
        rest: ``rest(plan, num_replicas, purpose)`` -> ``plan`` (the samples left) arranged for
            that many ranks; ``purpose`` keys its randomness, one per re-arrangement.

    >>> from fitbatch.distributed import arrange
    >>> from fitbatch.plan import PlanOptions, plan_with
    >>> from fitbatch.sizes import as_sizes
    >>> sizes, opts = as_sizes([1] * 12), PlanOptions.build(2, cost="sum", strategy="sequential")
    >>> def fresh(world):
    ...     return arrange(plan_with(sizes, opts), sizes, opts.cost, world, seed=0, epoch=0)
    >>> def rest(plan, world, purpose):
    ...     return arrange(plan, sizes, opts.cost, world, seed=0, epoch=0, purpose=purpose)
    >>> after = continue_epoch([[2, 1]], 3, fresh=fresh, rest=rest)  # 2 ranks ran 1 step; now 3
    >>> after.steps.plan.n_samples, after.start, after.history
    (8, 0, [[2, 1]])
    """
    links = [[int(w), int(done)] for w, done in chain]
    current = fresh(links[0][0])
    for generation in range(1, len(links)):
        current = _rearranged(current, links[generation - 1][1], links[generation][0], generation, rest)
    last_world, done = links[-1]
    if last_world == world:
        return Continuation(current, done, links[:-1], len(links) > 1)
    current = _rearranged(current, done, world, len(links), rest)
    return Continuation(current, 0, links, True)


def _rearranged(
    steps: Steps, done: int, world: int, generation: int, rest: Callable[[BatchPlan, int, str], Steps]
) -> Steps:
    left = remaining_plan(steps, min(done, steps.n_steps))
    return rest(left, world, f"resume-steps-{generation}")


__all__ = [
    "CONFIG_KEY",
    "EPOCH_KEY",
    "MICRO_KEY",
    "NUM_REPLICAS_KEY",
    "N_SAMPLES_KEY",
    "OPTIONS_KEY",
    "STEPS_KEY",
    "STEP_KEY",
    "VERSION_KEY",
    "Continuation",
    "StateSchema",
    "continue_epoch",
]
