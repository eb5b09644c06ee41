"""Plan speed against fairseq's Cython ``batch_by_size_vec``, measured in the same run.

fairseq is not a dependency and none of its code is in this repository: point the script at a
build of its ``fairseq/data/data_utils_fast.pyx`` (Cython + a C++ compiler), or let it build one
from a fairseq checkout:

    pip install cython
    python bench/vs_fairseq.py --fairseq-pyx /path/to/fairseq/fairseq/data/data_utils_fast.pyx
    python bench/vs_fairseq.py --n 10000000 --repeat 3    # with fairseq installed
    python bench/vs_fairseq.py --fairseq-built DIR --n 20000 1000000 --repeat 5   # DIR: an earlier build
    python bench/vs_fairseq.py --fairseq-built DIR --first-call --n 1000000       # fresh process per cell
    python bench/vs_fairseq.py --fairseq-built DIR --first-call --n 1000000 --aot off  # numba's JIT only
    python bench/vs_fairseq.py --fairseq-built DIR --first-call --stages --n 1000000   # where a first call's CPU goes
    python bench/vs_fairseq.py --fairseq-built DIR --clock cpu --settle --n 20000  # numba loaded first
    python bench/vs_fairseq.py --memory --n 10000000                               # peak bytes per sample
    FITBATCH_JIT=0 python bench/vs_fairseq.py --n 2000 5000 10000 15000 --repeat 30  # small sets, numpy
    FITBATCH_JIT=0 python bench/vs_fairseq.py --n 2000 5000 10000 15000 --repeat 30 --epochs 20

Both sides plan the same sizes (a real length set resampled to ``--n``, samples over the budget
left out) under the padded cost (fairseq's ``max_tokens``: batch count x longest) and
*materialise* the batches as index arrays, as a loader would consume them:

* fairseq: the shuffled indices sorted by size, then ``batch_by_size_vec(indices,
  sizes[indices], max_tokens, -1, 1)`` (a list of arrays), twice: with the stable sort its
  ``ordered_indices`` ships (mergesort: most of its time at 1M and more) and with numpy's default
  sort (what a fair benchmark of its batching gives it). "vs fairseq" is quoted against both;
  the headline uses the default sort;
* fitbatch: ``plan_batches(sizes, budget, strategy=...)`` then ``list(plan)``; also ``packed``
  with the sum cost (a token budget without padding, which fairseq has no mode for: time only).

Sets: the two shared real sets and ``lognormal`` (made here: whole token counts, median 256,
sigma 1.0, capped at the budget). Times are the best of ``--repeat`` rounds in which every cell
runs once in turn (load from other work on the machine falls on all cells alike; with `--clock cpu`
the calling thread's CPU time, the collector paused while a cell runs, as in timeit); "vs fairseq"
is fairseq's time / fitbatch's (above 1: fitbatch is faster). With ``--epochs K`` the fitbatch cells are instead what a sampler pays per
epoch: epochs 1..K of one ``Sizes`` (planned once at epoch 0 first), the mean per epoch, the best
of 3 such runs (a ``Sizes`` keeps what does not depend on the epoch: size keys, level fits,
sorted batch counts, lattice ranks).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_time, load, resample  # noqa: E402

import fitbatch  # noqa: E402

SETS = ("cpython_stdlib_functions", "cpython_stdlib_pytokens", "lognormal")
SYNTHETIC = ("lognormal",)
CLOCK = ["wall"]  # --clock
SETTLED = [False]  # --settle
STRATEGIES = ("sequential", "sorted", "pooled", "buckets", "packed")


def build(pyx: Path, out: Path) -> None:
    """Compile fairseq's ``data_utils_fast.pyx`` into ``out`` (needs Cython and a C++ compiler)."""
    setup = out / "setup.py"
    setup.write_text(
        "from setuptools import setup, Extension\n"
        "from Cython.Build import cythonize\n"
        "import numpy as np\n"
        "setup(ext_modules=cythonize([Extension('data_utils_fast', ['data_utils_fast.pyx'], "
        "include_dirs=[np.get_include()], language='c++', extra_compile_args=['-O3'])], language_level=3))\n"
    )
    (out / "data_utils_fast.pyx").write_text(pyx.read_text())
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=out, check=True, capture_output=True)


def fairseq_module(pyx: str | None, tmp: Path, built: str | None = None) -> Any:
    if built:  # a folder holding an earlier build (data_utils_fast.*.so)
        sys.path.insert(0, built)
        return importlib.import_module("data_utils_fast")
    if pyx:
        build(Path(pyx), tmp)
        sys.path.insert(0, str(tmp))
        return importlib.import_module("data_utils_fast")
    try:
        return importlib.import_module("fairseq.data.data_utils_fast")
    except ImportError:
        return None


def run_fairseq(fs: Any, sizes: np.ndarray, budget: int, kind: str | None = "stable") -> list[Any]:
    """fairseq's way: shuffled indices sorted by size, then its Cython batching.

    ``kind="stable"`` is the sort fairseq ships (``ordered_indices``: ``np.argsort(...,
    kind="mergesort")``); ``kind=None`` is numpy's default sort (introsort, SIMD where numpy has
    it), what a fair benchmark of its batching gives it: ties come out in another order, the
    batches have the same count.
    """
    idx = np.random.default_rng(0).permutation(sizes.size)
    idx = idx[np.argsort(sizes[idx], kind=kind)]
    return fs.batch_by_size_vec(idx, sizes[idx], budget, -1, 1)


def synthetic(name: str, n: int, budget: int) -> np.ndarray:
    """A set this script makes: ``lognormal`` (token counts of median 256, sigma 1.0, whole
    numbers from 1, capped at the budget; seed 0) — a shape neither shared set has."""
    if name != "lognormal":
        raise ValueError(f"unknown synthetic set {name!r}")
    rng = np.random.default_rng(0)
    return np.clip(np.rint(rng.lognormal(np.log(256.0), 1.0, n)), 1, budget).astype(np.int64)


def sizes_of(name: str, n: int, budget: int) -> np.ndarray:
    """``n`` whole sizes within the budget from a shared set (resampled, seed 0) or a synthetic one."""
    if name in SYNTHETIC:
        return synthetic(name, n, budget)
    base = load(name)
    return resample(base[base <= budget], n).astype(np.int64)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[10_000_000], help="one table per size")
    p.add_argument("--budget", type=int, default=16384)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--fairseq-pyx", help="fairseq's fairseq/data/data_utils_fast.pyx, compiled for this run")
    p.add_argument("--epochs", type=int, default=0, help="fitbatch: mean per epoch over epochs 1..K of one Sizes")
    p.add_argument("--fairseq-built", help="a folder with data_utils_fast built by an earlier run (no rebuild)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: time cells by the calling thread's CPU time (fairer on a shared, loaded machine)")
    p.add_argument("--sets", nargs="+", default=list(SETS), help=f"of {', '.join(SETS)}")
    p.add_argument("--first-call", action="store_true",
                   help="instead: a fresh process per cell, import + first plan + batches (wall and CPU seconds)")
    p.add_argument("--stages", action="store_true",
                   help="with --first-call: CPU seconds of each stage (import numpy, load the sizes, import, plan/sort, batches)")
    p.add_argument("--settle", action="store_true",
                   help="load numba first (a process that has planned enough for its background load): the compiled loops' "
                        "times, not numpy's while the load is under way")
    p.add_argument("--aot", choices=("auto", "off"), default="auto",
                   help="the ahead-of-time cache of the compiled loops (python -m fitbatch._kernels.aot_build): "
                        "auto uses it where built, off sets FITBATCH_AOT=0 here and in the processes started")
    p.add_argument("--memory", action="store_true",
                   help="instead: tracemalloc peak of plan_batches per sample, a fresh process per cell (numba's loops loaded first, the ahead-of-time cache off)")
    args = p.parse_args(argv)
    CLOCK[0] = args.clock
    if args.aot == "off":
        os.environ["FITBATCH_AOT"] = "0"
    from fitbatch._kernels import aot

    state = "off" if not aot.enabled() else "built" if aot.available() else "not built"
    print(f"ahead-of-time cache of the compiled loops: {state} ({aot.directory()})")
    if args.memory:
        for n in args.n:
            peaks(n, args.budget, args.sets)
        return
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        if args.first_call:
            built = args.fairseq_built
            if built is None and args.fairseq_pyx:
                build(Path(args.fairseq_pyx), Path(tmp))
                built = tmp
            for n in args.n:
                (first_stages if args.stages else first_calls)(built, n, args.budget, args.repeat, args.sets)
            return
        fs = fairseq_module(args.fairseq_pyx, Path(tmp), args.fairseq_built)
        if args.settle:  # what a process that planned LOAD_AT samples has once the load is done
            from fitbatch._kernels import jit

            jit.enabled()
            jit._warm(jit._module)
            SETTLED[0] = True
        print(f"fitbatch {fitbatch.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
              f"{platform.machine()}; fairseq batch_by_size_vec: {'compiled here' if fs else 'not available'}")
        for n in args.n:
            table(fs, n, args.budget, args.repeat, args.epochs, args.sets)


FIRST = """
import sys, time
wall, cpu = time.perf_counter(), time.process_time()
import numpy as np
sizes = np.load({path!r})
cell = {cell!r}
if cell.startswith("fairseq"):
    sys.path.insert(0, {built!r})
    import data_utils_fast as fs
    idx = np.random.default_rng(0).permutation(sizes.size)
    idx = idx[np.argsort(sizes[idx], kind=None if "default" in cell else "stable")]
    batches = fs.batch_by_size_vec(idx, sizes[idx], {budget}, -1, 1)
else:
    import fitbatch
    options = dict(cost="sum", strategy="packed") if cell == "packed, sum cost" else dict(strategy=cell)
    batches = list(fitbatch.plan_batches(sizes, {budget}, **options))
jit = sys.modules.get("fitbatch._kernels.jit")
module = getattr(jit, "_module", None)
loops = "numpy" if module is None else "ahead-of-time" if module.__name__.startswith("fitbatch._kernels.aot") else "numba"
print(time.perf_counter() - wall, time.process_time() - cpu, "numba" in sys.modules, "-" if jit is None else loops)
"""


STAGES = """
import sys, time
t = [time.process_time()]
import numpy as np
t.append(time.process_time())
sizes = np.load({path!r})
t.append(time.process_time())
cell = {cell!r}
if cell.startswith("fairseq"):
    sys.path.insert(0, {built!r})
    import data_utils_fast as fs
    t.append(time.process_time())
    idx = np.random.default_rng(0).permutation(sizes.size)
    idx = idx[np.argsort(sizes[idx], kind=None if "default" in cell else "stable")]
    t.append(time.process_time())
    batches = fs.batch_by_size_vec(idx, sizes[idx], {budget}, -1, 1)
else:
    import fitbatch
    t.append(time.process_time())
    options = dict(cost="sum", strategy="packed") if cell == "packed, sum cost" else dict(strategy=cell)
    plan = fitbatch.plan_batches(sizes, {budget}, **options)
    t.append(time.process_time())
    batches = list(plan)
t.append(time.process_time())
print(*[b - a for a, b in zip(t, t[1:])], len(batches))
"""


MEMORY = """
import gc, sys, tracemalloc
import numpy as np
import fitbatch
from fitbatch._kernels import jit
# numba's import and its loops' load (from numba's cache) are once per process, not per
# sample: done before tracing, so that every plan runs the compiled loops it would run later
if jit.enabled():
    jit._warm(jit._module)
sizes = np.load({path!r})
cell = {cell!r}
options = dict(cost="sum", strategy="packed") if cell == "packed, sum cost" else dict(strategy=cell)
gc.collect()
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
plan = fitbatch.plan_batches(sizes, {budget}, **options)
print((tracemalloc.get_traced_memory()[1] - base) / sizes.size, len(plan))
"""


def peaks(n: int, budget: int, sets: list[str]) -> None:
    """Peak bytes per sample of ``plan_batches`` (an int64 input: its float64 conversion counts)."""
    cells = [*STRATEGIES, "packed, sum cost"]
    print(f"\nPeak memory of plan_batches, {n:,} samples, budget {budget}, bytes per sample (tracemalloc, "
          "a fresh process per cell, numba's loops loaded first (not the ahead-of-time cache's), int64 input)\n")
    print("| set | " + " | ".join(cells) + " |")
    print("|---|" + "---:|" * len(cells))
    with tempfile.TemporaryDirectory() as tmp:
        for name in sets:
            path = str(Path(tmp) / f"{name}.npy")
            np.save(path, sizes_of(name, n, budget))
            row = []
            for c in cells:
                code = MEMORY.format(path=path, cell=c, budget=budget)
                # numba's loops, not the ahead-of-time cache's: tracemalloc does not see the
                # arrays that the cache's loops allocate, and the numba ones' it does
                env = {**os.environ, "FITBATCH_AOT": "0"}
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
                row.append(f"{float(out.stdout.split()[0]):.1f}")
            print(f"| {name.removeprefix('cpython_stdlib_')} | " + " | ".join(row) + " |")


def current_bytecode() -> None:
    """Compile fitbatch's modules whose bytecode is missing or older than their source, as
    ``pip install`` does: a fresh process's import then measures loading the library, not
    compiling it. Without this, a source tree edited since its last run under
    ``PYTHONDONTWRITEBYTECODE=1`` recompiles the edited modules in every timed process (it doubled
    "import library": 0.08-0.10 s against 0.04 s with current bytecode, imp1)."""
    import compileall

    compileall.compile_dir(str(Path(fitbatch.__file__).parent), quiet=1)


def first_calls(built: str | None, n: int, budget: int, repeat: int, sets: list[str]) -> None:
    """Import + first plan + batches in a fresh process per cell (best of ``repeat``, cells in turn)."""
    current_bytecode()
    cells = ["fairseq, numpy default sort", "fairseq, its stable sort"] if built else []
    cells += [*STRATEGIES, "packed, sum cost"]
    print(f"\nFirst call of a process, {n:,} samples, budget {budget}: import numpy + the library, load the "
          f"sizes, plan, batches as index arrays (best of {repeat}, cells in turn; CPU counts every thread)\n")
    print("| set | plan | wall s | CPU s | numba imported by then | compiled loops loaded |")
    print("|---|---|---:|---:|---|---|")
    for name, runs in _fresh_runs(FIRST, cells, built, n, budget, repeat, sets):
        best = {c: (float("inf"), float("inf"), False, "-") for c in cells}
        for c, words in runs:
            wall, cpu, numba, loops = words
            if float(wall) < best[c][0]:
                best[c] = (float(wall), float(cpu), numba == "True", loops)
        for c, (wall, cpu, numba, loops) in best.items():
            print(f"| {name.removeprefix('cpython_stdlib_')} | {c} | {wall:.3f} | {cpu:.3f} | {'yes' if numba else 'no'} | {loops} |")


def first_stages(built: str | None, n: int, budget: int, repeat: int, sets: list[str]) -> None:
    """:func:`first_calls` split into stages: CPU seconds of each (best of ``repeat`` per stage)."""
    current_bytecode()
    cells = ["fairseq, numpy default sort"] if built else []
    cells += [*STRATEGIES, "packed, sum cost"]
    print(f"\nFirst call of a process by stage, {n:,} samples, budget {budget}: CPU s, best of {repeat} per stage "
          "(sort: fairseq's shuffle and argsort; plan: plan_batches; batches: fairseq's batch_by_size_vec / list(plan))\n")
    print("| set | cell | import numpy | load sizes | import library | sort / plan | batches | batch count |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, runs in _fresh_runs(STAGES, cells, built, n, budget, repeat, sets):
        best = {c: [float("inf")] * 5 + [0.0] for c in cells}
        for c, words in runs:
            got = [float(v) for v in words]
            best[c] = [min(a, b) for a, b in zip(best[c][:5], got[:5])] + [got[5]]
        for c, row in best.items():
            print(f"| {name.removeprefix('cpython_stdlib_')} | {c} | " + " | ".join(f"{v:.3f}" for v in row[:5])
                  + f" | {int(row[5]):,} |")


def _fresh_runs(template: str, cells: list[str], built: str | None, n: int, budget: int, repeat: int,
                sets: list[str]) -> Iterator[tuple[str, Iterator[tuple[str, list[str]]]]]:
    """Per set, its sizes saved once and ``template`` run in a fresh process per cell, cells in
    turn, ``repeat`` rounds: ``(set, runs)``, ``runs`` yielding each ``(cell, stdout words)``."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in sets:
            path = str(Path(tmp) / f"{name}.npy")
            np.save(path, sizes_of(name, n, budget))
            yield name, _runs(template, path, cells, built, budget, repeat)


def _runs(template: str, path: str, cells: list[str], built: str | None, budget: int,
          repeat: int) -> Iterator[tuple[str, list[str]]]:
    for _ in range(max(repeat, 1)):
        for c in cells:
            code = template.format(path=path, cell=c, built=built or "", budget=budget)
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            yield c, out.stdout.split()


def per_epoch(sizes: np.ndarray, budget: int, epochs: int, **options: Any) -> tuple[float, list[Any]]:
    """Seconds per epoch over epochs 1..``epochs`` of one ``Sizes`` planned once at epoch 0 first
    (best of 3 runs), and the last epoch's batches."""
    best, batches = float("inf"), []
    for _ in range(3):
        held = fitbatch.as_sizes(sizes)
        list(fitbatch.plan_batches(held, budget, **options))
        start = time.perf_counter()
        for epoch in range(1, epochs + 1):
            batches = list(fitbatch.plan_batches(held, budget, epoch=epoch, **options))
        best = min(best, (time.perf_counter() - start) / epochs)
    return best, batches


def table(fs: Any, n: int, budget: int, repeat: int, epochs: int = 0, sets: Any = SETS) -> None:
    """One markdown table: fairseq and every fitbatch strategy on ``n`` samples of each set."""
    jit = os.environ.get("FITBATCH_JIT", "")
    from fitbatch._kernels import aot

    default = "numba loaded first (--settle)" if SETTLED[0] else "numba loads in the background from 256k samples planned (default)"
    if aot.enabled() and aot.available() and not SETTLED[0]:
        default = "the ahead-of-time cache, loaded at the first plan"
    compiled = {"0": "numpy only (FITBATCH_JIT=0)", "1": "numba loaded (FITBATCH_JIT=1)"}.get(jit, default)
    how = f"fitbatch: mean per epoch over epochs 1-{epochs} of one Sizes" if epochs else f"best of {repeat} rounds, {CLOCK[0]} clock"
    print(f"\n{n:,} samples per set (resampled, seed 0), budget {budget} padded tokens, "
          f"plan + batches as index arrays, {how} (fairseq: best of {repeat}); fitbatch kernels: {compiled}\n")
    print("| set | plan | time ms | vs fairseq (default sort) | vs fairseq (stable sort) | batches |")
    print("|---|---|---:|---:|---:|---:|")
    for name in sets:
        sizes = sizes_of(name, n, budget)
        label = name.removeprefix("cpython_stdlib_")
        cells: dict[str, Any] = {}
        if fs is not None:
            cells["fairseq batch_by_size_vec, numpy default sort"] = lambda x=sizes: run_fairseq(fs, x, budget, None)
            cells["fairseq batch_by_size_vec, its stable sort"] = lambda x=sizes: run_fairseq(fs, x, budget, "stable")
        for strategy in (*STRATEGIES, "packed, sum cost"):
            options = {"cost": "sum", "strategy": "packed"} if strategy == "packed, sum cost" else {"strategy": strategy}
            if epochs:
                cells[f"fitbatch {strategy}"] = (sizes, options)
            else:
                cells[f"fitbatch {strategy}"] = lambda x=sizes, o=options: list(fitbatch.plan_batches(x, budget, **o))
        times, counts = alternating(cells, repeat, budget, epochs)
        fair, shipped = times.get("fairseq batch_by_size_vec, numpy default sort"), times.get("fairseq batch_by_size_vec, its stable sort")
        for cell, seconds in times.items():
            r1 = f"{fair / seconds:.2f}x" if fair else "–"
            r2 = f"{shipped / seconds:.2f}x" if shipped else "–"
            print(f"| {label} | {cell} | {seconds * 1e3:.2f} | {r1} | {r2} | {counts[cell]:,} |")


def alternating(cells: dict[str, Any], repeat: int, budget: int, epochs: int) -> tuple[dict[str, float], dict[str, int]]:
    """The best time of every cell over ``repeat`` rounds, the cells run in turn in each round
    (load from elsewhere on the machine falls on all of them alike), and each cell's batches."""
    times = {cell: float("inf") for cell in cells}
    counts = {cell: 0 for cell in cells}
    for _ in range(max(repeat, 1)):
        gc.collect()  # between rounds, not before each cell (see below)
        for cell, fn in cells.items():
            if isinstance(fn, tuple):
                seconds, batches = per_epoch(fn[0], budget, epochs, **fn[1])
            elif CLOCK[0] == "cpu":
                # the calling thread's CPU time: what load from elsewhere changes least, and not
                # numba's one-off background load (--first-call measures that). The collector is
                # paused while a cell runs, as timeit does; a full collection just before each
                # cell (this bench until speed4) walks every object of the process and leaves the
                # caches cold: 20k cells then took 1.3-1.6x their time (fairseq's too)
                gc.disable()
                try:
                    t0 = time.thread_time()
                    batches = fn()
                    seconds = time.thread_time() - t0
                finally:
                    gc.enable()
            else:
                seconds, batches = best_time(fn, 1)
            times[cell] = min(times[cell], seconds)
            counts[cell] = len(batches)  # type: ignore[arg-type]
            del batches
    return times, counts


if __name__ == "__main__":
    main()
