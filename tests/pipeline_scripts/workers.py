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
