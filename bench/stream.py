"""Streaming benchmark: ``fitbatch.streaming.batch_stream`` against the seed's greedy loop and lhotse.

Run from the repository root:

    python bench/stream.py              # 1M items per real length set (a few minutes)
    python bench/stream.py --n 200000   # quicker
    python bench/stream.py --tails      # only bucket padding on long tails, seeded and not (seconds)
    python bench/stream.py --tails --families --n 200000  # also the held-out sets (issue #39)

Two kinds of stream, both pre-built lists (building the source is not timed), sizes from the real
length sets (resampled to ``--n``, items over the budget left out):

* ``ids``: items are sample ids and ``sizeof`` looks the size up in a Python list, the cheapest
  ``sizeof`` there is (a C call per item), so the hardest case for anything against the seed loop;
  ``sizeof=per_chunk(fn)`` indexes a numpy array with the chunk of ids;
* ``records``: items are dicts ``{"input_ids": array}`` as a tokenized streaming dataset yields
  them (the arrays are views of one buffer) and ``sizeof`` is ``len(item["input_ids"])``, a
  Python function per item as in the seed's documentation; ``per_chunk(fn)`` maps ``len`` over
  the chunk's arrays in C.

Rows:

* seed greedy loop: bionemo's ``size_aware_batching`` algorithm, pure Python, one ``sizeof`` call
  per item, a sum budget (the seed's semantics); bionemo's installed function too when importable;
* ``batch_stream`` ``sequential`` with ``sizeof`` (one call per item) and with ``sizeof=per_chunk(fn)``
  (one call per chunk), sum and padded costs, with the ``fast`` extra (numba) and without it
  (``FITBATCH_JIT=0``: numpy only); ``sequential``/sum yields the seed's batches (checked);
* ``batch_stream`` ``buckets`` (padded cost, ``buffer_size=10_000``);
* lhotse's ``DynamicBucketingSampler`` (sum of durations = ``max_duration``, ``buffer_size=10_000``,
  30 buckets, no shuffle) on the first ``--lhotse-n`` items, when lhotse is installed.

items/s is the best of ``--repeat`` runs; padding efficiency is sum(sizes) / sum(count x max)
over the batches (what a padded batch wastes), whatever the cost the batches were planned with.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import logging
import operator
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

import fitbatch
import fitbatch._kernels.jit
from fitbatch.costs import SumCost
from fitbatch.plan._planner import measure_batches
from fitbatch.sizes import Sizes, as_sizes
from fitbatch.streaming import batch_stream

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, resample, seed_greedy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETS = ("cpython_stdlib_functions", "cpython_stdlib_pytokens")
BUDGET = 16384.0
BUFFER = 10_000
JIT = fitbatch._kernels.jit.enabled()  # loads the compiled loops now when numba is installed


def fingerprint(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Batches as two arrays (lengths, ids in order): nothing kept for the GC to walk later."""
    return np.fromiter(map(len, ids), np.int64), np.fromiter(itertools.chain.from_iterable(ids), np.int64)


def padding_efficiency(batches: tuple[np.ndarray, np.ndarray], sizes: Sizes) -> float:
    """sum(sizes) / sum(count x max) over ``fingerprint`` batches (the library's batch measures)."""
    lengths, order = batches
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    _, _, real, padded = measure_batches(sizes, SumCost(), order, offsets)
    return float(real.sum() / padded.sum()) if padded.sum() else 1.0


def best(fn: Callable[[], Iterable[list[int]]], repeat: int) -> tuple[float, list[list[int]]]:
    """Best time to consume the batches (counted, not kept), and the batches of an untimed run.

    Each run starts after a full collection with no earlier row's batches alive, so the garbage
    collector (left on, as in training) walks the same heap for every row.
    """
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


class Stream:
    """One kind of source: its items, a per-item ``sizeof``, a per-chunk one, item -> id."""

    def __init__(self, kind: str, sizes: np.ndarray) -> None:
        self.kind = kind
        n = sizes.size
        if kind == "ids":
            self.items: list[Any] = list(range(n))
            lookup = sizes.tolist()
            self.sizeof: Callable[[Any], float] = lookup.__getitem__
            self.sizeof_batch: Callable[[list[Any]], Any] = lambda ids: sizes[np.asarray(ids, dtype=np.int64)]
            self.ids: Callable[[list[Any]], list[int]] = lambda batch: batch
        else:
            lengths = sizes.astype(np.int64)
            tokens = np.zeros(int(lengths.max()) + 1, dtype=np.int32)  # every record views one buffer
            self.items = [{"id": i, "input_ids": tokens[:length]} for i, length in enumerate(lengths.tolist())]
            self.sizeof = lambda record: len(record["input_ids"])
            ids_of = operator.itemgetter("input_ids")
            self.sizeof_batch = lambda chunk: np.fromiter(map(len, map(ids_of, chunk)), np.float64, len(chunk))
            self.ids = lambda batch: [record["id"] for record in batch]


def bionemo_loop() -> Callable[..., Iterable[list[Any]]] | None:
    try:
        from bionemo.size_aware_batching.sampler import size_aware_batching
    except Exception:  # noqa: BLE001 - any import problem means "not available"
        return None
    return size_aware_batching


def table(name: str, sizes: np.ndarray, kind: str, repeat: int, lhotse_n: int) -> str:
    n = sizes.size
    src = Stream(kind, sizes)

    def stream(strategy: str, cost: str, vectorised: bool) -> Callable[[], Iterable[list[Any]]]:
        kw: dict[str, Any] = {"sizeof": fitbatch.streaming.per_chunk(src.sizeof_batch) if vectorised else src.sizeof}
        return lambda: batch_stream(src.items, budget=BUDGET, cost=cost, strategy=strategy, buffer_size=BUFFER, **kw)

    measured = as_sizes(sizes)

    def row(label: str, cost: str, t: float, ids: list[list[int]], count: int) -> tuple[Any, ...]:
        return (label, cost, t, len(ids), padding_efficiency(fingerprint(ids), measured), count)

    t_seed, seed_batches = best(lambda: seed_greedy(src.items, src.sizeof, BUDGET), repeat)
    seed_ids = [src.ids(b) for b in seed_batches]
    del seed_batches
    seed_print = fingerprint(seed_ids)
    rows = [row("seed greedy loop (pure Python, sizeof per item)", "sum", t_seed, seed_ids, n)]
    del seed_ids
    original = bionemo_loop()
    if original is not None:
        t, batches = best(lambda: original(src.items, src.sizeof, BUDGET), repeat)
        ids = [src.ids(b) for b in batches]
        assert all(np.array_equal(a, b) for a, b in zip(fingerprint(ids), seed_print))
        rows.append(row("bionemo size_aware_batching (installed)", "sum", t, ids, n))
    cases = [
        ("sequential, sizeof per item", "sequential", "sum", False, True),
        ("sequential, sizeof per item, numpy only", "sequential", "sum", False, False),
        ("sequential, sizeof=per_chunk(fn)", "sequential", "sum", True, True),
        ("sequential, sizeof=per_chunk(fn), numpy only", "sequential", "sum", True, False),
        ("sequential, sizeof=per_chunk(fn)", "sequential", "padded", True, True),
        ("sequential, sizeof=per_chunk(fn), numpy only", "sequential", "padded", True, False),
        ("buckets, sizeof per item", "buckets", "padded", False, True),
        ("buckets, sizeof=per_chunk(fn)", "buckets", "padded", True, True),
    ]
    for label, strategy, cost, vectorised, compiled in cases:
        if compiled and not JIT:
            continue  # numba not installed: the numpy-only rows say it all
        os.environ["FITBATCH_JIT"] = "1" if compiled else "0"
        try:
            t, batches = best(stream(strategy, cost, vectorised), repeat)
        finally:
            os.environ.pop("FITBATCH_JIT", None)
        ids = [src.ids(b) for b in batches]
        del batches
        if strategy == "sequential" and cost == "sum":
            got_print = fingerprint(ids)
            assert all(np.array_equal(a, b) for a, b in zip(got_print, seed_print)), "sequential/sum must yield the seed's batches"
        rows.append(row(f"batch_stream {label}", cost, t, ids, n))
        del ids
    got = lhotse_row(sizes[:lhotse_n]) if kind == "ids" and lhotse_n else None
    if got is not None:
        m = min(n, lhotse_n)
        rows.append(row(f"lhotse DynamicBucketingSampler (first {m:,} items)", "sum", got[0], got[1], m))
    lines = [
        f"\n### {name}, {kind}, {n:,} items (budget {BUDGET:g}, buffer_size {BUFFER:,})\n",
        "| batcher | cost | items/s | vs seed loop | batches | padding eff |",
        "|---|---|---|---|---|---|",
    ]
    seed_rate = n / t_seed
    for label, cost, t, n_batches, efficiency, count in rows:
        rate = count / t
        lines.append(
            f"| {label} | {cost} | {rate / 1e6:.2f} M | {rate / seed_rate:.2f}x | {n_batches:,} | {efficiency:.4f} |"
        )
    if kind == "ids" and lhotse_n and got is None:
        lines.append("| lhotse DynamicBucketingSampler | – | not installed | | | |")
    return "\n".join(lines)


def tails_table(n: int, with_families: bool = False, seeds: tuple = (False, 1)) -> str:
    """Padding efficiency of ``buckets`` streams, unshuffled and with ``seed=1``, on the real sets
    and, in addition, synthetic long tails (issue #18: >= 0.95 on long-tailed data); with
    ``with_families`` also the held-out sets of ``bench/_families.py`` (issue #39). Beside each:
    the padding efficiency of exact sorting over the whole set (``sorted`` plan), which no stream
    planner exceeds by more than the greedy cut's slack (an upper bound in practice)."""
    rng = np.random.default_rng(3)
    sets = {name: resample(load(name), n).astype(np.float64) for name in SETS}
    sets["synthetic lognormal(3.0, 1.0) (quotation-like)"] = np.clip(np.round(rng.lognormal(3.0, 1.0, n)), 2, None)
    sets["synthetic lognormal(5.0, 1.5)"] = np.clip(np.round(rng.lognormal(5.0, 1.5, n)), 1, None)
    sets["synthetic Pareto(1.2) x 20"] = np.round(20 * (1 + rng.pareto(1.2, n)))
    if with_families:
        from _families import families, local_real

        sets.update(families(n))
        sets.update(local_real(n))
    rows = []
    for name, sizes in sets.items():
        sizes = sizes[sizes <= BUDGET]
        exact = fitbatch.plan_batches(sizes, BUDGET, strategy="sorted").stats().padding_efficiency
        for seed in seeds:
            stream = batch_stream(range(sizes.size), sizeof=sizes.__getitem__, budget=BUDGET, strategy="buckets", seed=seed)
            real = padded = batches = 0.0
            for batch in stream:
                got = sizes[np.asarray(batch)]
                real, padded, batches = real + got.sum(), padded + got.size * got.max(), batches + 1
            rows.append(f"| {name} | {sizes.size:,} | {seed} | {int(batches):,} | {real / padded:.4f} | {exact:.4f} |")
            print(rows[-1], file=sys.stderr, flush=True)
    head = (
        f"\n### Bucket streams on long tails (budget {BUDGET:g}, buffer_size {BUFFER:,}, padded cost)\n\n"
        "| set | items | seed | batches | padding eff | exact sorting, whole set |\n|---|---|---|---|---|---|"
    )
    return "\n".join([head, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000, help="items per set (resampled)")
    parser.add_argument("--families", action="store_true", help="--tails: add the held-out sets (bench/_families.py), unseeded only")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lhotse-n", type=int, default=200_000, help="items given to lhotse (its cuts are slow to build; 0: none)")
    parser.add_argument("--kinds", default="ids,records", help="which streams: ids, records or both")
    parser.add_argument("--tails", action="store_true", help="only the bucket-padding table on long tails")
    args = parser.parse_args()
    logging.getLogger("fitbatch").setLevel(logging.ERROR)
    if args.tails:
        print(tails_table(args.n, args.families, (False,) if args.families else (False, 1)), flush=True)
        return
    numba = "numba " + version("numba") + " (fast extra)" if JIT else "numba not installed"
    print(f"fitbatch {fitbatch.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} cores, {numba}")
    for name in SETS:
        base = load(name).astype(np.float64)
        sizes = base[np.random.default_rng(0).integers(0, base.size, args.n)]
        sizes = sizes[sizes <= BUDGET]
        for kind in args.kinds.split(","):
            print(table(name, sizes, kind, args.repeat, args.lhotse_n), flush=True)


if __name__ == "__main__":
    main()
