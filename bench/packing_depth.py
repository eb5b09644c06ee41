"""Depth-limited packing on Krell et al.'s Wikipedia-512 histogram, beside the authors' figures.

Run from the repository root (about a minute; 16 M lengths are expanded once):

    python bench/packing_depth.py
    python bench/packing_depth.py --caps 3 12      # some caps only

The histogram (``bench/_wiki512.py``: 16,279,552 sequences of at most 512 tokens, source and
licence there) is expanded to one length per sequence, shuffled (seed 0), and planned with
``plan_batches(lengths, 512, cost="sum", strategy="packed", max_batch_size=k)``. Printed per cap:
the packs of the histogram patterns (``best_patterns``) and their ratio to the bound
ceil(tokens / 512), the packs the authors report at that depth where they report one, the packs
of ``plan_batches`` (the patterns' under a cap; without one, the ``"large"`` rule's alone with its
loose ends re-packed, ``quick_patterns``), its time, the patterns' time alone, and for the ``--first-fit`` caps the
packs and time without this module (first-fit decreasing: over pools under a cap, on the
histogram without one), in the same run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _wiki512 as wiki  # noqa: E402

import fitbatch  # noqa: E402
from fitbatch._kernels.packing_depth import best_patterns  # noqa: E402
from fitbatch.strategies import _ordered  # noqa: E402


def first_fit(lengths: np.ndarray, cap: int | None) -> tuple[int, float]:
    """Packs and seconds of the path before this module: first-fit decreasing (over pools under a
    cap, on the histogram without one)."""
    keep, quick = _ordered._on_histogram, _ordered._quick_patterns
    _ordered._on_histogram = lambda ctx: False
    _ordered._quick_patterns = lambda ctx, edges: None
    try:
        t0 = time.perf_counter()
        plan = fitbatch.plan_batches(lengths, 512, cost="sum", strategy="packed", max_batch_size=cap)
        return len(plan), time.perf_counter() - t0
    finally:
        _ordered._on_histogram, _ordered._quick_patterns = keep, quick


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--caps", type=int, nargs="*", default=[0, 16, 12, 8, 3, 2], help="0 = no cap")
    p.add_argument("--first-fit", type=int, nargs="*", default=[0, 3], help="caps also planned by first-fit (0 = no cap)")
    args = p.parse_args(argv)
    bound = -(-wiki.tokens() // wiki.MAX_LENGTH)
    lengths = wiki.lengths(seed=0)
    counts = np.concatenate([[0], wiki.COUNTS])
    print(f"Wikipedia-512: {lengths.size:,} sequences, bound ceil(tokens / 512) = {bound:,} packs\n")
    print("| most per pack | packs (patterns) | vs bound | authors' best at that depth | plan_batches packs | plan s (indices) "
          "| patterns only s | without this module: packs / s |")
    print("|---:|---:|---:|---|---:|---:|---:|---|")
    for cap in args.caps:
        k = cap or None
        t0 = time.perf_counter()
        plan = fitbatch.plan_batches(lengths, 512, cost="sum", strategy="packed", max_batch_size=k)
        seconds = time.perf_counter() - t0
        assert plan.stats().max_fill <= 1.0
        t0 = time.perf_counter()
        packs = sum(t for t, _ in best_patterns(counts, 512, k))
        hist_s = time.perf_counter() - t0
        name, theirs = wiki.PUBLISHED.get(cap, ("", 0))
        ref = f"{name} {theirs:,} ({theirs / bound:.5f}x)" if theirs else "–"
        planned = len(plan)
        assert k is None or packs == planned  # without a cap the quick patterns plan (one rule)
        del plan
        before = "–"
        if cap in args.first_fit:
            ff, ff_s = first_fit(lengths, k)
            before = f"{ff:,} ({ff / bound:.5f}x) / {ff_s:.2f}"
        print(f"| {cap or 'no cap'} | {packs:,} | {packs / bound:.6f} | {ref} | {planned:,} | {seconds:.2f} | {hist_s:.2f} | {before} |",
              flush=True)


if __name__ == "__main__":
    main()
