"""The ``fitbatch`` command line.

``fitbatch demo`` plans batches for real token lengths of this Python's standard library (no
download) and prints how a fixed batch size, the seed tools' greedy loop and every fitbatch
strategy compare.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import numpy as np

import fitbatch
from fitbatch._demo import stdlib_function_lengths
from fitbatch.plan import fixed_size_plan, largest_safe_batch_size, measure_batches
from fitbatch.strategies import strategy_names


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned, numbers right-aligned, a rule under the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


STAT_HEADERS = ("plan", "batches", "vs bound", "padding eff", "mean fill", "max fill", "plan ms")


def stat_row(name: str, stats: fitbatch.PlanStats) -> list[str]:
    return [
        name,
        f"{stats.n_batches}",
        f"{stats.batches_vs_lower_bound:.3f}x",
        f"{stats.padding_efficiency:.3f}",
        f"{stats.mean_fill:.3f}",
        f"{stats.max_fill:.2f}",
        f"{stats.plan_seconds * 1e3:.1f}",
    ]


def comparison_rows(sizes: np.ndarray, budget: float, cost: str, seed: int, oversized: str) -> list[list[str]]:
    """Rows for a fixed batch size, the seed tools' greedy (sum budget) and each strategy."""
    sz = fitbatch.as_sizes(sizes)
    safe = largest_safe_batch_size(sz, budget, cost)
    rows = [stat_row(f"fixed batch size {safe}", fixed_size_plan(sz, safe, budget=budget, cost=cost, seed=seed).stats())]
    seedlike = fitbatch.plan_batches(sz, budget, cost="sum", strategy="sequential", oversized="single")
    # The seed tools budget the *sum* of sizes; measure what those batches cost once padded.
    model = fitbatch.resolve_cost(cost)
    _, costs, real, padded = measure_batches(sz, model, seedlike.order, seedlike.offsets)
    remeasured = fitbatch.BatchPlan(
        seedlike.order, seedlike.offsets, costs=costs, real_units=real, padded_units=padded,
        budget=budget, cost_name=cost, strategy_name="seed greedy", lower_bound=len(seedlike),
        plan_seconds=seedlike.plan_seconds,
    )
    bound = fitbatch.plan_batches(sz, budget, cost=cost, strategy="sorted", oversized=oversized).lower_bound
    remeasured.lower_bound = bound
    rows.append(stat_row("seed tools' greedy (sum budget)", remeasured.stats()))
    for name in strategy_names():
        plan = fitbatch.plan_batches(sz, budget, cost=cost, strategy=name, seed=seed, oversized=oversized)
        rows.append(stat_row(f"fitbatch {name}", plan.stats()))
    packed = fitbatch.plan_batches(sz, budget, cost="sum", strategy="packed", seed=seed, oversized=oversized)
    rows.append(stat_row("fitbatch packed, sum cost (varlen)", packed.stats()))
    return rows


def _demo(args: argparse.Namespace) -> int:
    print("Tokenising this Python's standard library (tokenize + ast, no download)...", flush=True)
    sizes = stdlib_function_lengths(limit=args.limit)
    if sizes.size == 0:
        print("no standard-library sources found", file=sys.stderr)
        return 1
    print(
        f"{sizes.size} functions, {int(sizes.sum())} tokens; median {int(np.median(sizes))}, "
        f"max {int(sizes.max())} tokens per function. Budget {args.budget:g} ({args.cost} cost).\n"
    )
    rows = comparison_rows(sizes, args.budget, args.cost, args.seed, "single")
    print(format_table(STAT_HEADERS, rows))
    print(
        "\nvs bound: batches / the fewest any plan can have; padding eff: real tokens / padded "
        "tokens; fill: batch cost / budget (over 1.00 would run out of memory)."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fitbatch", description="Batches that fit a memory budget.")
    parser.add_argument("--version", action="version", version=f"fitbatch {fitbatch.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compare strategies on this Python's standard library")
    demo.add_argument("--budget", type=fitbatch.parse_budget, default=8192.0, help="batch budget (default 8192 tokens)")
    demo.add_argument("--cost", choices=("padded", "sum", "polynomial"), default="padded")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--limit", type=int, default=None, help="tokenise only the first N files")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fitbatch`` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
