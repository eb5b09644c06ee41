"""Streaming benchmark: ``fitbatch.streaming.batch_stream`` against the seed's greedy loop and lhotse.

Run from the repository root:

    python bench/stream.py              # 1M items per real length set (about a minute)
    python bench/stream.py --n 200000   # quicker

The stream is a pre-built list of item ids (so building the source is not timed) whose size is
looked up in the real length sets (resampled to ``--n``, items over the budget left out). Rows:

* seed greedy loop: bionemo's ``size_aware_batching`` algorithm, pure Python, one ``sizeof`` call
  per item, a sum budget (the seed's semantics);
* ``batch_stream`` ``sequential`` with ``sizeof`` (one call per item) and with ``sizeof_batch``
  (one call per chunk), sum and padded costs; ``sequential``/sum yields the seed's batches;
* ``batch_stream`` ``buckets`` (padded cost, ``buffer_size=10_000``);
* lhotse's ``DynamicBucketingSampler`` (sum of durations = ``max_duration``, ``buffer_size=10_000``,
  30 buckets, no shuffle) on the first ``--lhotse-n`` items, when lhotse is installed.

items/s is the best of ``--repeat`` runs; padding efficiency is sum(sizes) / sum(count x max)
over the batches (what a padded batch wastes), whatever the cost the batches were planned with.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

import fitbatch
from fitbatch.streaming import batch_stream

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, seed_greedy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETS = ("cpython_stdlib_functions", "cpython_stdlib_pytokens")
BUDGET = 16384.0
BUFFER = 10_000






def padding_efficiency(batches: list[list[int]], sizes: np.ndarray) -> float:
    real = padded = 0.0
    for b in batches:
        s = sizes[b]
        real += float(s.sum())
        padded += len(b) * float(s.max())
    return real / padded if padded else 1.0


def best(fn: Callable[[], Iterable[list[int]]], repeat: int) -> tuple[float, list[list[int]]]:
    """Best time to consume the batches (counted, not kept), and the batches of an untimed run."""
    t_best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        count = 0
        for batch in fn():
            count += len(batch)
        t_best = min(t_best, time.perf_counter() - t0)
    return t_best, list(fn())


def lhotse_row(sizes: np.ndarray) -> tuple[float, list[list[int]]] | None:
    try:
        from lhotse import CutSet
        from lhotse.dataset.sampling.dynamic_bucketing import DynamicBucketingSampler
        from lhotse.testing.dummies import dummy_cut
    except Exception:  # noqa: BLE001 - any import problem means "not available"
        return None
    cuts = CutSet.from_cuts(dummy_cut(i, duration=float(d)) for i, d in enumerate(sizes))
    sampler = DynamicBucketingSampler(
        cuts, max_duration=BUDGET, shuffle=False, num_buckets=30, buffer_size=BUFFER, quadratic_duration=None
    )
    t0 = time.perf_counter()
    batches = [[int(c.id.split("-")[-1]) if "-" in c.id else int(c.id) for c in b] for b in sampler]
    return time.perf_counter() - t0, batches


def table(name: str, sizes: np.ndarray, repeat: int, lhotse_n: int) -> str:
    n = sizes.size
    items = list(range(n))
    lookup = sizes.tolist()
    by_chunk = lambda ids: sizes[np.asarray(ids, dtype=np.int64)]  # noqa: E731

    def stream(strategy: str, cost: str, vectorised: bool) -> Callable[[], Iterable[list[int]]]:
        kw = {"sizeof_batch": by_chunk} if vectorised else {"sizeof": lookup.__getitem__}
        return lambda: batch_stream(items, budget=BUDGET, cost=cost, strategy=strategy, buffer_size=BUFFER, **kw)

    t_seed, seed_batches = best(lambda: seed_greedy(items, lookup.__getitem__, BUDGET), repeat)
    rows = [("seed greedy loop (pure Python, sizeof per item)", "sum", t_seed, seed_batches, n)]
    cases = [
        ("sequential, sizeof per item", "sequential", "sum", False),
        ("sequential, sizeof_batch per chunk", "sequential", "sum", True),
        ("sequential, sizeof_batch per chunk", "sequential", "padded", True),
        ("buckets, sizeof per item", "buckets", "padded", False),
        ("buckets, sizeof_batch per chunk", "buckets", "padded", True),
    ]
    for label, strategy, cost, vectorised in cases:
        t, batches = best(stream(strategy, cost, vectorised), repeat)
        if strategy == "sequential" and cost == "sum":
            assert batches == seed_batches, "sequential/sum must yield the seed's batches"
        rows.append((f"batch_stream {label}", cost, t, batches, n))
    got = lhotse_row(sizes[:lhotse_n])
    if got is not None:
        rows.append((f"lhotse DynamicBucketingSampler (first {min(n, lhotse_n):,} items)", "sum", got[0], got[1], min(n, lhotse_n)))
    lines = [
        f"\n### {name}, {n:,} items (budget {BUDGET:g}, buffer_size {BUFFER:,})\n",
        "| batcher | cost | items/s | vs seed loop | batches | padding eff |",
        "|---|---|---|---|---|---|",
    ]
    seed_rate = n / t_seed
    for label, cost, t, batches, count in rows:
        rate = count / t
        lines.append(
            f"| {label} | {cost} | {rate / 1e6:.2f} M | {rate / seed_rate:.2f}x | {len(batches):,} | "
            f"{padding_efficiency(batches, sizes):.4f} |"
        )
    if got is None:
        lines.append("| lhotse DynamicBucketingSampler | – | not installed | | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000, help="items per set (resampled)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lhotse-n", type=int, default=200_000, help="items given to lhotse (its cuts are slow to build)")
    args = parser.parse_args()
    logging.getLogger("fitbatch").setLevel(logging.ERROR)
    print(f"fitbatch {fitbatch.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} cores")
    for name in SETS:
        base = load(name).astype(np.float64)
        sizes = base[np.random.default_rng(0).integers(0, base.size, args.n)]
        sizes = sizes[sizes <= BUDGET]
        print(table(name, sizes, args.repeat, args.lhotse_n), flush=True)


if __name__ == "__main__":
    main()
