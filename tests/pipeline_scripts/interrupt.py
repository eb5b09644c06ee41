"""Consume a pipeline with blocked worker processes forever, until SIGINT.

Usage: ``python interrupt.py PID_FOLDER``. Prints ``ready`` once the first batch arrived; the
parent then sends SIGINT, which must end the script promptly with ``KeyboardInterrupt``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def slow(args: tuple[str, int]) -> int:
    folder, x = args
    Path(folder, str(os.getpid())).touch()
    if x >= 2:
        time.sleep(60)
    return x


def say(message: object) -> None:
    """One line for the parent test to read (the library itself never prints)."""
    sys.stdout.write(f"{message}\n")
    sys.stdout.flush()


def main() -> None:
    from fitbatch.pipeline import Infinite, Processes

    folder = sys.argv[1]
    source = ((folder, x) for x in range(10**9))
    with Infinite(
        source, Processes(slow, 2), batch_size=2, batches_per_epoch=10**9, combiner=list
    ) as batches:
        for i, _batch in enumerate(batches()):
            if i == 0:
                say("ready")


if __name__ == "__main__":
    main()
