"""Start a pipeline whose stages block, take one batch and never close it.

Usage: ``python forgotten.py {threads,loky,stdlib} PID_FOLDER [two]``. Worker processes write
their pid into PID_FOLDER. The script prints ``exiting`` last; the interpreter must then exit at
once and leave no worker process behind. ``two``: a pass-through process stage first, so that two
pools run (loky registered its exit hook again for the second, after the pipeline's).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

PIPELINE: Any = None


def block_from_four(args: tuple[str, int]) -> int:
    folder, x = args
    Path(folder, str(os.getpid())).touch()
    if x >= 4:
        time.sleep(60)
    return x


def pass_through(args: tuple[str, int]) -> tuple[str, int]:
    Path(args[0], str(os.getpid())).touch()
    return args


def say(message: object) -> None:
    """One line for the parent test to read (the library itself never prints)."""
    sys.stdout.write(f"{message}\n")
    sys.stdout.flush()


def main() -> None:
    from fitbatch.pipeline import Infinite, Processes, Threads

    mode, folder = sys.argv[1], sys.argv[2]
    stage = (
        Threads(block_from_four, 2)
        if mode == "threads"
        else Processes(block_from_four, 2, backend=mode)
    )
    stages = [stage]
    if sys.argv[3:] == ["two"]:
        stages.insert(0, Processes(pass_through, 2, backend=mode))
    source = ((folder, x) for x in range(10**9))
    # A module-level reference: the pipeline is alive at exit, so no garbage collection saves us.
    global PIPELINE
    PIPELINE = Infinite(source, *stages, batch_size=2, batches_per_epoch=1, combiner=list)
    say(next(PIPELINE()))
    time.sleep(0.3)  # let the stages reach the blocking items
    say("exiting")


if __name__ == "__main__":
    main()
