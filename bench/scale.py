"""Scale benchmark, part 1: size indexes (``fitbatch.build_size_index``, ``fitbatch.SizeIndex``).

Run from the repository root:

    python bench/scale.py                                   # 20 shards x 500k rows; plan 1e8
    python bench/scale.py --shards 4 --rows 100000 --text-rows 5000 --plan-n 10000000   # quicker

It prints two markdown tables:

1. Index build: ``build_size_index`` over ``--shards`` parquet files, sizes resampled from the
   real CPython function lengths, for two workloads: ``--rows`` rows of an int32 token-count
   column (reading only), and ``--text-rows`` rows of text sized by a Python ``sizeof`` (words
   per text: a stand-in for a tokenizer). Each with the local engine on 1 and 2 worker processes
   and with Ray on a local 2-CPU cluster (``ray.init`` timed apart); every build is checked byte
   for byte against the first.
2. Planning from an open index of ``--plan-n`` int32 sizes (resampled from the same real set),
   each run in a fresh subprocess: ``SizeIndex.open`` + ``plan_batches`` (sorted and
   sequential strategies) beside ``plan_batches`` on the same sizes loaded into memory with
   ``np.load``; best of 2 alternated runs (index, array, array, index), and the peak RSS.
3. ``--windows 1e8,1e9``: windowed planning (``BudgetBatchSampler(window=...)``) as one simulated
   rank of ``--ranks`` (1,024): first batch, resume, census share, peak anonymous memory, and
   the windowed epoch against the global plan up to ``--quality-upto`` (``bench/_scale_windows.py``):

       python bench/scale.py --windows 1e8,1e9 --only-windows --work /tmp/fitbatch-windows
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import load, resample  # noqa: E402

import fitbatch  # noqa: E402


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def word_count(texts: list[str]) -> list[int]:
    """A stand-in for a tokenizer: whitespace words per text (Python work per row)."""
    return [len(t.split()) for t in texts]


def write_shards(data: Path, shards: int, rows: int, text: bool) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = load("cpython_stdlib_functions")
    data.mkdir()
    for k in range(shards):
        part = resample(base, rows, seed=k).astype(np.int32)
        column = pa.array(["ab " * n for n in part.tolist()]) if text else pa.array(part)
        pq.write_table(
            pa.table({"text" if text else "n_tokens": column}), data / f"part-{k:05d}.parquet"
        )


def build_table(work: Path, shards: int, rows: int, text: bool) -> list[list[str]]:
    data = work / ("text" if text else "numeric")
    write_shards(data, shards, rows, text)
    options: dict[str, object] = (
        {"column": "text", "sizeof": word_count} if text else {"column": "n_tokens"}
    )
    out: list[list[str]] = []
    reference: dict[str, bytes] | None = None
    cases: list[tuple[str, dict[str, object]]] = [
        ("local, 1 worker", {"engine": "local", "workers": 1}),
        ("local, 2 workers", {"engine": "local", "workers": 2}),
        ("ray, 2 CPUs", {"engine": "ray"}),
    ]
    for name, kw in cases:
        note = ""
        if kw["engine"] == "ray":
            import ray

            t0 = time.perf_counter()
            os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))  # workers import this fitbatch
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            note = f"ray.init {time.perf_counter() - t0:.1f} s (not included)"
        target = data.with_name(data.name + "-" + name.replace(" ", "").replace(",", "_"))
        t0 = time.perf_counter()
        index = fitbatch.build_size_index(str(data), target, progress=False, **options, **kw)  # type: ignore[arg-type]
        seconds = time.perf_counter() - t0
        if kw["engine"] == "ray":
            import ray

            ray.shutdown()
        files = _files(target)
        same = (
            "reference"
            if reference is None
            else ("identical" if files == reference else "DIFFERENT")
        )
        reference = reference or files
        out.append(
            [
                name,
                f"{len(index):,}",
                f"{seconds:.2f}",
                f"{len(index) / seconds / 1e6:.2f}",
                same,
                note,
            ]
        )
    return out


PLAN = r"""
import json, resource, sys, time
import numpy as np
import fitbatch
path, how, strategy = sys.argv[1:4]
t0 = time.perf_counter()
sizes = fitbatch.SizeIndex.open(path) if how == "index" else np.load(path + "/sizes.npy")
t1 = time.perf_counter()
plan = fitbatch.plan_batches(sizes, 16384, cost="padded", strategy=strategy, seed=0)
t2 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "plan": t2 - t1, "batches": len(plan),
                  "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def plan_table(work: Path, n: int) -> list[list[str]]:
    base = load("cpython_stdlib_functions")
    step = 10_000_000
    chunks = (resample(base, min(step, n - a), seed=100 + a // step) for a in range(0, n, step))
    t0 = time.perf_counter()
    index = fitbatch.SizeIndex.create(
        work / "big", chunks, source=f"resampled cpython_stdlib_functions x{n}"
    )
    created = time.perf_counter() - t0
    out = [
        [
            "SizeIndex.create",
            "-",
            f"{created:.1f}",
            "-",
            "-",
            f"{len(index):,} int32 sizes, {index.num_shards} shards",
        ]
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for strategy in ("sorted", "sequential"):
        runs: dict[str, list[dict[str, float]]] = {"index": [], "array": []}
        for how in ("index", "array", "array", "index"):  # alternated: no order advantage
            res = subprocess.run(
                [sys.executable, "-c", PLAN, str(work / "big"), how, strategy],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            runs[how].append(json.loads(res.stdout))
        for how, found in runs.items():
            r = min(found, key=lambda x: x["open"] + x["plan"])  # best of 2
            what = "SizeIndex.open (memmap)" if how == "index" else "np.load (in memory)"
            rss = max(x["rss_gib"] for x in found)
            out.append(
                [
                    f"{strategy}: {what}",
                    f"{r['open']:.2f}",
                    f"{r['plan']:.1f}",
                    f"{r['batches']:,}",
                    f"{rss:.2f}",
                    "best of 2",
                ]
            )
    return out


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--text-rows", type=int, default=50_000)
    parser.add_argument("--plan-n", type=int, default=100_000_000)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--windows", default="", help="part 3: sample counts for windowed planning, e.g. 1e8,1e9")
    parser.add_argument("--ranks", type=int, default=1024, help="part 3: simulated world size")
    parser.add_argument("--rank", type=int, default=517, help="part 3: the simulated rank")
    parser.add_argument("--quality-upto", type=float, default=1e8, help="part 3: compare with the global plan up to this size")
    parser.add_argument("--work", default="", help="part 3: keep the indexes here (reused by a later run)")
    parser.add_argument("--only-windows", action="store_true", help="run part 3 alone")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}\n"
    )
    if args.windows:
        from _scale_windows import tables

        keep = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="fitbatch-windows-"))
        keep.mkdir(parents=True, exist_ok=True)
        sizes = [int(float(x)) for x in args.windows.split(",")]
        print(tables(keep, sizes, args.ranks, args.rank, int(args.quality_upto)))
        print()
        if args.only_windows:
            return
    work = Path(tempfile.mkdtemp(prefix="fitbatch-scale-"))
    try:
        if not args.skip_build:
            for text, rows in ((False, args.rows), (True, args.text_rows)):
                what = (
                    "a text column, sizeof=word_count (Python per row)"
                    if text
                    else "an int32 column (reading only)"
                )
                print(f"### Index build: {args.shards} parquet shards x {rows:,} rows, {what}\n")
                headers = ["engine", "sizes", "seconds", "M sizes/s", "bytes", "note"]
                print(table(headers, build_table(work, args.shards, rows, text)))
                print()
        print(
            f"### Planning from an open index of {args.plan_n:,} int32 sizes (budget 16384, padded)\n"
        )
        print(
            table(
                ["case", "open s", "plan s", "batches", "peak RSS GiB", "note"],
                plan_table(work, args.plan_n),
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
