"""Data-parallel balance benchmark: straggler ratio of cost-balanced steps vs a round-robin split.

Run from the repository root:

    python bench/distributed.py                  # both real sets at 1M samples (about a minute)
    python bench/distributed.py --samples 200000 --worlds 2 8

For each real length set (``/work/shared/data/*.npy``, else ``tests/data/``), resampled to
``--samples`` samples with a fixed seed, budget 16384 tokens, padded cost, pooled strategy
(``cpython_stdlib_pytokens`` with ``oversized="skip"``: 3.4 % of its files exceed the budget
alone), and each world size it plans the epoch once as every rank does and prints, in one
markdown table:

* **balanced**: the straggler ratio of ``BudgetBatchSampler``'s arrangement (mean over steps of
  the most expensive rank batch / the mean rank batch of the step; 1.0 is perfect balance);
* **round-robin**: the same batches, in the same shuffled order, dealt batch ``i`` -> rank
  ``i % W`` as a plain ``DistributedSampler``-style wrapping of a batch sampler does;
* **idle**: the share of rank time spent waiting for the step's slowest rank, when a batch's
  time is proportional to its cost (``1 - sum of step means / sum of step maxima``);
* padding efficiency of the single-process plan and of the distributed global plan (the
  ``policy="split"`` plan, whose extra batches are halves of the most expensive ones), the
  batches added by the split, and the time one rank spends planning and arranging.

Targets (issue 3): balanced straggler ratio <= 1.02 at world size 8, padding efficiency within
1 point of the single-process plan.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from pathlib import Path

import numpy as np

import fitbatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, resample, synthetic  # noqa: E402

SETS = {"cpython_stdlib_functions": "error", "cpython_stdlib_pytokens": "skip"}
BUDGET = 16384.0


def lone_batch_bound(sizes: np.ndarray, budget: float, world: int, n_steps: int) -> float:
    """A lower bound on the straggler ratio of any ``n_steps`` x ``world`` steps (padded cost).

    A sample longer than half the budget fills a batch alone, at its own cost. A step whose
    longest such batch costs ``M`` wastes at least ``M - c`` beside each of its other lone
    batches of cost ``c``, and its ratio is ``W M / (W M - waste) >= 1 + waste / (W * budget)``.
    Taking the least total waste over every way of sharing the lone batches among the steps (at
    most ``world`` a step; groups of neighbours in size order are the cheapest: an exact
    programme) bounds the mean over steps. Everything else is treated as freely divisible, so
    the bound is loose: it says how much the lone batches alone force, no more.
    """
    values = np.asarray(sizes, np.float64)
    lone = np.sort(values[2 * values > budget])[::-1]
    k = lone.size
    if k == 0:
        return 1.0
    if k > world * n_steps:
        raise ValueError(f"{k} lone batches do not fit in {n_steps} steps of {world}")
    prefix = np.concatenate([[0.0], np.cumsum(lone)])
    best = np.full(k + 1, np.inf)  # least waste covering the first i lone batches, so far
    best[0] = 0.0
    for _ in range(n_steps):
        step = best.copy()
        for i in range(1, k + 1):
            first = np.arange(max(0, i - world), i)  # the step's lone batches: first..i-1
            waste = (i - first) * lone[first] - (prefix[i] - prefix[first])
            step[i] = min(step[i], float(np.min(best[first] + waste)))
        best = step
    return 1.0 + float(best[k]) / (world * budget * n_steps)


def straggler_and_idle(step_costs: np.ndarray) -> tuple[float, float]:
    """(mean over steps of max / mean rank cost, share of rank time spent waiting)."""
    mx, mean = step_costs.max(axis=1), step_costs.mean(axis=1)
    ok = mean > 0
    return float(np.mean(mx[ok] / mean[ok])), float(1.0 - mean.sum() / mx.sum())


def row(name: str, sizes: np.ndarray, oversized: str, world: int, single: fitbatch.BatchPlan) -> dict:
    t0 = time.perf_counter()
    sampler = fitbatch.BudgetBatchSampler(sizes, BUDGET, num_replicas=world, rank=0, seed=0, oversized=oversized)
    steps = sampler.steps()
    seconds = time.perf_counter() - t0
    plan = steps.plan
    balanced, idle_bal = straggler_and_idle(plan.costs[steps.grid])
    rr_grid = np.arange(len(plan)).reshape(-1, world)  # batch i -> rank i % W, same batches
    round_robin, idle_rr = straggler_and_idle(plan.costs[rr_grid])
    assert abs(balanced - steps.straggler_ratio) < 1e-12
    assert abs(balanced - sampler.plan().stats().straggler_ratio) < 1e-12
    return {
        "set": name,
        "W": world,
        "steps": steps.n_steps,
        "balanced": balanced,
        "round_robin": round_robin,
        "idle_bal": idle_bal,
        "idle_rr": idle_rr,
        "pad_single": single.stats().padding_efficiency,
        "pad_dist": plan.stats().padding_efficiency,
        "added": len(plan) - len(single),
        "seconds": seconds,
    }


def few_steps_table(repeats: int = 5) -> str:
    """Straggler ratio with few steps per epoch: ``plan_for_world`` against splitting the leftover.

    For each set (the two real ones, then the synthetic shapes of issue #18), world size and
    target step count, ``repeats`` resamples (seeds 0..) of about ``world * steps`` batches'
    worth of samples; "split" arranges the single-process plan (the leftover batches halved, as
    before ``plan_for_world``), "re-planned" is what the sampler does. "wall" is the sum over
    steps of the slowest rank's batch cost (the time of synchronous steps), re-planned over
    split, and "idle" the share of rank time spent waiting, re-planned.
    """
    from fitbatch.epoch._arrange import arrange
    from fitbatch.plan._options import PlanOptions
    from fitbatch.plan._planner import plan_with

    cost = fitbatch.costs.resolve_cost("padded")
    lines = [
        "| set | W | steps | straggler split (min-max) | straggler re-planned (min-max) | lone-batch bound (min-max) | wall re-planned / split | idle re-planned | batches single -> re-planned |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    bases = {name.removeprefix("cpython_stdlib_"): (load(name), oversized) for name, oversized in SETS.items()}
    bases.update({name.split(" (")[0].removeprefix("synthetic "): (v, "error") for name, v in synthetic(200_000).items()})
    for name, (base, oversized) in bases.items():
        base = base[base <= BUDGET]
        per_batch = max(1.0, BUDGET / (1.3 * float(base.mean())))
        for world, steps in ((8, 5), (8, 9), (64, 2), (64, 4)):
            old, new, counts, walls, idles, bounds = [], [], [], [], [], []
            for seed in range(repeats):
                sizes = fitbatch.as_sizes(resample(base, int(world * steps * per_batch), seed=seed))
                opts = PlanOptions.build(BUDGET, seed=seed, oversized=oversized)
                single = plan_with(sizes, opts)
                split = arrange(single, sizes, cost, world, seed=seed, epoch=0)
                old.append(split.straggler_ratio)
                sampler = fitbatch.BudgetBatchSampler(sizes, BUDGET, num_replicas=world, rank=0, seed=seed, oversized=oversized)
                re = sampler.steps()
                new.append(re.straggler_ratio)
                bounds.append(lone_batch_bound(sizes.values, BUDGET, world, re.n_steps))
                walls.append(re.plan.costs[re.grid].max(axis=1).sum() / split.plan.costs[split.grid].max(axis=1).sum())
                idles.append(straggler_and_idle(re.plan.costs[re.grid])[1])
                counts.append(f"{len(single)}->{len(re.plan)}")
            lines.append(
                f"| {name} | {world} | {steps} | {min(old):.3f}-{max(old):.3f} | {min(new):.3f}-{max(new):.3f} "
                f"| {min(bounds):.3f}-{max(bounds):.3f} | {min(walls):.3f}-{max(walls):.3f} | {min(idles):.3f}-{max(idles):.3f} | {', '.join(counts[:3])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 8, 64])
    p.add_argument("--few-steps", action="store_true", help="only the few-steps-per-epoch table")
    args = p.parse_args(argv)
    if args.few_steps:
        logging.basicConfig(level=logging.ERROR)
        print(few_steps_table())
        return
    logging.basicConfig(level=logging.ERROR)  # the skipped samples are counted in the notes
    fitbatch.BudgetBatchSampler([1], 1)  # import torch (the sampler's base class) before timing
    print(f"fitbatch {fitbatch.__version__}, numpy {np.__version__}, Python {platform.python_version()}, {platform.machine()}")
    print(f"{args.samples:,} samples per set (resampled, seed 0), budget {BUDGET:g} padded, pooled, policy='split'\n")
    print("| set | W | steps | straggler balanced | straggler round-robin | idle balanced | idle round-robin "
          "| pad. eff. single | pad. eff. distributed | batches added | plan+arrange per rank |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes = []
    for name, oversized in SETS.items():
        sizes = resample(load(name), args.samples)
        t0 = time.perf_counter()
        single = fitbatch.plan_batches(sizes, BUDGET, seed=0, oversized=oversized)
        single_s = time.perf_counter() - t0
        if single.stats().skipped:
            notes.append(f"{name}: {single.stats().skipped:,} samples over the budget alone skipped (counted in the stats)")
        for world in args.worlds:
            r = row(name, sizes, oversized, world, single)
            print(
                f"| {r['set'].removeprefix('cpython_stdlib_')} | {r['W']} | {r['steps']:,} | {r['balanced']:.4f} "
                f"| {r['round_robin']:.4f} | {100 * r['idle_bal']:.2f} % | {100 * r['idle_rr']:.2f} % "
                f"| {r['pad_single']:.4f} | {r['pad_dist']:.4f} | {r['added']} "
                f"| {r['seconds'] * 1e3:.0f} ms (single plan {single_s * 1e3:.0f} ms) |"
            )
    for note in notes:
        print(f"\n{note}")


if __name__ == "__main__":
    main()
