"""Packing quality: ``packed`` (sum cost) batches against the lower bound ceil(sum / budget).

Run from the repository root:

    python bench/packing.py              # 1M samples per real set, three budgets (about 20 s)
    python bench/packing.py --n 200000

For each real length set (resampled with seed 0, samples over the budget left out) and budget it
prints the batch count of the ``packed`` plan over its lower bound, beside the same pools packed
without the cross-pool pass (each pool's two-ended packing alone: what ``packed`` did before the
loose ends of every pool were packed again together), and the plan time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, resample  # noqa: E402

import fitbatch  # noqa: E402
from fitbatch._packing import two_ended_starts  # noqa: E402
from fitbatch.strategies._base import Context, _pooled_layout  # noqa: E402

SETS = ("cpython_stdlib_functions", "cpython_stdlib_pytokens")


def pools_alone(sizes: np.ndarray, budget: float) -> int:
    """Batches of the default pools packed one by one (no cross-pool pass)."""
    ctx = Context(fitbatch.as_sizes(sizes), budget, fitbatch.resolve_cost("sum"), None, 1, True, 0, 0)
    order, seg_starts, _ = _pooled_layout(ctx, fitbatch.Packed().pool_size)
    _, starts = two_ended_starts(ctx.sizes.values[order], seg_starts, budget)
    return int(starts.size)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--budgets", type=float, nargs="+", default=[4096, 16384, 65536])
    args = p.parse_args(argv)
    print("| set | budget | lower bound | packed | vs bound | pools alone | vs bound | plan s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in SETS:
        base = load(name)
        for budget in args.budgets:
            sizes = resample(base[base <= budget], args.n)
            t0 = time.perf_counter()
            plan = fitbatch.plan_batches(sizes, budget, cost="sum", strategy="packed")
            seconds = time.perf_counter() - t0
            bound = plan.stats().lower_bound
            alone = pools_alone(sizes, budget)
            print(
                f"| {name.removeprefix('cpython_stdlib_')} | {budget:g} | {bound:,} | {len(plan):,} | {len(plan) / bound:.5f} "
                f"| {alone:,} | {alone / bound:.5f} | {seconds:.2f} |"
            )


if __name__ == "__main__":
    main()
