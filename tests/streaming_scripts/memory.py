"""Peak memory of batch_stream over a long stream, in a fresh process (printed as JSON).

Usage: python memory.py STRATEGY COST N_ITEMS BUFFER_SIZE
RSS is sampled after the first tenth of the stream (or after numba's loading point, twice
``fitbatch._kernels.jit.LOAD_AT`` items, if later: the ``fast`` extra's one-time import is not growth) and at
the end: the growth in between is what a leak or an unbounded buffer would show (10 M Python
items held would be ~400 MB).
"""

from __future__ import annotations

import itertools
import json
import resource
import sys

import numpy as np

import fitbatch.streaming as fs
from fitbatch._kernels import jit as _jit


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    strategy, cost, n, buffer_size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    lengths = np.random.default_rng(0).integers(1, 600, 65536).tolist()
    source = itertools.islice(itertools.cycle(lengths), n)  # items are their own sizes
    stream = fs.batch_stream(
        source, sizeof_batch=lambda items: np.array(items, dtype=np.float64), budget=16384, cost=cost,
        strategy=strategy, buffer_size=buffer_size,
    )
    early = None
    max_held = 0
    items = 0
    for k, batch in enumerate(stream):
        items += len(batch)
        if k % 64 == 0:
            s = stream.summary
            max_held = max(max_held, s.held)
            if early is None and s.items_read >= max(n // 10, 2 * _jit.LOAD_AT):
                _jit.settle()  # numba's background load (started at LOAD_AT) is not growth
                early = rss_mb()
    sys.stdout.write(json.dumps({
        "items": items, "early_rss_mb": early, "end_rss_mb": rss_mb(), "max_held": max_held,
        "padding_efficiency": stream.summary.padding_efficiency,
    }) + "\n")


if __name__ == "__main__":
    main()
