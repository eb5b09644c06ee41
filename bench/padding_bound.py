"""The best padding efficiency any plan reaches with at most 1.05x the sorted batch count.

Run from the repository root (about two minutes, most of it lhotse and the 20k programmes):

    python bench/padding_bound.py                      # synthetic shapes at 10k and 20k
    python bench/padding_bound.py --n 10000 --real     # the real sets too
    python bench/padding_bound.py --no-lhotse

Issue #18 asks the default plan to pad no more than lhotse's ``DynamicBucketingSampler`` while
using at most 1.05x the batches of exact sorting. On sets of a few tens of batches lhotse pads
little because it uses 1.3-1.7x the batches. This script says whether *any* plan can meet both
conditions, so that a miss is not mistaken for a planner's weakness (or the reverse).

For the padded cost (count x longest <= budget) some optimal plan batches consecutive sizes of
the sorted order: if a batch with the longer maximum holds a sample shorter than one in a batch
with a shorter maximum, swapping the two changes neither batch's maximum upward nor any count, so
no cost grows. An exact dynamic programme over the sorted sizes, with the number of batches as a
dimension, therefore gives the least padded total at every batch count up to ``K``:

    best[k][j] = min over i of best[k - 1][i] + (j - i) * s[j - 1],  (j - i) * s[j - 1] <= budget

Printed per set: the sorted (greedy) batch count ``K0`` and efficiency, the optimum at
``K = floor(1.05 K0)`` batches, lhotse's point measured in the same run, and the co-batch
repeat rate of the optimal cuts between two epochs whose equal sizes are shuffled (1.0 for
continuous sizes: the optimum is one fixed plan).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

import fitbatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, optimal_padded_batches, repeat_rate, resample, synthetic  # noqa: E402

BUDGET = 16384.0


def least_padding(sizes: np.ndarray, budget: float, max_batches: int) -> tuple[float, np.ndarray]:
    """Least padded total (count x longest per batch) over plans of at most ``max_batches``
    batches of consecutive sorted sizes, and the cuts of one such plan (offsets into the sort).

    >>> total, cuts = least_padding(np.array([1.0, 2, 2, 5, 5, 6]), 12.0, 3)
    >>> float(total), cuts.tolist()   # [1, 2, 2] costs 6, [5, 5] 10, [6] 6
    (22.0, [0, 3, 5, 6])
    """
    s = np.sort(np.asarray(sizes, dtype=np.float64))
    n = s.size
    cap = np.floor(budget / s).astype(np.int64)
    lo = np.maximum(np.arange(1, n + 1) - cap, 0)  # first start allowed for a batch ending at j
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    back = np.zeros((max_batches + 1, n + 1), dtype=np.int64)
    totals = [np.inf]
    idx = np.arange(n + 1, dtype=np.float64)
    # Invariant: best[j] is the least padded total of the first j sorted sizes in k - 1 batches
    for k in range(1, max_batches + 1):
        nxt = np.full(n + 1, np.inf)
        for j in range(1, n + 1):
            a = lo[j - 1]
            v = best[a:j] + (j - idx[a:j]) * s[j - 1]
            i = int(np.argmin(v))
            nxt[j], back[k, j] = v[i], a + i
        best = nxt
        totals.append(best[n])
    k = int(np.argmin(totals))
    cuts = [n]
    for kk in range(k, 0, -1):
        cuts.append(int(back[kk, cuts[-1]]))
    return float(totals[k]), np.asarray(cuts[::-1], dtype=np.int64)


def tie_repeat(sizes: np.ndarray, cuts: np.ndarray) -> float:
    """Repeat rate of the cuts between two epochs that order equal sizes at random."""
    plans = []
    for epoch in range(2):
        order = np.lexsort((np.random.default_rng(epoch).random(sizes.size), sizes))
        plans.append(fitbatch.BatchPlan.from_batches(sizes, "padded", order, cuts, budget=BUDGET, strategy_name="optimal cuts"))
    return repeat_rate(plans[0], plans[1], sizes.size)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[10_000, 20_000])
    p.add_argument("--real", action="store_true", help="also the two real length sets")
    p.add_argument("--no-lhotse", action="store_true")
    args = p.parse_args()
    logging.getLogger("fitbatch").setLevel(logging.ERROR)
    if not args.no_lhotse:
        from plan import lhotse_metrics
    print(
        "| N | set | sizes | sorted: batches / eff | optimum at <= 1.05x: batches / eff | repeat of the optimum "
        "| lhotse: eff / batches vs sorted | eff >= lhotse's reachable |\n|---|---|---|---|---|---|---|---|"
    )
    for n in args.n:
        bases = {name.split(" (")[0]: v for name, v in synthetic(n).items()}
        if args.real:
            bases.update({name.removeprefix("cpython_stdlib_"): resample(load(name), n) for name in ("cpython_stdlib_functions", "cpython_stdlib_pytokens")})
        for name, base in bases.items():
            for continuous in (False, True):
                sizes = base + np.random.default_rng(1).random(n) if continuous else base.astype(np.float64)
                sizes = sizes[sizes <= BUDGET]
                k0 = optimal_padded_batches(sizes, BUDGET)
                eff0 = sizes.sum() / fitbatch.plan_batches(sizes, BUDGET, strategy="sorted").padded_units.sum()
                k = int(np.floor(1.05 * k0))
                total, cuts = least_padding(sizes, BUDGET, k)
                eff = sizes.sum() / total
                rep = tie_repeat(sizes, cuts)
                got = None if args.no_lhotse else lhotse_metrics(sizes)
                lh = f"{got[0]:.3f} / {got[1]:.3f}" if got else "-"
                ok = ("yes" if eff >= got[0] else "**no**") if got else "-"
                kind = "continuous" if continuous else "integer"
                print(f"| {n:,} | {name} | {kind} | {k0} / {eff0:.4f} | {cuts.size - 1} / {eff:.4f} | {rep:.3f} | {lh} | {ok} |", flush=True)


if __name__ == "__main__":
    main()
