"""Several limits: plan time of ``plan_batches`` with 2 limits (tokens and images) vs 1 (tokens).

Run from the repository root:

    python bench/limits.py               # 1,000,000 samples, best of 3
    python bench/limits.py --n 200000 --repeat 1

Tokens are 1,000,000 lengths resampled (seed 0) from the CPython stdlib function lengths; the
image column is synthetic (the data has none): 0-4 images per sample from a seeded generator,
each image adding 256 tokens to the sample's length. One limit: tokens only (1-D sizes, budget
16384, padded cost). Two limits: ``{"tokens": 16384 padded, "images": 48 sum}``. Prints a
markdown table per strategy: plan time (best of ``--repeat``, plan + order/offsets), batches,
lower bound, mean fill of each limit and padding efficiency (of the tokens column).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import best_time, load, resample  # noqa: E402

import fitbatch  # noqa: E402

STRATEGIES = ("sequential", "sorted", "pooled", "buckets", "packed")
TOKENS, IMAGES = 16384, 48


def best_of(repeat: int, plan_it) -> tuple[float, fitbatch.BatchPlan]:
    """The fastest of ``repeat`` plans, each with its batch order materialised."""

    def planned() -> fitbatch.BatchPlan:
        plan = plan_it()
        _ = plan.order, plan.offsets
        return plan

    return best_time(planned, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    lengths = resample(load("cpython_stdlib_functions").astype(np.int64), args.n, seed=0)
    images = np.random.default_rng(1).integers(0, 5, lengths.size)
    tokens = lengths + 256 * images
    columns = {"tokens": tokens, "images": images}
    budgets = {"tokens": TOKENS, "images": IMAGES}
    print(
        f"{args.n:,} samples, budget tokens {TOKENS} (padded) / images {IMAGES} (sum), best of {args.repeat}\n"
    )
    print(
        "| strategy | 1 limit: time | batches | 2 limits: time | batches | lower bound "
        "| fill tokens / images | padding efficiency | 2 vs 1 time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for strategy in STRATEGIES:
        t1, one = best_of(
            args.repeat,
            lambda s=strategy: fitbatch.plan_batches(tokens, TOKENS, strategy=s, seed=0),
        )
        t2, two = best_of(
            args.repeat,
            lambda s=strategy: fitbatch.plan_batches(
                columns, budgets, cost={"images": "sum"}, strategy=s, seed=0
            ),
        )
        fill = two.stats().fill_by_limit or {}
        print(
            f"| {strategy} | {t1:.3f} s | {len(one):,} | {t2:.3f} s | {len(two):,} | {two.lower_bound:,} | "
            f"{fill['tokens']:.3f} / {fill['images']:.3f} | {two.stats().padding_efficiency:.3f} | {t2 / t1:.1f}x |"
        )


if __name__ == "__main__":
    main()
