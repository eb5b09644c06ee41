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
* A sampler whose epoch changed part-way (budget, cost model, world size) saves the changes as
  *events* (:func:`events` checks them) and rebuilds the same epoch on resume
  (:mod:`fitbatch.epoch._timeline`), so every sample of the epoch still runs exactly once.

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

#: a value check ``check(name, value)``: returns when the value is fine, else raises ``TypeError``
#: or ``ValueError`` naming ``name`` (``"<owner> state key 'key'"``), the value and what it must be
#: (as :func:`fitbatch._validate.non_negative_int` does)
Check = Callable[[str, Any], object]

_WAY_OUT = "pass what state_dict() returned, unchanged"


# ---------------------------------------------------------------------- value checks


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _refuse(name: str, value: Any, expected: str) -> None:
    raise ValueError(f"{name} must be {expected}, got {value!r}; {_WAY_OUT}")


def integer(low: int = 0) -> Check:
    """A check for an int ``>= low`` (bools refused).

    >>> integer(1)("state key 'n'", 0)
    Traceback (most recent call last):
    ...
    ValueError: state key 'n' must be an int >= 1, got 0; pass what state_dict() returned, unchanged
    """

    def check(name: str, value: Any) -> None:
        if not (_is_int(value) and int(value) >= low):
            _refuse(name, value, f"an int >= {low}")

    return check


def _positive(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and float(value) > 0


def positive_number(name: str, value: Any) -> None:
    """A check for a positive finite number (a budget).

    >>> positive_number("state key 'budget'", 0.5)
    >>> positive_number("state key 'budget'", float("inf"))
    Traceback (most recent call last):
    ...
    ValueError: state key 'budget' must be a positive finite number, got inf; pass what state_dict() returned, unchanged
    """
    if not _positive(value):
        _refuse(name, value, "a positive finite number")


def hex_digest(length: int) -> Check:
    """A check for a lower-case hexadecimal string of ``length`` characters."""

    def check(name: str, value: Any) -> None:
        if not (isinstance(value, str) and len(value) == length and all(c in "0123456789abcdef" for c in value)):
            _refuse(name, value, f"a hexadecimal digest of {length} characters")

    return check


def mapping(name: str, value: Any) -> None:
    """A check for a mapping (a nested configuration or state)."""
    if not isinstance(value, Mapping):
        _refuse(name, value, "a mapping")


def events(name: str, value: Any) -> None:
    """A check for a list of epoch events (see :mod:`fitbatch.epoch._timeline`): each a ``step`` and one change.

    >>> events("events", [{"step": 3, "budget": 3686.4}, {"step": 5, "num_replicas": 3}])
    >>> events("events", [{"step": 3, "budget": -1}])
    Traceback (most recent call last):
    ...
    ValueError: events must be a list of events {'step': int >= 0, and one of 'num_replicas' (an int >= 1), 'budget' (a positive finite number), 'cost' (a cost model's to_dict())}; item 0 is {'step': 3, 'budget': -1}, got [{'step': 3, 'budget': -1}]; pass what state_dict() returned, unchanged
    """
    expected = (
        "a list of events {'step': int >= 0, and one of 'num_replicas' (an int >= 1), "
        "'budget' (a positive finite number), 'cost' (a cost model's to_dict())}"
    )
    if not isinstance(value, list):
        _refuse(name, value, expected)
    for i, event in enumerate(value):
        if not _good_event(event):
            _refuse(name, value, f"{expected}; item {i} is {event!r}")


_CHANGES: dict[str, Callable[[Any], bool]] = {
    NUM_REPLICAS_KEY: lambda v: _is_int(v) and v >= 1,
    BUDGET_KEY: _positive,
    COST_KEY: lambda v: isinstance(v, Mapping) and isinstance(v.get("kind"), str),
}


def _good_event(event: Any) -> bool:
    if not isinstance(event, Mapping) or set(event) - {STEP_KEY, *_CHANGES} or STEP_KEY not in event:
        return False
    changes = [key for key in event if key in _CHANGES]
    step = event[STEP_KEY]
    return _is_int(step) and step >= 0 and len(changes) == 1 and _CHANGES[changes[0]](event[changes[0]])


def sizes_digest(values: NDArray[Any], loss_sizes: NDArray[Any] | None = None, columns: Sequence[str] | None = None) -> str:
    """A stable fingerprint of sizes: blake2b (128 bits) of the shape and the float64 values.

    A state carries it so that a state saved over other samples with the same count is refused.
    With ``loss_sizes`` (tokens that carry loss, per sample) they are part of the fingerprint;
    without, it is the fingerprint of the sizes alone, as states saved before them hold.
    ``columns``, the names of named size columns (several limits), are part of it when given.

    >>> sizes_digest(np.array([3, 1, 4])) == sizes_digest(np.array([3.0, 1.0, 4.0]))
    True
    >>> sizes_digest(np.array([3, 1, 4])) == sizes_digest(np.array([3, 1, 5]))
    False
    >>> sizes_digest(np.array([3, 1, 4]), np.array([2, 1, 4])) == sizes_digest(np.array([3, 1, 4]))
    False
    >>> sizes_digest(np.ones((2, 2)), columns=("images", "tokens")) == sizes_digest(np.ones((2, 2)), columns=("frames", "tokens"))
    False
    """
    values = np.ascontiguousarray(values, dtype=np.float64)
    h = hashlib.blake2b(repr(values.shape).encode(), digest_size=16)
    h.update(values.tobytes())
    if loss_sizes is not None:
        h.update(b"loss_sizes")
        h.update(np.ascontiguousarray(loss_sizes, dtype=np.float64).tobytes())
    if columns is not None:
        h.update(repr(tuple(columns)).encode())
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
            :func:`mapping`, ... or any :data:`Check`; ``None``: any value).
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
        required: Iterable[str] | Mapping[str, Check | None],
        optional: Iterable[str] | Mapping[str, Check | None] = (),
    ) -> None:
        checks = {
            key: check
            for keys in (required, optional)
            if isinstance(keys, Mapping)
            for key, check in keys.items()
            if check is not None
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
                range (checked in this order); a value check may raise ``TypeError`` for a value
                of the wrong type.

        >>> StateSchema("stream", version=1, required=("read",)).check({"version": 1})
        Traceback (most recent call last):
        ...
        ValueError: stream state lacks keys ['read']; pass what state_dict() returned, unchanged
        """
        if not hasattr(state, "keys"):
            raise TypeError(f"{self.name} state must be a mapping (what state_dict() returned), got {type(state).__name__}")
        allowed = self.required | self.optional
        if VERSION_KEY in state and state[VERSION_KEY] != self.version:
            extra, absent = sorted(set(state) - allowed), sorted(self.required - set(state))
            parts = [f"keys {extra} that {self.name} states do not have"] if extra else []
            parts += [f"no {absent}"] if absent else []
            kind = (  # keys of another kind of state too: say so (a windowed and a global sampler's differ)
                f"; it has {' and '.join(parts)}: if another kind of object saved it (a "
                "BudgetBatchSampler's state and a ScheduledBatchSampler's differ), load it into that kind"
                if parts else ""
            )
            raise ValueError(
                f"unsupported {self.name} state version {state[VERSION_KEY]!r}; expected {self.version} "
                f"(resume with the fitbatch release that saved it){kind}"
            )
        unknown = set(state) - allowed
        if unknown:
            raise ValueError(f"unknown {self.name} state keys {sorted(unknown)}; expected {sorted(allowed)}")
        missing = self.required - set(state)
        if missing:
            raise ValueError(f"{self.name} state lacks keys {sorted(missing)}; pass what state_dict() returned, unchanged")
        for key in sorted(set(state) & set(self.checks)):
            self.checks[key](f"{self.name} state key {key!r}", state[key])
        return state  # type: ignore[no-any-return]

    def envelope(self, **fields: Any) -> dict[str, Any]:
        """A state of this schema: ``{"version": ..., **fields}`` (checked, so it always loads).

        >>> StateSchema("accumulator", version=1, required=("steps",)).envelope(steps=7)
        {'version': 1, 'steps': 7}
        """
        return dict(self.check({VERSION_KEY: self.version, **fields}))


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
    "StateSchema",
    "events",
    "hex_digest",
    "integer",
    "mapping",
    "positive_number",
    "sizes_digest",
]
