"""Build the ahead-of-time cache of the compiled loops now: ``python -m fitbatch._kernels.aot_build``.

The builder of :mod:`fitbatch._kernels.aot` (kept apart: it runs plans, packings and
partitions, so it imports the library, which imports the loader). Run it once after installing
``fitbatch[fast]`` (needs numba and a C compiler; ``--dir`` for another folder, ``--print-path``
for the cache folder of this install), or let the first process that loads numba's JIT start it
in the background. It sets ``FITBATCH_JIT=1`` and ``FITBATCH_AOT=0`` for itself: the workload
runs numba's dispatchers, which then hold the signatures to export.

>>> callable(workload)
True
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

import numpy as np

import fitbatch
from fitbatch._kernels import aot, jit
from fitbatch.steps import _compiled, partition

logger = logging.getLogger(__name__)


def workload() -> None:
    """Plans, packings and partitions that call every kernel the way the library does (the
    signatures exported are those numba compiles here), on small seeded sets."""
    compiled = jit._load()
    if compiled is not None:
        jit._warm(compiled)
    steps = jit.companion("steps", _compiled._warm, now=True)
    if steps is None:
        raise RuntimeError("the step kernels could not be loaded")
    rng = np.random.default_rng(0)
    ints = np.clip(np.ceil(rng.lognormal(5.0, 1.0, 30_000)), 1, 512)
    fractional = ints * 0.75 + 0.125
    for sizes in (ints.astype(np.int64), fractional):
        held = fitbatch.as_sizes(sizes)
        for strategy in ("sequential", "sorted", "pooled", "buckets", "packed"):
            for cost in ("padded", "sum"):
                for epoch in range(2):
                    with contextlib.suppress(ValueError, TypeError):
                        list(fitbatch.plan_batches(held, 4096, cost=cost, strategy=strategy, epoch=epoch))
    # sum-cost packing on the length histogram (pattern layouts: compiled_histogram), shuffled and not
    # (sets whose patterns the layout takes: near the bound; 128 and 256 tokens at most)
    histogram = [np.clip(np.ceil(np.random.default_rng(seed).lognormal(mu, 0.8, 70_000)), 1, top).astype(np.int64)
                 for seed, mu, top in ((1, 3.5, 128), (0, 4.5, 256))]
    histogram.append((rng.integers(1, 17, 60_000) * 24).astype(np.int64))
    for sizes, budget in zip(histogram, (128, 256, 512)):
        for epoch in range(2):
            for shuffle in (True, False):
                with contextlib.suppress(ValueError, TypeError):
                    plan = fitbatch.plan_batches(sizes, budget, cost="sum", strategy="packed", epoch=epoch, shuffle=shuffle)
                    plan.counts, plan.costs  # noqa: B018 - measured per batch kind (gather_kinds)
    for cost in ("sum", "padded"):
        with contextlib.suppress(ValueError, TypeError):
            partition(ints.astype(np.int64)[:3000], 8192.0, world=8, cost=cost)
            partition(ints.astype(np.int64)[:3000], 8192.0, world=8, cost=cost, weights=ints[:3000] ** 2)


def main(argv: list[str] | None = None) -> int:
    """Build this install's cache (or print its folder); 0 when built or another process builds it."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m fitbatch._kernels.aot_build", description=__doc__.splitlines()[0])
    p.add_argument("--dir", help="the cache folder to build (default: this install's key under the cache root)")
    p.add_argument("--print-path", action="store_true", help="print this install's cache folder and exit")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.print_path:
        sys.stdout.write(f"{aot.directory()}\n")
        return 0
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    os.environ["FITBATCH_AOT"] = "0"  # (a fresh process: numba's dispatchers, not an older cache)
    os.environ["FITBATCH_JIT"] = "1"
    target = aot.build(Path(args.dir) if args.dir else None, workload=workload)
    if target is None:
        logger.info("another process is building it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
