"""Plan speed against fairseq's Cython ``batch_by_size_vec``, measured in the same run.

fairseq is not a dependency and none of its code is in this repository: point the script at a
build of its ``fairseq/data/data_utils_fast.pyx`` (Cython + a C++ compiler), or let it build one
from a fairseq checkout:

    pip install cython
    python bench/vs_fairseq.py --fairseq-pyx /path/to/fairseq/fairseq/data/data_utils_fast.pyx
    python bench/vs_fairseq.py --n 10000000 --repeat 3    # with fairseq installed
    FITBATCH_JIT=0 python bench/vs_fairseq.py --n 2000 5000 10000 15000 --repeat 30  # small sets, numpy
    FITBATCH_JIT=0 python bench/vs_fairseq.py --n 2000 5000 10000 15000 --repeat 30 --epochs 20

Both sides plan the same sizes (a real length set resampled to ``--n``, samples over the budget
left out) under the padded cost (fairseq's ``max_tokens``: batch count x longest) and
*materialise* the batches as index arrays, as a loader would consume them:

* fairseq: the shuffled indices stably sorted by size (its ``ordered_indices``), then
  ``batch_by_size_vec(indices, sizes[indices], max_tokens, -1, 1)`` (a list of arrays);
* fitbatch: ``plan_batches(sizes, budget, strategy=...)`` then ``list(plan)``; also ``packed``
  with the sum cost (a token budget without padding, which fairseq has no mode for: time only).

Times are the best of ``--repeat`` runs; "vs fairseq" is fairseq's time / fitbatch's (above 1:
fitbatch is faster). With ``--epochs K`` the fitbatch cells are instead what a sampler pays per
epoch: epochs 1..K of one ``Sizes`` (planned once at epoch 0 first), the mean per epoch, the best
of 3 such runs (a ``Sizes`` keeps what does not depend on the epoch: size keys, level fits,
sorted batch counts, lattice ranks).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_time, load, resample  # noqa: E402

import fitbatch  # noqa: E402

SETS = ("cpython_stdlib_functions", "cpython_stdlib_pytokens")
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


def fairseq_module(pyx: str | None, tmp: Path) -> Any:
    if pyx:
        build(Path(pyx), tmp)
        sys.path.insert(0, str(tmp))
        return importlib.import_module("data_utils_fast")
    try:
        return importlib.import_module("fairseq.data.data_utils_fast")
    except ImportError:
        return None


def run_fairseq(fs: Any, sizes: np.ndarray, budget: int) -> list[Any]:
    """fairseq's way: shuffled indices stably sorted by size, then its Cython batching."""
    idx = np.random.default_rng(0).permutation(sizes.size)
    idx = idx[np.argsort(sizes[idx], kind="stable")]
    return fs.batch_by_size_vec(idx, sizes[idx], budget, -1, 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[10_000_000], help="one table per size")
    p.add_argument("--budget", type=int, default=16384)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--fairseq-pyx", help="fairseq's fairseq/data/data_utils_fast.pyx, compiled for this run")
    p.add_argument("--epochs", type=int, default=0, help="fitbatch: mean per epoch over epochs 1..K of one Sizes")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        fs = fairseq_module(args.fairseq_pyx, Path(tmp))
        print(f"fitbatch {fitbatch.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
              f"{platform.machine()}; fairseq batch_by_size_vec: {'compiled here' if fs else 'not available'}")
        for n in args.n:
            table(fs, n, args.budget, args.repeat, args.epochs)


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


def table(fs: Any, n: int, budget: int, repeat: int, epochs: int = 0) -> None:
    """One markdown table: fairseq and every fitbatch strategy on ``n`` samples of each set."""
    jit = os.environ.get("FITBATCH_JIT", "")
    compiled = {"0": "numpy only (FITBATCH_JIT=0)", "1": "numba loaded (FITBATCH_JIT=1)"}.get(jit, "numba from 1M samples planned (default)")
    how = f"fitbatch: mean per epoch over epochs 1-{epochs} of one Sizes" if epochs else f"best of {repeat}"
    print(f"\n{n:,} samples per set (resampled, seed 0), budget {budget} padded tokens, "
          f"plan + batches as index arrays, {how} (fairseq: best of {repeat}); fitbatch kernels: {compiled}\n")
    print("| set | plan | time ms | vs fairseq | batches |")
    print("|---|---|---:|---:|---:|")
    for name in SETS:
        base = load(name)
        sizes = resample(base[base <= budget], n).astype(np.int64)
        fs_time = None
        if fs is not None:
            fs_time, batches = best_time(lambda x=sizes: run_fairseq(fs, x, budget), repeat)
            print(f"| {name.removeprefix('cpython_stdlib_')} | fairseq batch_by_size_vec (sorted) | {fs_time * 1e3:.2f} | 1.00x | {len(batches):,} |")
            del batches
        for strategy in STRATEGIES:
            if epochs:
                seconds, batches = per_epoch(sizes, budget, epochs, strategy=strategy)
            else:
                seconds, batches = best_time(lambda s=strategy, x=sizes: list(fitbatch.plan_batches(x, budget, strategy=s)), repeat)
            ratio = f"{fs_time / seconds:.2f}x" if fs_time else "–"
            print(f"| {name.removeprefix('cpython_stdlib_')} | fitbatch {strategy} | {seconds * 1e3:.2f} | {ratio} | {len(batches):,} |")
            del batches
        # the sum cost (packing; fairseq has no such budget: compared for time only)
        if epochs:
            seconds, batches = per_epoch(sizes, budget, epochs, cost="sum", strategy="packed")
        else:
            seconds, batches = best_time(lambda x=sizes: list(fitbatch.plan_batches(x, budget, cost="sum", strategy="packed")), repeat)
        ratio = f"{fs_time / seconds:.2f}x" if fs_time else "–"
        print(f"| {name.removeprefix('cpython_stdlib_')} | fitbatch packed, sum cost | {seconds * 1e3:.2f} | {ratio} | {len(batches):,} |")
        del batches


if __name__ == "__main__":
    main()
