"""The ``fitbatch`` command line.

* ``fitbatch demo`` plans batches for real token lengths of this Python's standard library (no
  download) and prints how a fixed batch size, the seed tools' greedy loop and every fitbatch
  strategy compare.
* ``fitbatch plan SIZES --budget B`` shows what a budget and a strategy do to your data: one row
  per strategy beside a fixed batch size (batches per epoch, vs the lower bound, padding
  efficiency, fills, straggler ratio for ``--world-size`` ranks, plan time); ``--json`` for
  scripts, ``--plot`` for a picture. The numbers are ``BatchPlan.stats()``'s.
* ``fitbatch sizes SOURCE -o sizes.npy`` extracts sizes (a column, or the byte sizes of files).
* ``fitbatch index SOURCE -o PATH`` builds a :class:`fitbatch.SizeIndex` in parallel (local
  processes or ``--engine ray``); ``fitbatch plan PATH`` plans from it (``docs/scale.md``).

See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

import fitbatch
import fitbatch.index
import fitbatch.sizes
from fitbatch.cli._demo import stdlib_function_lengths
from fitbatch.epoch._arrange import arrange
from fitbatch.index._format import is_index_dir
from fitbatch.plan._baseline import fixed_size_plan, largest_safe_batch_size
from fitbatch.plan._planner import OVERSIZED
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
    remeasured = fitbatch.BatchPlan.from_batches(
        sz, cost, seedlike.order, seedlike.offsets, budget=budget, strategy_name="seed greedy",
        lower_bound=len(seedlike), plan_seconds=seedlike.plan_seconds,
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
        raise CliError("no standard-library sources found to tokenise")
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


# ---------------------------------------------------------------------------- fitbatch plan / sizes

COSTS = ("padded", "sum", "polynomial")
PLAN_HEADERS = ("plan", "batches", "vs bound", "padding eff", "mean fill", "max fill", "straggler", "plan ms")
_NUMERIC = ("n_samples", "n_batches", "lower_bound", "padding_efficiency", "mean_fill", "max_fill", "skipped",
            "dropped", "dropped_batches", "oversized_batches", "plan_seconds", "straggler_ratio")


class _Once(logging.Filter):
    """Let each distinct log message through once (the CLI plans the same data many times)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg in self.seen:
            return False
        self.seen.add(msg)
        return True


class CliError(Exception):
    """A user error: printed as one line, exit status 2 (see :func:`main`)."""


#: the exit status of every error the user can act on (argparse's usage errors use it too)
EXIT_ERROR = 2
# Failures the user can act on (bad input, files, missing extras), printed as one line; any
# other exception is a bug in fitbatch and keeps its traceback.
EXPECTED = (CliError, OSError, ValueError, TypeError, ImportError)
# fsspec and its storage backends raise their own errors for credentials, access and endpoints
# (botocore's NoCredentialsError is no OSError): expected as well, named by their type.
STORAGE_MODULES = ("fsspec", "s3fs", "gcsfs", "adlfs", "botocore", "aiobotocore", "google.auth",
                   "google.api_core", "azure")


def _expected(exc: BaseException) -> bool:
    if isinstance(exc, EXPECTED):
        return True
    return any(cls.__module__ == m or cls.__module__.startswith(m + ".")
               for cls in type(exc).__mro__ for m in STORAGE_MODULES)


def _reason(exc: BaseException) -> str:
    """Why an operation on a path that the message names already failed."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else error_line(exc)


def error_line(exc: BaseException) -> str:
    """The one line printed for an expected failure."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc) or type(exc).__name__
    if not isinstance(exc, EXPECTED):  # a storage backend's error: its type says what failed
        text = f"{type(exc).__name__}: {text}"
    return " ".join(text.split())


@dataclasses.dataclass
class PlanRow:
    """One configuration over the epochs: its stats per epoch and epoch 0's plan (for plots)."""

    name: str
    epochs: list[fitbatch.PlanStats]
    first: fitbatch.BatchPlan | None  # None when planned in a worker process (stats only)

    def mean(self) -> dict[str, Any]:
        """``PlanStats.as_dict()`` with every number averaged over the epochs."""
        out = self.epochs[0].as_dict()
        for key in (*_NUMERIC, "batches_vs_lower_bound"):
            vals = [s.as_dict()[key] for s in self.epochs]
            out[key] = None if vals[0] is None else float(np.mean(vals))
        return out


def _number(x: float, digits: int) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.{digits}f}"


def plan_row_cells(row: PlanRow) -> list[str]:
    m = row.mean()
    return [
        row.name,
        _number(m["n_batches"], 1),
        f"{m['batches_vs_lower_bound']:.3f}x",
        f"{m['padding_efficiency']:.3f}",
        f"{m['mean_fill']:.3f}",
        f"{m['max_fill']:.2f}",
        "-" if m["straggler_ratio"] is None else f"{m['straggler_ratio']:.3f}",
        f"{m['plan_seconds'] * 1e3:.1f}",
    ]


def _spread(plan: fitbatch.BatchPlan, sizes: fitbatch.Sizes, model: fitbatch.CostModel, world: int, seed: int, epoch: int) -> fitbatch.BatchPlan:
    """The global plan as ``world`` ranks run it (count evened out), with its straggler ratio."""
    try:
        steps = arrange(plan, sizes, model, world, seed=seed, epoch=epoch)
    except ValueError:  # too few samples to split batches for every rank: drop (counted) instead
        steps = arrange(plan, sizes, model, world, seed=seed, epoch=epoch, policy="drop")
    out = steps.plan
    out.straggler_ratio = steps.straggler_ratio
    return out


def safe_batch_size(sizes: fitbatch.Sizes, budget: float, cost: str) -> int:
    """``largest_safe_batch_size`` on the largest samples only (the same answer, in O(n))."""
    key = fitbatch.costs.resolve_cost(cost).sample_cost(sizes.values)
    m = 1024
    while m < len(sizes):
        top = np.argpartition(-key, m)[:m]
        safe = largest_safe_batch_size(fitbatch.Sizes(sizes.values[top], sizes.integral), budget, cost)
        if safe < m:
            return safe
        m *= 8
    return largest_safe_batch_size(sizes, budget, cost)


_FORKED: tuple[Any, ...] | None = None  # what forked row workers read (set only around the pool)


def _parallel(n_rows: int, n_sizes: int, args: argparse.Namespace) -> bool:
    return (
        n_rows > 1 and not args.plot and n_sizes >= 1_000_000 and (os.cpu_count() or 1) > 1
        and "fork" in multiprocessing.get_all_start_methods()
    )


def _strategy_plan(name: str, sizes: fitbatch.Sizes, args: argparse.Namespace, model: fitbatch.CostModel,
                   common: dict[str, Any], epoch: int) -> fitbatch.BatchPlan:
    plan = fitbatch.plan_batches(sizes, args.budget, cost=args.cost, strategy=name, epoch=epoch, **common)
    return _spread(plan, sizes, model, args.world_size, args.seed, epoch)


def _strategy_stats(name: str) -> list[fitbatch.PlanStats]:
    assert _FORKED is not None  # set by plan_rows before the pool forks (internal invariant)
    sizes, args, model, common = _FORKED
    return [_strategy_plan(name, sizes, args, model, common, e).stats() for e in range(args.epochs)]


def plan_rows(sizes: fitbatch.Sizes, args: argparse.Namespace) -> list[PlanRow]:
    """The fixed-batch-size baseline and each chosen strategy, planned for every epoch."""
    model = fitbatch.costs.resolve_cost(args.cost)
    names = strategy_names() if args.strategy == "all" else (args.strategy,)
    common = {"max_batch_size": args.max_batch_size, "seed": args.seed, "oversized": args.oversized}
    if args.max_shapes is not None:
        common["max_shapes"] = args.max_shapes
    global _FORKED
    rows = []
    if _parallel(len(names), len(sizes), args):
        # independent rows on both cores; forked workers share the sizes without copying them
        _FORKED = (sizes, args, model, common)
        try:
            with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
                stats = list(pool.map(_strategy_stats, names))
        finally:
            _FORKED = None
        rows = [PlanRow(f"fitbatch {name}", st, None) for name, st in zip(names, stats)]
    for name in names if not rows else ():  # strategies first: an oversized sample under "error" stops here
        plans = [_strategy_plan(name, sizes, args, model, common, e) for e in range(args.epochs)]
        rows.append(PlanRow(f"fitbatch {name}", [p.stats() for p in plans], plans[0]))
    fits = model.sample_cost(sizes.values) <= args.budget
    base = sizes if args.oversized != "skip" or fits.all() else fitbatch.Sizes(sizes.values[fits], sizes.integral)
    bs = safe_batch_size(base, args.budget, args.cost)
    bs = min(bs, args.max_batch_size) if args.max_batch_size else bs
    fixed = [
        _spread(fixed_size_plan(base, bs, budget=args.budget, cost=args.cost, seed=args.seed, epoch=e),
                base, model, args.world_size, args.seed, e)
        for e in range(args.epochs)
    ]
    return [PlanRow(f"fixed batch size {bs}", [p.stats() for p in fixed], fixed[0]), *rows]


def _load(source: str, column: str | None) -> Any:
    if is_index_dir(source):  # a SizeIndex, finished or interrupted: never a directory of files
        if column is not None:
            raise CliError(f"{source} is a size index (one column of sizes): drop --column")
        try:
            return fitbatch.SizeIndex.open(source)
        except (OSError, ValueError) as exc:
            raise CliError(str(exc)) from None
    try:
        return fitbatch.sizes.from_source(source, column=column)
    except FileNotFoundError as exc:
        raise CliError(str(exc.args[0] if exc.args else exc)) from None
    except (ValueError, TypeError, ImportError) as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:  # the file system or storage backend: say what was being read
        if not _expected(exc):
            raise
        raise CliError(f"cannot read {source}: {_reason(exc)}") from None


def _check_budget(sizes: fitbatch.Sizes, budget: float, cost: str) -> None:
    alone = fitbatch.costs.resolve_cost(cost).sample_cost(sizes.values)
    if alone.min() > budget:
        raise CliError(
            f"budget {budget:g} is smaller than every sample: the smallest costs {alone.min():g} alone "
            f"({cost} cost); raise --budget to at least {alone.min():g}"
        )


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.6g}"


def _describe(sizes: Any) -> str:
    sizes = getattr(sizes, "sizes", sizes)  # a SizeIndex: its memory-mapped column
    return (f"{sizes.size:,} sizes, total {_fmt(sizes.sum())}; min {_fmt(sizes.min())}, "
            f"median {_fmt(float(np.median(sizes)))}, max {_fmt(sizes.max())}")


def _oversized_note(sizes: fitbatch.Sizes, args: argparse.Namespace) -> str:
    over = int(np.count_nonzero(fitbatch.costs.resolve_cost(args.cost).sample_cost(sizes.values) > args.budget))
    if not over or args.oversized == "error":
        return ""
    what = "left out (--oversized skip)" if args.oversized == "skip" else "each in a batch of its own (--oversized single)"
    return f"\n{over:,} sample{'s' if over > 1 else ''} cost more than the budget alone: {what}."


def _plan(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    raw = _load(args.sizes, args.column)
    sizes = fitbatch.as_sizes(raw)
    _check_budget(sizes, args.budget, args.cost)
    try:
        rows = plan_rows(sizes, args)
    except (ValueError, TypeError) as exc:
        hint = " (--oversized single or --oversized skip)" if "oversized=" in str(exc) else ""
        raise CliError(f"{exc}{hint}") from None
    if args.plot:
        from fitbatch.cli._plot import plot_plan

        try:
            plot_plan(args.plot, sizes, [(r.name, r.first) for r in rows if r.first is not None], budget=args.budget,
                      cost=args.cost, max_batch_size=args.max_batch_size)
        except (OSError, ValueError, RuntimeError) as exc:  # an unwritable path, an unknown format
            raise CliError(f"cannot write the plot {args.plot}: {_reason(exc)}") from None
    if args.json:
        out = {
            "source": args.sizes, "n_samples": int(sizes.values.shape[0]), "budget": args.budget, "cost": args.cost,
            "world_size": args.world_size, "epochs": args.epochs, "seed": args.seed, "oversized": args.oversized,
            "max_batch_size": args.max_batch_size, "max_shapes": args.max_shapes, "plot": args.plot,
            "rows": [{"plan": r.name, "mean": r.mean(), "per_epoch": [s.as_dict() for s in r.epochs]} for r in rows],
        }
        print(json.dumps(out, indent=1))
        return 0
    world = f", {args.world_size} ranks" if args.world_size > 1 else ""
    epochs = f", mean of {args.epochs} epochs" if args.epochs > 1 else ""
    print(f"{args.sizes}: {_describe(raw)}. Budget {args.budget:g} ({args.cost} cost){world}{epochs}."
          f"{_oversized_note(sizes, args)}\n")
    print(format_table(PLAN_HEADERS, [plan_row_cells(r) for r in rows]))
    print(
        "\nvs bound: batches / the fewest any plan can have; padding eff: real / padded units; fill: batch "
        "cost / budget (over 1.00 would run out of memory); straggler: mean over steps of the slowest "
        f"rank's cost / the mean rank's (--world-size); plan ms: planning time. Total {time.perf_counter() - t0:.2f} s."
    )
    shaped = [f"{r.name}: {s.n_shapes} shapes, efficiency {s.shape_efficiency:.3f}" for r in rows for s in r.epochs[:1] if s.n_shapes is not None]
    if shaped:
        print(f"\nBatch shapes (--max-shapes {args.max_shapes}; real / rows x length of the shapes, epoch 0): " + "; ".join(shaped) + ".")
    lost = [f"{r.name}: {r.mean()['dropped']:g} samples" for r in rows if r.mean()["dropped"]]
    if lost:
        print(f"\nDropped to give each of {args.world_size} ranks a batch per step (counted, mean per epoch): " + "; ".join(lost) + ".")
    if args.strategy != "all" and rows[-1].first is not None:
        print("\n" + rows[-1].first.report())
    if args.plot:
        print(f"\nplot written to {args.plot}")
    return 0


def _sizes(args: argparse.Namespace) -> int:
    raw = _load(args.source, args.column)
    try:
        with open(args.output, "wb") as fh:  # this very path (np.save would append .npy to another name)
            np.save(fh, getattr(raw, "sizes", raw))
    except OSError as exc:
        raise CliError(f"cannot write {args.output}: {_reason(exc)}") from None
    if args.paths:
        paths, _ = fitbatch.sizes.list_files(args.source)
        try:
            with open(args.paths, "w", encoding="utf-8") as fh:
                fh.write("\n".join(paths) + "\n")
        except OSError as exc:
            raise CliError(f"cannot write {args.paths}: {_reason(exc)}") from None
    print(f"{args.source}: {_describe(raw)}; wrote {args.output}" + (f" and {args.paths}" if args.paths else ""))
    return 0


def _index(args: argparse.Namespace) -> int:
    source = args.source[0] if len(args.source) == 1 else args.source
    try:
        index = fitbatch.build_size_index(source, args.output, column=args.column, format=args.format,
                                          engine=args.engine, workers=args.workers, rows_per_shard=args.rows_per_shard)
    except (ValueError, TypeError, ImportError) as exc:
        raise CliError(str(exc)) from None
    print(f"{args.output}: {_describe(index)}; {index.num_shards} shards, {index.sizes.dtype}")
    return 0


def _budget(text: str) -> float:
    try:
        return fitbatch.costs.parse_budget(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def _add_plan(sub: Any) -> None:
    plan = sub.add_parser("plan", help="what a budget and strategy do to your data (table, --json, --plot)")
    plan.add_argument("sizes", metavar="SIZES", help=".npy, .txt, .csv, .parquet, a size index, or a directory/glob/URL of files (byte sizes)")
    plan.add_argument("--budget", type=_budget, required=True, help="batch budget, e.g. 16384 or 70GiB")
    plan.add_argument("--cost", choices=COSTS, default="padded")
    plan.add_argument("--strategy", choices=("all", *strategy_names()), default="all")
    plan.add_argument("--max-batch-size", type=_positive, default=None, metavar="N")
    plan.add_argument("--max-shapes", type=_positive, default=None, metavar="K", help="at most K batch shapes (torch.compile)")
    plan.add_argument("--world-size", type=_positive, default=1, metavar="W", help="data-parallel ranks (straggler ratio)")
    plan.add_argument("--epochs", type=_positive, default=1, metavar="E", help="average over E epochs")
    plan.add_argument("--oversized", choices=OVERSIZED, default="error", help="samples over budget alone")
    plan.add_argument("--column", default=None, help="column of a .csv or .parquet file")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--json", action="store_true", help="print JSON instead of the table")
    plan.add_argument("--plot", default=None, metavar="FILE.png", help="size histogram and fill distribution")
    plan.set_defaults(func=_plan)
    sizes = sub.add_parser("sizes", help="extract sizes to a .npy (a column, or byte sizes of files)")
    sizes.add_argument("source", metavar="SOURCE", help="as SIZES of `fitbatch plan`")
    sizes.add_argument("-o", "--output", required=True, help="the .npy to write")
    sizes.add_argument("--column", default=None, help="column of a .csv or .parquet file")
    sizes.add_argument("--paths", default=None, help="also write the listed file paths, one a line (files only)")
    sizes.set_defaults(func=_sizes)
    index = sub.add_parser("index", help="build a size index (fitbatch.SizeIndex) in parallel, resumably")
    index.add_argument("source", metavar="SOURCE", nargs="+", help="parquet/.tar/.idx files, an MDS index.json, or files (globs, URLs)")
    index.add_argument("-o", "--output", required=True, help="the index directory")
    index.add_argument("--column", default=None, help="parquet or MDS column, or WebDataset member extension")
    index.add_argument("--format", choices=fitbatch.index.FORMATS, default=None, help="default: from the file extensions")
    index.add_argument("--engine", choices=fitbatch.index.ENGINES, default="local")
    index.add_argument("--workers", type=_positive, default=None, metavar="N")
    index.add_argument("--rows-per-shard", type=_positive, default=1_000_000, metavar="R")
    index.set_defaults(func=_index)
    compile_ = sub.add_parser("compile", help="build the compiled loops' ahead-of-time cache now (the fast extra and a C compiler)")
    compile_.add_argument("--dir", default=None, help="the cache folder to build (default: this install's, under FITBATCH_CACHE_DIR)")
    compile_.add_argument("--print-path", action="store_true", help="print this install's cache folder and exit")
    compile_.set_defaults(func=_compile)


def _compile(args: argparse.Namespace) -> int:
    """``fitbatch compile``: :mod:`fitbatch._kernels.aot_build` (once after installing the fast extra,
    so that no process pays numba's import before its first compiled loop)."""
    if importlib.util.find_spec("numba") is None:
        raise ImportError("`fitbatch compile` needs numba: pip install 'fitbatch[fast]'")
    from fitbatch._kernels import aot_build

    argv = (["--dir", args.dir] if args.dir else []) + (["--print-path"] if args.print_path else [])
    try:
        return aot_build.main(argv + ([] if args.verbose else ["--quiet"]))
    except Exception as exc:  # noqa: BLE001 - no C compiler, a numba that cannot build: one line, status 2
        print(f"fitbatch: error: the ahead-of-time build failed ({type(exc).__name__}: {error_line(exc)}); "
              "compiled loops still load through numba's JIT", file=sys.stderr)
        return EXIT_ERROR


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, like every other error (status 2)."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fitbatch", description="Batches that fit a memory budget.")
    parser.add_argument("--version", action="version", version=f"fitbatch {fitbatch.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compare strategies on this Python's standard library")
    demo.add_argument("--budget", type=fitbatch.costs.parse_budget, default=8192.0, help="batch budget (default 8192 tokens)")
    demo.add_argument("--cost", choices=("padded", "sum", "polynomial"), default="padded")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--limit", type=int, default=None, help="tokenise only the first N files")
    demo.set_defaults(func=_demo)
    _add_plan(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fitbatch`` console script.

    Returns the exit status: 0, or :data:`EXIT_ERROR` after printing one line
    ``fitbatch: error: ...`` on stderr for a failure the user can act on (bad input, a file that
    cannot be read or written, a missing optional dependency, a storage backend's credentials
    or access error). Usage errors exit through argparse with the same status; any other
    exception propagates with its traceback.

    >>> main(["plan", "--budget", "8192", "/no/such/sizes.npy"])
    2
    """
    args = build_parser().parse_args(argv)
    before = set(logging.getLogger().handlers)  # handlers of an embedding program stay as they are
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in set(logging.getLogger().handlers) - before:
        handler.addFilter(_Once())
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `fitbatch plan ... | head`: the reader is gone, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at the final flush
        return EXIT_ERROR
    except Exception as exc:
        if not _expected(exc):
            raise
        print(f"fitbatch: error: {error_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
