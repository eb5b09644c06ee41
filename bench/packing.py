"""Packing quality: ``packed`` (sum cost) batches against lower bounds of bin packing.

Run from the repository root:

    python bench/packing.py              # 1M samples per real set, three budgets (about 20 s)
    python bench/packing.py --n 200000
    python bench/packing.py --wikipedia    # Krell et al. 2021's Wikipedia-512 histogram, 16.3M sequences
    python bench/packing.py --wikipedia --first-call  # its first plan in fresh interpreters (about a minute)

``--wikipedia`` rebuilds the sequence-length histogram Krell et al. (2021, "Efficient Sequence
Packing without Cross-contamination") published for their Wikipedia pre-training data from its
counts (``bench/data/wikipedia512_histogram.txt``: source and licence there), expands it to one
length per sequence, shuffles it (seed 0) and packs it at budget 512 with the sum cost, indices
assigned, beside the bound ceil(tokens / 512) and the authors' published pack counts.

For each real length set (resampled with seed 0, samples over the budget left out) and budget it
prints the batch count of the ``packed`` plan over two lower bounds: ceil(sum / budget) (L1) and
Martello and Toth's L2 (samples over half the budget need a batch each, and the samples between
a threshold and half the budget need what the room beside those cannot hold, maximised over
thresholds), beside the same pools packed without the cross-pool pass (each pool's first-fit
packing alone) and the plan time.
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
from fitbatch._kernels import packing_depth as PD  # noqa: E402
from fitbatch._kernels import pattern_layout as L  # noqa: E402
from fitbatch._kernels.histogram import histogram_plan, placements  # noqa: E402
from fitbatch._kernels.packing import first_fit_starts  # noqa: E402
from fitbatch.plan._batch_plan import _measure_kinds  # noqa: E402
from fitbatch.strategies._base import Context, _pooled_layout  # noqa: E402

SETS = ("cpython_stdlib_functions", "cpython_stdlib_pytokens")


def pools_alone(sizes: np.ndarray, budget: float) -> int:
    """Batches of the default pools packed one by one (no cross-pool pass)."""
    ctx = Context(fitbatch.as_sizes(sizes), budget, fitbatch.costs.resolve_cost("sum"), None, 1, True, 0, 0)
    order, seg_starts, _ = _pooled_layout(ctx, fitbatch.Packed().pool_size)
    _, starts = first_fit_starts(ctx.sizes.values[order], seg_starts, budget)
    return int(starts.size)


def martello_toth_l2(sizes: np.ndarray, budget: float) -> int:
    """Martello and Toth's L2 lower bound on the number of bins (every size <= budget).

    >>> martello_toth_l2(np.array([6.0, 6, 6, 1]), 10.0)  # L1 = 2: three samples over half
    3
    """
    s = np.sort(np.asarray(sizes, dtype=np.float64))
    csum = np.concatenate([[0.0], np.cumsum(s)])
    thresholds = np.unique(np.concatenate([[0.0], s[s <= budget / 2]]))
    half = np.searchsorted(s, budget / 2, "right")  # s[:half] <= budget / 2
    top = np.searchsorted(s, budget - thresholds, "right")  # s[top:] > budget - threshold: alone
    low = np.minimum(np.searchsorted(s, thresholds, "left"), half)  # s[low:half]: in [threshold, budget / 2]
    over_half = top - half  # in (budget / 2, budget - threshold]: one per batch, room beside them
    room = over_half * budget - (csum[top] - csum[half])
    extra = np.maximum(0.0, np.ceil((csum[half] - csum[low] - room) / budget))
    l1 = int(np.ceil(csum[-1] / budget))
    return max(l1, int(np.max(s.size - top + over_half + extra)))


WIKIPEDIA = Path(__file__).resolve().parent / "data" / "wikipedia512_histogram.txt"
# packs the authors report for their histogram packers on it (Krell et al. 2021, tables and code
# output; depth = most sequences per pack), and fitbatch's before the histogram path (issue 39)
PUBLISHED = {"NNLSHP, depth 3 (published)": 8_155_057, "LPFHP, depth 12 (published)": 8_149_619,
             "LPFHP, depth 16 (published)": 8_140_006,
             "fitbatch before the histogram path (per-sample first fit in pools; 4.3 s, issue #39)": 8_138_627}


def wikipedia_lengths(seed: int = 0) -> np.ndarray:
    """One length per sequence of the Wikipedia-512 histogram, shuffled."""
    lines = [line for line in WIKIPEDIA.read_text().splitlines() if line and not line.startswith("#")]
    counts = np.array([int(x) for x in lines], dtype=np.int64)
    lengths = np.repeat(np.arange(1, counts.size + 1, dtype=np.int64), counts)
    return lengths[np.random.default_rng(seed).permutation(lengths.size)]


def wikipedia(repeat: int) -> None:
    """Pack the Wikipedia-512 histogram: packs, the bound, time (best of ``repeat``, warm), and
    the parts of the default plan timed alone."""
    sizes = wikipedia_lengths()
    bound = -(-int(sizes.sum()) // 512)
    best, cpu, plan = float("inf"), float("inf"), None
    for epoch in range(repeat):
        plan = None
        t0, c0 = time.perf_counter(), time.process_time()
        plan = fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", epoch=epoch)
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    assert plan is not None
    counts = np.bincount(sizes, minlength=513)
    # the parts alone: the patterns (uncached), the positions drawn within each length, the layout
    c0 = time.process_time()
    patterns = PD._repaired(PD.histogram_patterns(counts, 512, None, "large"), 512)
    patterns_cpu = time.process_time() - c0
    c0 = time.process_time()
    converted = fitbatch.as_sizes(sizes)
    convert_cpu = time.process_time() - c0
    ctx = Context(converted, 512.0, fitbatch.costs.resolve_cost("sum"), None, 1, True, 0, 0)
    c0 = time.process_time()
    keys = ctx.keys()[0]
    ctx.key_counts()
    keys_cpu = time.process_time() - c0
    steps = {"sizes converted and checked (as_sizes: int64 -> float64)": convert_cpu,
             "size keys and their counts (16-bit, compiled count)": keys_cpu,
             **layout_parts(keys, counts, patterns, ctx)}
    # the histogram first fit (the default before) and every sample's place, alone
    laid = np.sort(sizes)[::-1].astype(np.uint16)
    c0 = time.process_time()
    parts, starts = histogram_plan(laid, 512.0)
    for _a, _b, _dest in placements(parts, starts, laid.size):
        pass
    pack_cpu = time.process_time() - c0
    print(f"Wikipedia-512 (Krell et al. 2021): {sizes.size:,} sequences, {int(sizes.sum()):,} tokens, bound {bound:,} packs\n")
    print("| packer | packs | vs bound | wall s | CPU s |")
    print("|---|---:|---:|---:|---:|")
    print(f"| fitbatch packed, sum cost: plan_batches (draw, pack, indices in the drawn batch order, measures) | {len(plan):,} | "
          f"{len(plan) / bound:.5f} | {best:.2f} | {cpu:.2f} |")
    print(f"| - its patterns alone (\"large\" rule, loose ends re-packed; cached across calls) | {PD._batches(patterns):,} | | | {patterns_cpu:.2f} |")
    for label, seconds in steps.items():
        print(f"| - {label} | | | | {seconds:.2f} |")
    print(f"| fitbatch before: the histogram's first fit and every sample's place alone | {starts.size:,} | {starts.size / bound:.5f} | | {pack_cpu:.2f} |")
    for name, packs in PUBLISHED.items():
        print(f"| {name} | {packs:,} | {packs / bound:.5f} | | |")


def layout_parts(keys: np.ndarray, counts: np.ndarray, patterns: list, ctx: Context, repeat: int = 3) -> dict[str, float]:
    """CPU s of the layout's steps alone (:mod:`fitbatch._kernels.pattern_layout`, best of
    ``repeat``: the first touch of fresh memory costs the first run more)."""
    loops = L._loops(keys.size)
    names = ("positions grouped by length (stable counting sort)",
             "positions drawn within each length (Generator.shuffle of each block)",
             "batch sequence drawn (one label per batch: pieces' counts, then Generator.shuffle)",
             "batches written in that sequence (order, offsets)",
             "per-batch costs from the batches' patterns (padded units gathered when read)")
    best = dict.fromkeys(names, float("inf"))
    tables = L._tables(counts, patterns, keys.size)
    bounds = np.concatenate([[0], np.cumsum(counts[::-1])]).astype(np.int64)
    for _ in range(repeat):
        took = [time.process_time()]
        by_length = L._grouped(keys, counts, 512, loops)
        took.append(time.process_time())
        L._shuffle(by_length, bounds, ctx.rng("packed-histogram"), loops)
        took.append(time.process_time())
        labels = L._sequence(tables.times, ctx.rng("batch-order"), loops)
        took.append(time.process_time())
        written = L._written(labels, by_length, counts, tables, loops)
        took.append(time.process_time())
        kinds = (labels, tables.width, tables.longest, tables.total)
        costs, _, padded = _measure_kinds(ctx.cost, kinds, later=True)
        took.append(time.process_time())
        del by_length, labels, written, costs, padded
        for name, a, b in zip(names, took[:-1], took[1:]):
            best[name] = min(best[name], b - a)
    return best


FIRST_CALL = """
import sys, time
sys.path.insert(0, {bench!r})
from packing import wikipedia_lengths
sizes = wikipedia_lengths()
import fitbatch
cpu, wall = [], []
for epoch in range(3):
    c0, w0 = time.process_time(), time.perf_counter()
    fitbatch.plan_batches(sizes, 512, cost="sum", strategy="packed", epoch=epoch)
    cpu.append(time.process_time() - c0)
    wall.append(time.perf_counter() - w0)
print(*cpu, *wall)
"""


def first_call() -> None:
    """The first Wikipedia-512 plan of a fresh interpreter against the next two (CPU s of every
    thread, numba's background load included, and wall s), with
    numba's cache as it is, with an empty one (a fresh install compiles), and without numba."""
    import os
    import subprocess
    import tempfile

    print("| process | first plan CPU s | second | third | first - best warm (CPU) | first plan wall s | first - best warm (wall) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as empty:
        for label, extra in (("numba, cached machine code", {}), ("numba, empty cache (fresh install)", {"NUMBA_CACHE_DIR": empty}),
                             ("FITBATCH_JIT=0 (numpy only)", {"FITBATCH_JIT": "0"})):
            code = FIRST_CALL.format(bench=str(Path(__file__).resolve().parent))
            out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **extra}, capture_output=True, text=True, check=True)
            first, second, third, w1, w2, w3 = (float(x) for x in out.stdout.split())
            print(f"| {label} | {first:.2f} | {second:.2f} | {third:.2f} | {first - min(second, third):+.2f} "
                  f"| {w1:.2f} | {w1 - min(w2, w3):+.2f} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--budgets", type=float, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--wikipedia", action="store_true", help="pack Krell et al.'s Wikipedia-512 histogram instead")
    p.add_argument("--repeat", type=int, default=3, help="--wikipedia: best of this many plans")
    p.add_argument("--first-call", action="store_true", help="--wikipedia: first plan of fresh interpreters against warm ones")
    args = p.parse_args(argv)
    if args.wikipedia and args.first_call:
        first_call()
        return
    if args.wikipedia:
        wikipedia(args.repeat)
        return
    print("| set | budget | L1 | L2 | packed | vs L2 | pools alone | vs L2 | plan s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in SETS:
        base = load(name)
        for budget in args.budgets:
            sizes = resample(base[base <= budget], args.n)
            t0 = time.perf_counter()
            plan = fitbatch.plan_batches(sizes, budget, cost="sum", strategy="packed")
            seconds = time.perf_counter() - t0
            l1 = plan.stats().lower_bound
            bound = martello_toth_l2(sizes, budget)
            alone = pools_alone(sizes, budget)
            print(
                f"| {name.removeprefix('cpython_stdlib_')} | {budget:g} | {l1:,} | {bound:,} | {len(plan):,} | "
                f"{len(plan) / bound:.5f} | {alone:,} | {alone / bound:.5f} | {seconds:.2f} |"
            )


if __name__ == "__main__":
    main()
