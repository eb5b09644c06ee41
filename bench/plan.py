"""Planning benchmark: speed, memory and quality of every strategy on real length sets.

Run from the repository root:

    python bench/plan.py                 # real size, 1M and 10M samples (a few minutes)
    python bench/plan.py --sizes 1000000 # one size only
    python bench/plan.py --quick         # real size and 1M, no 10M, no memory runs
    python bench/plan.py --frontier      # randomness= frontier at 20k and 100k beside lhotse
    python bench/plan.py --frontier --frontier-n 20000 100000 1000000 --plot docs/plan_quality.png
    python bench/plan.py --frontier --synthetic  # also three synthetic sets at N <= 100k
    python bench/plan.py --frontier --synthetic --pairs 5  # the default beside lhotse, 5 epoch pairs
    python bench/plan.py --frontier --families --synthetic --pairs 3 --kinds integer  # held-out sets (issue #39)
    python bench/plan.py --frontier --families --pairs 3 --kinds integer --sets zipf "few values" \
        --lhotse-cache /tmp/lhotse_cells.json  # only these sets; lhotse measured once, then read back
    python bench/plan.py --frontier --families --synthetic --pairs 3 --kinds integer \
        --lhotse-buckets 10 30 60   # which of lhotse's bucket counts dominate the default (issue #39)
    python bench/plan.py --frontier --families --synthetic --pairs 3 --kinds integer \
        --level-targets 0.02 0.03 0.05   # what-if: the auto level fit aiming at other batch excesses
    python bench/plan.py --few-batch     # plan time of few-batch epochs, cheapest vs greedy cuts

It prints markdown tables:

1. Speed (per length set and sample count): plan time (best of ``--repeat``), batches vs the
   lower bound, padding efficiency and max fill for each strategy, beside a fixed batch size
   (the largest that never exceeds the budget) and the seed tools' pure-Python greedy loop
   (sum budget, a ``sizeof`` call per index, as equibatch/bionemo/aistore do), timed in the
   same run, with the speed-up over that loop; peak extra memory per sample (tracemalloc).
2. Quality at 1M samples (budget 16384, padded cost): padding efficiency, batches vs the
   optimal count (greedy over globally sorted sizes), max fill, co-batch repeat rate between
   epochs 0 and 1 and the Spearman correlation of batch position vs mean size, for integer and
   continuous (+U[0,1)) sizes, beside lhotse's DynamicBucketingSampler when it is installed.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    best_time,
    load,
    optimal_padded_batches,
    repeat_rate,
    resample,
    seed_greedy,
    spearman_position_size,
    synthetic,
)
from _families import families, local_real  # noqa: E402

import fitbatch  # noqa: E402
from fitbatch.plan import (
    fixed_size_plan,
    largest_safe_batch_size,  # noqa: E402
)

SETS = ("cpython_stdlib_functions", "cpython_stdlib_pytokens")
STRATEGIES = ("sequential", "sorted", "pooled", "buckets", "packed")
BUDGET = 16384.0








def _original_seed_samplers(sizes_list):
    """The seed packages themselves, when installed (pip install equibatch bionemo-size-aware-batching)."""
    out = []
    try:
        from equibatch import EquiarealBatchSampler

        def equi():
            sampler = EquiarealBatchSampler(
                sampler=range(len(sizes_list)), len_checker=sizes_list.__getitem__, max_size=10**12, max_footprint=BUDGET
            )
            return sampler.__iter__()  # its __len__ fails with torch installed; iteration works

        out.append(("equibatch EquiarealBatchSampler", equi))
    except ImportError:
        pass
    try:
        from bionemo.size_aware_batching.sampler import SizeAwareBatchSampler

        def bionemo():
            return iter(SizeAwareBatchSampler(range(len(sizes_list)), sizes_list.__getitem__, BUDGET, info_logger=None, warn_logger=None))

        out.append(("bionemo SizeAwareBatchSampler", bionemo))
    except ImportError:
        pass
    return out


def peak_bytes(fn) -> int:
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    out = fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del out
    return peak


def speed_table(name: str, sizes: np.ndarray, repeat: int, memory: bool) -> str:
    n = sizes.size
    oversized = "skip" if sizes.max() > BUDGET else "error"
    sizes_list = sizes.tolist()
    t_seed, seed_batches = best_time(lambda: sum(1 for _ in seed_greedy(range(n), sizes_list.__getitem__, BUDGET)), 1)
    safe = largest_safe_batch_size(sizes[sizes <= BUDGET], BUDGET)
    rows = []
    fixed = fixed_size_plan(sizes[sizes <= BUDGET], safe, budget=BUDGET).stats()
    rows.append(
        f"| fixed batch size {safe} | {fixed.plan_seconds:.3f} | – | {fixed.n_batches} | "
        f"{fixed.batches_vs_lower_bound:.3f} | {fixed.padding_efficiency:.3f} | {fixed.max_fill:.2f} | – |"
    )
    rows.append(f"| seed tools' pure-Python greedy (sum) | {t_seed:.3f} | 1.0x | {seed_batches} | – | – | – | – |")
    for label, make in _original_seed_samplers(sizes_list):
        t_orig, got = best_time(lambda make=make: sum(1 for _ in make()), 1)
        rows.append(f"| {label} (installed original, sum) | {t_orig:.3f} | {t_seed / t_orig:.1f}x | {got} | – | – | – | – |")
    configs = [(s, "padded") for s in STRATEGIES] + [("sequential", "sum"), ("packed", "sum")]
    for strategy, cost in configs:
        def run(strategy=strategy, cost=cost):
            return fitbatch.plan_batches(sizes, BUDGET, cost=cost, strategy=strategy, oversized=oversized)

        t, plan = best_time(run, repeat)
        st = plan.stats()
        mem = f"{peak_bytes(run) / n:.1f}" if memory else "–"
        rows.append(
            f"| {strategy} ({cost}) | {t:.3f} | {t_seed / t:.1f}x | {st.n_batches} | {st.batches_vs_lower_bound:.4f} | "
            f"{st.padding_efficiency:.4f} | {st.max_fill:.2f} | {mem} |"
        )
        del plan
    head = (
        f"\n### {name}, {n:,} samples (budget {BUDGET:g}, oversized={oversized})\n\n"
        "| plan | time s | vs seed loop | batches | vs lower bound | padding eff | max fill | peak B/sample |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *rows])


def lhotse_plans(sizes: np.ndarray, epochs: int, num_buckets: int = 30) -> list[fitbatch.BatchPlan] | None:
    """lhotse's DynamicBucketingSampler (``num_buckets``, seed 0) for epochs 0 .. epochs - 1, as plans."""
    try:
        from lhotse import CutSet
        from lhotse.dataset.sampling.dynamic_bucketing import DynamicBucketingSampler
        from lhotse.testing.dummies import dummy_cut
    except Exception:  # noqa: BLE001 - any import problem means "not available"
        return None
    # lhotse budgets durations (a sum): one second per token, max_duration = budget.
    cuts = CutSet.from_cuts(dummy_cut(i, duration=float(d)) for i, d in enumerate(sizes))
    sz = fitbatch.as_sizes(sizes)
    plans = []
    for epoch in range(epochs):
        sampler = DynamicBucketingSampler(cuts, max_duration=BUDGET, shuffle=True, seed=0, num_buckets=num_buckets)
        sampler.set_epoch(epoch)
        batches = [[int(c.id.split("-")[-1]) if "-" in c.id else int(c.id) for c in b] for b in sampler]
        order = np.asarray([i for b in batches for i in b], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in batches])]).astype(np.int64)
        plans.append(fitbatch.BatchPlan.from_batches(sz, "padded", order, offsets, budget=BUDGET, strategy_name="lhotse"))
    return plans


def lhotse_metrics(sizes: np.ndarray) -> tuple[float, float, float, float] | None:
    """Padding efficiency, batches vs optimal, repeat rate and position/size rho of lhotse's sampler."""
    plans = lhotse_plans(sizes, 2)
    if plans is None:
        return None
    p0, p1 = plans
    opt = optimal_padded_batches(sizes, BUDGET)
    eff = float(p0.real_units.sum() / p0.padded_units.sum())
    return eff, len(p0) / opt, repeat_rate(p0, p1, sizes.size), spearman_position_size(p0, sizes)


def quality_table(n: int, with_lhotse: bool) -> str:
    rows = []
    rng = np.random.default_rng(1)
    for name in SETS:
        base = resample(load(name), n)
        for continuous in (False, True):
            sizes = base + rng.random(base.size) if continuous else base.astype(np.float64)
            keep = sizes[sizes <= BUDGET]
            opt = optimal_padded_batches(keep, BUDGET)
            for strategy in ("pooled", "buckets"):
                p0 = fitbatch.plan_batches(keep, BUDGET, strategy=strategy, epoch=0)
                p1 = fitbatch.plan_batches(keep, BUDGET, strategy=strategy, epoch=1)
                st = p0.stats()
                rows.append(
                    f"| {name} | {'continuous' if continuous else 'integer'} | fitbatch {strategy} | "
                    f"{st.padding_efficiency:.4f} | {len(p0) / opt:.4f} | {st.max_fill:.3f} | "
                    f"{repeat_rate(p0, p1, keep.size):.3f} | {spearman_position_size(p0, keep):+.3f} |"
                )
            if with_lhotse:
                got = lhotse_metrics(keep)
                if got is None:
                    rows.append(f"| {name} | {'continuous' if continuous else 'integer'} | lhotse | not installed | | | | |")
                else:
                    eff, ratio, rep, rho = got
                    rows.append(
                        f"| {name} | {'continuous' if continuous else 'integer'} | lhotse DynamicBucketingSampler | "
                        f"{eff:.4f} | {ratio:.4f} | – | {rep:.3f} | {rho:+.3f} |"
                    )
    head = (
        f"\n### Quality at {n:,} samples (budget {BUDGET:g}, padded cost; pytokens samples over budget left out)\n\n"
        "| set | sizes | sampler | padding eff | batches vs optimal | max fill | repeat rate | position/size rho |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *rows])


KNOBS = (None, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, "auto")


LHOTSE_CACHE: str | None = None  # --lhotse-cache: lhotse's cells per (N, set, sizes, pairs), JSON
SET_FILTER: tuple[str, ...] = ()  # --sets: only the sets whose name holds one of these
LHOTSE_BUCKETS: tuple[int, ...] = (30,)  # --lhotse-buckets: lhotse's bucket counts beside the default (--pairs)


def frontier_sets(
    ns: list[int], with_synthetic: bool, with_families: bool = False, kinds: tuple[str, ...] = ("integer", "continuous")
) -> Iterator[tuple[int, str, str, np.ndarray, int]]:
    """(N, set, "integer" / "continuous", sizes within the budget, sorted batch count) for every
    row of the frontier tables: the real sets at each N, the synthetic shapes at N <= 100k, and
    with ``with_families`` the held-out families and local real sets of ``_families``
    (only those ``--sets`` names, when given)."""
    for n in ns:
        bases = {name: resample(load(name), n) for name in SETS}
        if with_synthetic and n <= 100_000:  # only small sets have few-batch epochs
            bases.update(synthetic(n))
        if with_families:
            bases.update(families(n))
            bases.update(local_real(n))
        for name, base in bases.items():
            if SET_FILTER and not any(part in name for part in SET_FILTER):
                continue
            for continuous in (False, True):
                if ("continuous" if continuous else "integer") not in kinds:
                    continue
                sizes = base + np.random.default_rng(1).random(n) if continuous else base.astype(np.float64)
                keep = sizes[sizes <= BUDGET]
                yield n, name, "continuous" if continuous else "integer", keep, optimal_padded_batches(keep, BUDGET)


def frontier_table(ns: list[int], with_lhotse: bool, with_synthetic: bool = False, with_families: bool = False,
                   kinds: tuple[str, ...] = ("integer", "continuous")) -> tuple[str, list[tuple]]:
    """Padding efficiency, repeat rate and batches vs sorted for each randomness= value."""
    rows, points = [], []
    for n, name, kind, keep, opt in frontier_sets(ns, with_synthetic, with_families, kinds):
        for strategy in ("pooled", "buckets"):
            for knob in KNOBS:
                s = fitbatch.Pooled(randomness=knob) if strategy == "pooled" else fitbatch.Buckets(randomness=knob)
                p0 = fitbatch.plan_batches(keep, BUDGET, strategy=s, epoch=0)
                p1 = fitbatch.plan_batches(keep, BUDGET, strategy=s, epoch=1)
                st = p0.stats()
                rep = repeat_rate(p0, p1, keep.size)
                points.append((n, name, kind, strategy, knob, st.padding_efficiency, rep, len(p0) / opt))
                rows.append(f"| {n:,} | {name} | {kind} | {strategy} | {knob} | {st.padding_efficiency:.3f} | "
                            f"{rep:.3f} | {len(p0) / opt:.3f} | {st.max_fill:.3f} |")
        got = lhotse_metrics(keep) if with_lhotse else None
        if got is not None:
            eff, ratio, rep, _ = got
            points.append((n, name, kind, "lhotse", None, eff, rep, ratio))
            rows.append(f"| {n:,} | {name} | {kind} | lhotse DynamicBucketingSampler | 30 buckets | {eff:.3f} | "
                        f"{rep:.3f} | {ratio:.3f} | – |")
        print(rows[-1], flush=True, file=sys.stderr)
    head = (
        f"\n### randomness= frontier (budget {BUDGET:g}, padded cost; repeat = co-batch repeat rate epoch 0 -> 1)\n\n"
        "| N | set | sizes | strategy | randomness | padding eff | repeat | batches vs sorted | max fill |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *rows]), points


DIFFERENT: set[str] = set()  # rows whose cached lhotse cell was measured on another set


def fingerprint(sizes: np.ndarray) -> str:
    """The set a cached lhotse cell was measured on: count and total of the sizes."""
    return f"{sizes.size}:{float(np.sum(sizes)):.0f}"


def pairs_table(ns: list[int], pairs: int, with_synthetic: bool, with_families: bool = False,
                kinds: tuple[str, ...] = ("integer", "continuous")) -> str:
    """The default (``pooled``, ``randomness="auto"``) beside lhotse over ``pairs`` consecutive
    epoch pairs (0 -> 1, 1 -> 2, ...): the repeat rate of one pair depends on how far the level
    boundaries moved between those two epochs, so a single pair can flatter either side."""
    rows = []

    def cell(plans: list[fitbatch.BatchPlan], n: int, opt: int) -> tuple[float, np.ndarray, float]:
        reps = np.array([repeat_rate(plans[e], plans[e + 1], n) for e in range(pairs)])
        return float(np.mean([p.stats().padding_efficiency for p in plans])), reps, max(len(p) for p in plans) / opt

    cache = json.loads(Path(LHOTSE_CACHE).read_text()) if LHOTSE_CACHE and Path(LHOTSE_CACHE).exists() else {}

    def theirs(keep: np.ndarray, key: str, opt: int, buckets: int) -> tuple[float, np.ndarray, float, bool]:
        if buckets != 30:
            key += f"|b{buckets}"
        if key not in cache:
            plans = lhotse_plans(keep, pairs + 1, buckets)
            if plans is None:
                raise SystemExit("--pairs needs lhotse (pip install lhotse) or --lhotse-cache with this row")
            le, lr, lb = cell(plans, keep.size, opt)
            cache[key] = {"eff": le, "reps": lr.tolist(), "batches": lb, "set": fingerprint(keep)}
            if LHOTSE_CACHE:
                Path(LHOTSE_CACHE).write_text(json.dumps(cache, indent=1))
        got = cache[key]
        if got.get("set") not in (None, fingerprint(keep)):  # e.g. "doc paragraphs" on another site-packages
            print(f"# {key}: lhotse's cell was measured on another set ({got['set']} against {fingerprint(keep)})",
                  file=sys.stderr)
            DIFFERENT.add(key.rsplit("|", 1)[0])
        return got["eff"], np.asarray(got["reps"]), got["batches"], bool(got.get("rounded"))

    grid = len(LHOTSE_BUCKETS) > 1 or LHOTSE_BUCKETS[0] != 30
    for n, name, kind, keep, opt in frontier_sets(ns, with_synthetic, with_families, kinds):
        fe, fr, fb = cell([fitbatch.plan_batches(keep, BUDGET, epoch=e) for e in range(pairs + 1)], keep.size, opt)
        key = f"{n}|{name}|{kind}|{pairs}"
        if grid:  # lhotse at each bucket count: which settings dominate the default, which it dominates
            over, under, cells = [], [], []
            for buckets in LHOTSE_BUCKETS:
                le, lr, lb, _ = theirs(keep, key, opt, buckets)
                cells.append(f"{buckets}: {le:.3f} / {lr.mean():.3f} / {lb:.3f}")
                if le >= fe and lr.mean() <= fr.mean() and lb <= fb:
                    over.append(str(buckets))
                if fe >= le and fr.mean() <= lr.mean() and fb <= lb:
                    under.append(str(buckets))
            rows.append(
                f"| {n:,} | {name} | {kind} | {fe:.3f} / {fr.mean():.3f} / {fb:.3f} | {'; '.join(cells)} | "
                f"{', '.join(under) or 'none'} | {', '.join(over) or 'none'} |"
            )
            print(rows[-1], flush=True, file=sys.stderr)
            continue
        le, lr, lb, rounded = theirs(keep, key, opt, 30)
        if rounded:  # cells copied from a printed table: compare as printed
            fe, fr, fb = round(fe, 3), np.round(fr, 3), round(fb, 3)
        wins = int(np.sum(fr <= lr))
        ok = fe >= le and fr.mean() <= lr.mean() and fb <= 1.05
        ok39 = fe >= le and fr.mean() <= lr.mean() and fb <= lb  # issue #39: no more batches than lhotse's
        if f"{n}|{name}|{kind}" in DIFFERENT:
            ok = ok39 = False  # not the same set: no verdict
        rows.append(
            f"| {n:,} | {name}{' (lhotse: another set)' if f'{n}|{name}|{kind}' in DIFFERENT else ''} | {kind} | {fe:.3f} / {le:.3f} | "
            f"{fr.min():.3f}-{fr.max():.3f} / {lr.min():.3f}-{lr.max():.3f} | **{fr.mean():.3f}** / {lr.mean():.3f} | "
            f"{fb:.3f} / {lb:.3f} | {wins} of {pairs} | {'yes' if ok else 'no'} | {'yes' if ok39 else 'no'} |"
        )
        print(rows[-1], flush=True, file=sys.stderr)
    if grid:
        return "\n".join([
            f"\n### The default beside lhotse at {', '.join(map(str, LHOTSE_BUCKETS))} buckets over {pairs} epoch pairs "
            f"(budget {BUDGET:g}, padded cost)\n\n"
            "| N | set | sizes | default: padding eff / repeat (mean) / batches vs sorted (most) "
            "| lhotse per bucket count, the same cells | bucket counts the default dominates "
            "| bucket counts that dominate the default |\n|---|---|---|---|---|---|---|",
            *rows,
        ])
    head = (
        f"\n### The default beside lhotse over {pairs} epoch pairs (budget {BUDGET:g}, padded cost)\n\n"
        "| N | set | sizes | padding eff (mean) | repeat per pair (min-max) | repeat (mean) | batches vs sorted (most) "
        "| pairs with repeat <= lhotse's | dominates on the means (#18: batches <= 1.05x sorted) "
        "| dominates on the means (#39: batches <= lhotse's) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *rows])


def level_target_table(ns: list[int], pairs: int, targets: list[float], with_synthetic: bool, with_families: bool = False,
                       kinds: tuple[str, ...] = ("integer", "continuous")) -> str:
    """What-if (not a setting of the library): the default's ``"auto"`` level fit aiming at each
    batch excess of ``targets`` instead of ``auto_excess(n)``, everything else as is (on sets of up
    to 100,000 samples the densest batches still split into what is left of the 5 % allowance).
    Cells: padding eff (mean) / repeat (mean of ``pairs``) / batches vs sorted (most), ✓ where
    that dominates lhotse's 30-bucket cell (read from ``--lhotse-cache`` or measured)."""
    from fitbatch.strategies import _base, _mixing

    cache = json.loads(Path(LHOTSE_CACHE).read_text()) if LHOTSE_CACHE and Path(LHOTSE_CACHE).exists() else {}
    original = _mixing.auto_excess
    rows = []
    try:
        for n, name, kind, keep, opt in frontier_sets(ns, with_synthetic, with_families, kinds):
            key = f"{n}|{name}|{kind}|{pairs}"
            if key not in cache:
                plans = lhotse_plans(keep, pairs + 1)
                if plans is None:
                    raise SystemExit("--level-targets needs lhotse or --lhotse-cache with this row")
                reps = [repeat_rate(plans[e], plans[e + 1], keep.size) for e in range(pairs)]
                cache[key] = {"eff": float(np.mean([p.stats().padding_efficiency for p in plans])), "reps": reps,
                              "batches": max(len(p) for p in plans) / opt}
            le, lr, lb = cache[key]["eff"], float(np.mean(cache[key]["reps"])), cache[key]["batches"]
            cells = []
            for target in targets:
                _mixing.auto_excess = lambda _n, t=target: t  # type: ignore[assignment]
                _base._SHARED.clear()  # level fits are kept by their settings, which hold no target
                plans = [fitbatch.plan_batches(keep, BUDGET, epoch=e) for e in range(pairs + 1)]
                fe = float(np.mean([p.stats().padding_efficiency for p in plans]))
                fr = float(np.mean([repeat_rate(plans[e], plans[e + 1], keep.size) for e in range(pairs)]))
                fb = max(len(p) for p in plans) / opt
                ok = fe >= le and fr <= lr and fb <= lb
                cells.append(f"{fe:.3f} / {fr:.3f} / {fb:.3f}{' ✓' if ok else ''}")
            rows.append(f"| {n:,} | {name} | {kind} | {le:.3f} / {lr:.3f} / {lb:.3f} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True, file=sys.stderr)
    finally:
        _mixing.auto_excess = original
        _base._SHARED.clear()
    head = (
        f"\n### The auto level fit aiming at other batch excesses (what-if; {pairs} epoch pairs, budget {BUDGET:g})\n\n"
        "| N | set | sizes | lhotse (30 buckets) | " + " | ".join(f"level target {t:g}" for t in targets) + " |\n"
        "|---|---|---|---|" + "---|" * len(targets)
    )
    return "\n".join([head, *rows])


def frontier_plot(points: list[tuple], path: str) -> None:
    """One panel per (set, N), integer sizes: repeat vs padding efficiency per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in points if p[1] in SETS]
    names, ns = sorted({p[1] for p in points}), sorted({p[0] for p in points})
    fig, grid = plt.subplots(len(names), len(ns), figsize=(4.6 * len(ns), 3.6 * len(names)), squeeze=False)
    axes = [[ax for row in grid for ax in row]]
    panels = [(name, n) for name in names for n in ns]
    for ax, (name, n) in zip(axes[0], panels):
        for strategy, marker in (("pooled", "o-"), ("buckets", "s-"), ("lhotse", "k*")):
            for kind, alpha in (("integer", 1.0), ("continuous", 0.45)):
                pts = [p for p in points if p[1] == name and p[0] == n and p[3] == strategy and p[2] == kind]
                curve = sorted((p for p in pts if p[4] not in (None, "auto")), key=lambda p: p[6])
                if strategy == "lhotse":
                    curve = pts
                if curve:
                    ax.plot([p[6] for p in curve], [p[5] for p in curve], marker, alpha=alpha, ms=10 if strategy == "lhotse" else 4,
                            label=f"{strategy} {kind}")
                auto = [p for p in pts if p[4] == "auto"]
                if auto:
                    ax.plot([auto[0][6]], [auto[0][5]], "r^", alpha=alpha, ms=8)
        ax.set_xscale("log")
        ax.set_xlabel("co-batch repeat rate (lower = more random)")
        ax.set_ylabel("padding efficiency")
        ax.set_title(f"{name.replace('cpython_stdlib_', '')}, N={n:,}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def few_batch_table(ns: list[int], repeat: int) -> str:
    """Plan time of few-batch "auto" epochs (under 64 batches): the default, which cuts the
    shuffled order at the least total cost, against the greedy walk's cuts (``greedy_cuts``)."""
    from fitbatch.strategies._recut import greedy_cuts

    def timed(sizes: np.ndarray, epoch: int) -> float:
        return best_time(lambda: fitbatch.plan_batches(sizes, BUDGET, epoch=epoch), repeat)[0]

    def walk(sizes: np.ndarray, epoch: int) -> float:
        with greedy_cuts():
            return timed(sizes, epoch)

    rows = []
    for n in ns:
        bases = {name.removeprefix("cpython_stdlib_"): resample(load(name), n) for name in SETS}
        bases.update(synthetic(n))
        for name, base in bases.items():
            for continuous in (False, True):
                sizes = base + np.random.default_rng(1).random(n) if continuous else base.astype(np.float64)
                sizes = sizes[sizes <= BUDGET]
                batches = len(fitbatch.plan_batches(sizes, BUDGET))
                if batches >= 64:
                    continue
                cut = [timed(sizes, e) * 1e3 for e in range(5)]
                greedy = [walk(sizes, e) * 1e3 for e in range(5)]
                rows.append(f"| {n:,} | {name} | {'continuous' if continuous else 'integer'} | {batches} | "
                            f"{np.median(cut):.1f} / {max(cut):.1f} | {np.median(greedy):.1f} / {max(greedy):.1f} |")
    jit = {"0": "numpy only", "1": "numba loaded"}.get(os.environ.get("FITBATCH_JIT", ""), "default")
    head = (f"\n### Few-batch epochs: plan time, ms, median / max over epochs 0-4 (best of {repeat} each; kernels: {jit})\n\n"
            "| N | set | sizes | batches | cheapest cuts (default) | greedy cuts |\n|---|---|---|---|---|---|")
    return "\n".join([head, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=None, help="sample counts (0 = real size)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-lhotse", action="store_true")
    parser.add_argument("--quality-n", type=int, default=1_000_000)
    parser.add_argument("--frontier", action="store_true", help="only the randomness= frontier table")
    parser.add_argument("--frontier-n", type=int, nargs="*", default=[20_000, 100_000])
    parser.add_argument("--plot", default=None, help="save the frontier plot (matplotlib) here")
    parser.add_argument("--synthetic", action="store_true", help="frontier: add three synthetic sets (few-batch epochs)")
    parser.add_argument("--families", action="store_true",
                        help="frontier: add the held-out families and local real sets (bench/_families.py)")
    parser.add_argument("--kinds", nargs="+", default=["integer", "continuous"], choices=["integer", "continuous"])
    parser.add_argument("--few-batch", action="store_true", help="only the plan times of few-batch epochs (10k, 20k)")
    parser.add_argument("--pairs", type=int, default=0, help="frontier: only the default beside lhotse over this many epoch pairs")
    parser.add_argument("--sets", nargs="+", default=[], help="frontier: only the sets whose name holds one of these")
    parser.add_argument("--lhotse-cache", default=None,
                        help="--pairs: read lhotse's cells from this JSON file, and write there those it had to measure "
                             "(lhotse's plans do not depend on fitbatch: measure them once, then iterate on fitbatch)")
    parser.add_argument("--lhotse-buckets", type=int, nargs="+", default=[30],
                        help="--pairs: lhotse's num_buckets; more than one (or not 30) prints which settings dominate "
                             "the default and which the default dominates (issue #39: below 20k no setting should)")
    parser.add_argument("--level-targets", type=float, nargs="+", default=None,
                        help="--pairs: what-if table of the auto level fit aiming at these batch excesses (issue #39)")
    args = parser.parse_args()
    global LHOTSE_CACHE, SET_FILTER, LHOTSE_BUCKETS
    LHOTSE_CACHE, SET_FILTER, LHOTSE_BUCKETS = args.lhotse_cache, tuple(args.sets), tuple(args.lhotse_buckets)
    if args.few_batch:
        print(few_batch_table([10_000, 20_000], max(args.repeat, 5)), flush=True)
        return
    logging.getLogger("fitbatch").setLevel(logging.ERROR)  # skipped oversized samples are in the tables
    if args.frontier and args.pairs and args.level_targets:
        print(level_target_table(args.frontier_n, args.pairs, args.level_targets, args.synthetic, args.families,
                                 tuple(args.kinds)), flush=True)
        return
    if args.frontier and args.pairs:
        print(pairs_table(args.frontier_n, args.pairs, args.synthetic, args.families, tuple(args.kinds)), flush=True)
        return
    if args.frontier:
        table, points = frontier_table(args.frontier_n, not args.no_lhotse, args.synthetic, args.families, tuple(args.kinds))
        print(table, flush=True)
        if args.plot:
            frontier_plot(points, args.plot)
        return
    counts = args.sizes if args.sizes is not None else ([0, 1_000_000] if args.quick else [0, 1_000_000, 10_000_000])
    print(f"fitbatch {fitbatch.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} cores")
    for name in SETS:
        base = load(name)
        for count in counts:
            sizes = resample(base, count or base.size)
            print(speed_table(name, sizes, args.repeat, memory=not args.quick), flush=True)
    print(quality_table(args.quality_n, not args.no_lhotse), flush=True)


if __name__ == "__main__":
    main()
