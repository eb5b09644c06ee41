"""The states of :mod:`fitbatch.streaming`: their schemas and the checks of each saved value.

A state is refused before anything is restored when a key is unknown or missing, the version is
another, or a value has the wrong type or range (each check names the state, the key and the
value, through :class:`fitbatch._state.StateSchema`). What no single value can tell — a state
taken over another source, with other options, or of a run that cannot resume — is checked by
the owner's ``load_state_dict``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch._state import OPTIONS_KEY, STEP_KEY, StateSchema
from fitbatch._validate import non_negative_int

SHOWN = 10  # skipped positions kept in a stream's summary and state


def flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def units(name: str, value: Any) -> None:
    """A non-negative finite number (real or padded size units)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number >= 0, got {value!r}")
    if not (math.isfinite(value) and float(value) >= 0):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def mapping(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict (as state_dict() wrote it), got {type(value).__name__}")


def runs(name: str, value: Any) -> None:
    """``[[first, length], ...]``: increasing, non-overlapping runs of stream positions."""
    if not isinstance(value, list):
        raise TypeError(f"{name} must be a list of [first, length] runs, got {type(value).__name__}")
    end = 0
    for run in value:
        if not (isinstance(run, list) and len(run) == 2):
            raise TypeError(f"{name} must be a list of [first, length] runs, got the entry {run!r}")
        first = non_negative_int(f"{name} first position", run[0])
        non_negative_int(f"{name} run length", run[1])
        if first < end or run[1] < 1:
            raise ValueError(f"{name} must hold increasing, non-empty, non-overlapping runs; got {run!r} after position {end}")
        end = first + run[1]


def positions(name: str, value: Any) -> None:
    if not isinstance(value, list) or len(value) > SHOWN:
        raise TypeError(f"{name} must be a list of at most {SHOWN} stream positions, got {value!r}")
    for p in value:
        non_negative_int(f"{name} entry", p)


def buckets(name: str, value: Any) -> None:
    mapping(name, value)
    if set(value) != {"tops", "next_fit"}:
        raise ValueError(f"{name} must have the keys ['next_fit', 'tops'], got {sorted(value)}")
    tops = value["tops"]
    if tops is not None:
        if not isinstance(tops, list):
            raise TypeError(f"{name} tops must be a list of bucket edges or None, got {tops!r}")
        for top in tops:
            units(f"{name} edge", top)
    if value["next_fit"] is not None:
        non_negative_int(f"{name} next_fit", value["next_fit"])


def window_options(name: str, value: Any) -> None:
    mapping(name, value)
    if set(value) != {"sync_every", "steps"}:
        raise ValueError(f"{name} must have the keys ['steps', 'sync_every'], got {sorted(value)}")


def check_counts(state: Mapping[str, Any], read: int, pending: NDArray[np.int64], bucketed: bool) -> None:
    """What no single value of a stream state can tell: its counts must agree with each other."""
    end = int(pending[-1]) + 1 if pending.size else 0
    accounted = state["emitted"] + state["skipped"] + pending.size
    if end > read or accounted > read or len(state["skipped_positions"]) > state["skipped"]:
        raise ValueError(
            f"inconsistent stream state: {read} items read, but {state['emitted']} emitted + {state['skipped']} "
            f"skipped + {pending.size} pending (up to position {end - 1}); pass what state_dict() returned, unchanged"
        )
    if bucketed != ("buckets" in state):
        raise ValueError("the stream state's 'buckets' key must be present exactly for bucket strategies")


STREAM_STATE = StateSchema(
    "stream",
    version=2,
    required={
        OPTIONS_KEY: mapping,
        "read": non_negative_int,
        "pending": runs,
        "batches": non_negative_int,
        "emitted": non_negative_int,
        "real": units,
        "padded": units,
        "skipped": non_negative_int,
        "skipped_positions": positions,
        "oversized_batches": non_negative_int,
        "integral": flag,
        "done": flag,
        "last_size": lambda name, value: None if value is None else units(name, value),
    },
    optional={"buckets": buckets},  # bucket strategies only
)

# The summary counters of equal_steps, saved so that a restored run reports what an
# uninterrupted one would.
EQUAL_STEPS_COUNTERS = ("dropped_batches", "dropped_items", "collectives")

EQUAL_STEPS_STATE = StateSchema(
    "equal_steps",
    version=2,
    required={
        OPTIONS_KEY: window_options,
        STEP_KEY: non_negative_int,
        "window": non_negative_int,
        "window_step": non_negative_int,
        "final": flag,
        "resumable": flag,
        "exhausted": flag,
        "source": None,  # the batches' own state (they check it)
        **dict.fromkeys(EQUAL_STEPS_COUNTERS, non_negative_int),
    },
)
