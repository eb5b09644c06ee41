"""What ``loss_sizes=`` costs: planning and ``step_totals()`` with and without loss tokens.

Run from the repository root:

    python bench/loss_tokens.py                       # 1M samples, worlds 1 and 8 (about a minute)
    python bench/loss_tokens.py --samples 200000 --worlds 8

A real length set (``cpython_stdlib_pytokens``, resampled with a fixed seed to ``--samples``)
is planned with budget 16384, padded cost, pooled strategy, ``oversized="skip"``; the loss
tokens of each sample are a seeded random share of its tokens (as prompt masking leaves). For
each world size it prints, best of ``--repeat``, one markdown table row per setting:

* **build + first step_totals**: ``BudgetBatchSampler(...)`` then ``step_totals()`` (plans and
  arranges the epoch; with ``loss_sizes`` also validates them and sums them per batch);
* **step_totals again**: the cached call a training loop makes each epoch;
* **set_budget + step_totals**: a budget change half-way through the epoch, which re-plans the
  rest and sums its loss units again;
* **plan.stats()**: this rank's plan statistics (with ``loss_units``);
* the loss units of the epoch, which must equal the sum of ``loss_sizes`` of the planned samples.

The planned batches are the same with and without ``loss_sizes`` (checked).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import load, resample

import fitbatch
from fitbatch._validate import loss_sizes as check_loss_sizes

logging.disable(logging.WARNING)  # the skipped-samples warning


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def run(sizes: np.ndarray, loss: np.ndarray | None, world: int, repeat: int) -> dict[str, Any]:
    def build() -> fitbatch.BudgetBatchSampler:
        s = fitbatch.BudgetBatchSampler(
            sizes,
            16384,
            cost="padded",
            strategy="pooled",
            seed=0,
            oversized="skip",
            num_replicas=world,
            rank=0,
            loss_sizes=loss,
        )
        s.step_totals()
        return s

    t_build, sampler = best(build, repeat)
    t_again, totals = best(sampler.step_totals, repeat)

    def change() -> Any:
        s = build()
        it = iter(s)
        for _ in range(len(s) // 2):
            next(it)
        s.set_budget(12000)
        return s.step_totals()

    t_change, _ = best(change, repeat)
    t_stats, _ = best(lambda: sampler.plan().stats(), repeat)
    batches = [b for r in range(world) for b in sampler.steps().rank_plan(r)]
    return {
        "build": t_build,
        "again": t_again,
        "change": t_change,
        "stats": t_stats,
        "loss": float(totals.loss_units.sum()),
        "units": float(totals.units.sum()),
        "batches": [tuple(b[:3].tolist()) for b in batches[:50]],
        "planned": np.concatenate(batches),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    sizes = resample(load("cpython_stdlib_pytokens"), args.samples).astype(np.int64)
    rng = np.random.default_rng(1)
    loss = np.floor(sizes * rng.uniform(0.3, 1.0, sizes.size))  # prompt tokens masked
    print(
        f"{args.samples:,} samples (cpython_stdlib_pytokens), budget 16384, padded/pooled, best of {args.repeat}\n"
    )
    print(
        "| world | loss_sizes | build + first step_totals | step_totals again | set_budget + step_totals | plan.stats() | epoch loss units |"
    )
    print("|---|---|---|---|---|---|---|")
    for world in args.worlds:
        plain = run(sizes, None, world, args.repeat)
        with_loss = run(sizes, loss, world, args.repeat)
        assert plain["batches"] == with_loss["batches"], "loss_sizes changed the batches"
        assert with_loss["loss"] == float(loss[with_loss["planned"]].sum())
        assert plain["loss"] == plain["units"]
        for name, r in (("no", plain), ("yes", with_loss)):
            print(
                f"| {world} | {name} | {r['build'] * 1e3:.0f} ms | {r['again'] * 1e6:.1f} µs | "
                f"{r['change'] * 1e3:.0f} ms | {r['stats'] * 1e3:.1f} ms | {r['loss']:,.0f} |"
            )
    # the work loss_sizes adds, alone: the check of the array and the sum per batch of one plan
    plan = fitbatch.plan_batches(sizes, 16384, strategy="pooled", seed=0, oversized="skip")
    t_check, _ = best(lambda: check_loss_sizes(loss, sizes.size), args.repeat)

    def per_batch() -> Any:
        plan.loss_sizes = loss.copy()  # a new array: summed again
        return plan.loss_units

    t_sum, _ = best(per_batch, args.repeat)
    print(
        f"\nalone: check of loss_sizes {t_check * 1e3:.1f} ms, loss units of the {len(plan):,} batches {t_sum * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
