"""Interpreter exit: close every pipeline still running, before the pools' own exit hooks.

Process pools (loky's and the standard library's) register a hook with
``threading._register_atexit`` that joins their manager thread, and that thread waits for the
workers' current calls: a blocked worker would hang the interpreter at exit. Such hooks run in
reverse order of registration, so :func:`hook_after` registers ours after a pool has started;
it kills the workers first. ``atexit`` covers pipelines without processes.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Protocol

logger = logging.getLogger("fitbatch.pipeline")

# The time each pipeline gets to end its threads at interpreter exit; those blocked in user code
# are daemons and do not delay the exit anyway.
EXIT_TIMEOUT = 0.25


class Closable(Protocol):
    def close(self, timeout: float, at_exit: bool = False) -> None: ...


_live: set[Closable] = set()
_lock = threading.Lock()


def track(runtime: Closable) -> None:
    with _lock:
        _live.add(runtime)


def untrack(runtime: Closable) -> None:
    with _lock:
        _live.discard(runtime)


def close_all() -> None:
    """Close every running pipeline (idempotent; runs at interpreter exit)."""
    with _lock:
        runtimes = list(_live)
    for runtime in runtimes:
        try:
            runtime.close(EXIT_TIMEOUT, at_exit=True)
        except Exception:  # at exit, one broken pipeline must not keep the others running
            logger.exception("closing a pipeline at interpreter exit failed")


def hook_after() -> None:
    """Make sure :func:`close_all` runs before the exit hook of the pool just started.

    Registered again for every pool, not once per kind: loky registers its hook again each time
    an executor starts (its "already registered" check never holds), and a hook registered
    once, after the first pool, would then run after the later pools' hooks, which wait on the
    busy workers forever. ``close_all`` is idempotent.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - CPython >= 3.9 has it
        return
    try:
        register(close_all)
    except RuntimeError:  # the interpreter is already shutting down
        pass


atexit.register(close_all)
