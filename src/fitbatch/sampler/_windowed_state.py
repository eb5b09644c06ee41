"""The state of a :class:`~fitbatch.sampler.WindowedBatchSampler`: saved and loaded (its methods call these).

A state is ``(epoch, step, window, window_step, carry)`` plus the epoch's events and the options
it began with; a resume plans the saved window and, when it was handed batches, the one before.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from fitbatch._state import EVENTS_KEY, NUM_REPLICAS_KEY, OPTIONS_KEY, STEP_KEY
from fitbatch._validate import non_negative_int
from fitbatch.epoch import _windows as W
from fitbatch.epoch._timeline import check_step
from fitbatch.epoch._windows import CARRY_KEY, WINDOW_KEY, WINDOW_STEP_KEY

logger = logging.getLogger("fitbatch.sampler._windowed")


def save(sampler: Any, step: int | None) -> dict[str, Any]:
    """``sampler.state_dict(step=step)``."""
    cursor = sampler._position if step is None else non_negative_int(STEP_KEY, step)
    live = sampler._current()
    if not sampler._from() <= cursor <= live.end:
        raise ValueError(
            f"step {cursor} is outside the steps of epoch {sampler.epoch} this sampler knows "
            f"({sampler._from()}..{live.end}); pass the steps of the epoch completed"
        )
    w = W.window_of(sampler._marks, cursor, live)
    first, carried = sampler._marks[w]
    return sampler.STATE.envelope(
        epoch=sampler.epoch, step=cursor, num_replicas=sampler._world0, n_samples=len(sampler._column),
        sizes_digest=sampler._digest, options=sampler._config(), events=copy.deepcopy(sampler._events),
        window=w, window_step=first, carry=carried,
    )


def load(sampler: Any, state: Mapping[str, Any]) -> None:
    """``sampler.load_state_dict(state)``."""
    saved = state.get(OPTIONS_KEY)
    if sampler._auto and isinstance(saved, Mapping) and isinstance(saved.get("window"), int):
        sampler.window = saved["window"]  # chosen for the world the epoch began on
    epoch, step, is_now = sampler._check_began(state, sampler._config(sampler._opts), sampler._config())
    begun = sampler._opts if is_now else sampler._begun
    w, first, carried = int(state[WINDOW_KEY]), int(state[WINDOW_STEP_KEY]), int(state[CARRY_KEY])
    sampler.set_epoch(epoch)
    sampler._begun, sampler._world0, sampler._events = begun, int(state[NUM_REPLICAS_KEY]), copy.deepcopy(list(state[EVENTS_KEY]))
    n_windows = sampler.windows().n_windows
    if w >= n_windows or (w == 0 and carried) or step < first:
        raise ValueError(f"state's window {w} (step {first}, carry {carried}) is not in epoch {epoch} of {n_windows} windows at step {step}; pass what state_dict() returned, unchanged")
    sampler._marks, sampler._from_row = {}, first if any(NUM_REPLICAS_KEY in e for e in sampler._events) else 0
    live = sampler._rebuild(w, first, carried)
    if live.timeline.world != sampler.num_replicas:
        event = {WINDOW_KEY: w, STEP_KEY: step - first, NUM_REPLICAS_KEY: sampler.num_replicas}
        check_step(f"step {step}", step - first, live.timeline, epoch)
        # events of later windows (a prefetching loader's, past the saved step) name steps of
        # the old world's windows: as the global sampler does, the rest of the epoch runs
        # with the options in force after them, so they move to the resume point
        later = [e for e in sampler._events if e[WINDOW_KEY] > w]
        sampler._events = [e for e in sampler._events if e[WINDOW_KEY] <= w]
        for change in (event, *({**e, WINDOW_KEY: w, STEP_KEY: step - first} for e in later)):
            sampler._apply(live, change, sampler._generation(live))
            sampler._events.append(change)
        sampler._from_row = step
        logger.info("resumed epoch %d at step %d (window %d): the rest re-arranged for %d ranks", epoch, step, w, sampler.num_replicas)
    sampler._live = live
    if step > live.end:
        raise ValueError(f"state's step {step} is beyond window {w}, which ends at step {live.end}; pass what state_dict() returned, unchanged")
    sampler._seek(step)
