"""Functions for process stages: importable by worker processes, and light (no torch)."""

from __future__ import annotations

import os
import time
from pathlib import Path


class Boom(Exception):
    """A picklable error type that only these tests raise."""


def square(x: int) -> int:
    return x * x


def fail_at_three(x: int) -> int:
    if x == 3:
        raise Boom(f"item {x} is cursed")
    return x


def record_pid_and_block(args: tuple[str, int]) -> int:
    """Write this worker's pid into the folder ``args[0]``, then block for a minute."""
    folder, x = args
    Path(folder, str(os.getpid())).touch()
    time.sleep(60)
    return x


def die_at_three(x: int) -> int:
    """Kill the worker process on item 3, as a segfault or the OOM killer would."""
    if x == 3:
        os._exit(1)
    return x


class NeedsTwoArgs(Exception):
    """An error that pickles but cannot be unpickled: its ``__init__`` needs two arguments and
    ``args`` holds one (the parent's loads() calls ``NeedsTwoArgs(message)``)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")


class HoldsALock(Exception):
    """An error that cannot be pickled at all: it keeps a lock."""

    def __init__(self, message: str) -> None:
        import threading

        super().__init__(message)
        self.lock = threading.Lock()


def unpicklable_error_at_three(x: int) -> int:
    if x == 3:
        raise NeedsTwoArgs("shard-3.tar", "truncated")
    return x


def lock_error_at_three(x: int) -> int:
    if x == 3:
        raise HoldsALock("item 3 holds a lock")
    return x
