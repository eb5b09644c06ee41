"""One RL step split over data-parallel ranks: fitbatch.steps.partition beside verl's split.

verl is not a dependency and none of its code is in this repository: the script downloads the
verl wheel without its dependencies into a temporary directory (``pip download verl==0.9.1
--no-deps``, or ``--verl-wheel PATH``) and loads only ``verl/utils/seqlen_balancing.py`` from it,
with the three verl modules it imports at the top stubbed (it needs none of them for the
functions called here).

    python bench/partition.py                       # the full grid (about 10 minutes on 2 cores)
    python bench/partition.py --n 1024 --world 8    # one cell

Each step's lengths are drawn (seeded) from a real length set, scaled so that its 99th
percentile is 8,192 tokens and clipped there (a rollout truncated at ``max_response_length``).
Both sides balance verl's workload ``24576 * L + L**2`` under ``max_token_len`` (``--cap``) with
the micro-batch count a multiple of ``micro_multiple`` (verl's ``num_batches_divided_by``):

* verl 0.9.1, as its trainer does it: ``get_seqlen_balanced_partitions(workloads, W,
  equal_size=True)`` (Karmarkar-Karp, the same count on each rank), then on every rank the
  steps of ``rearrange_micro_batches`` with a data-parallel group: ``ceil(tokens / cap)``
  micro-batches, the MAX over ranks, rounded up to the multiple, then Karmarkar-Karp on the
  rank's workloads, retried with ``micro_multiple`` more micro-batches on every rank until every
  rank's micro-batches hold at most ``cap`` tokens, and the micro-batches ordered as verl orders
  them. The collectives are emulated in one process; the time is the balance's plus the slowest
  rank's (its ranks run in parallel), without the collectives' own latency.
* fitbatch: ``partition(lengths, cap, world=W, weights=workload, micro_multiple=mm)`` (the whole
  step, as every rank would compute it).

Columns: micro-steps; cap violations (micro-batches over ``cap``); lost or repeated sequences;
step efficiency = (sum of workloads / W) / sum over micro-steps of the slowest rank's workload;
bound = ``Partition.efficiency_bound``, the most any split under the cap can reach (the heaviest
sequences each need a micro-step slower than their own workload, ``world`` of them at a time);
plan time (best of ``--repeat``, ms, no garbage collection between the calls on either side;
verl's 64k cells once).

With numba installed (the ``fast`` extra) fitbatch's packing and refinement run compiled: the
script sets ``FITBATCH_JIT=1`` unless it is set (``FITBATCH_JIT=0``: numpy), so the kernels load
at the first call (not timed: best of ``--repeat``); the partitions are the same either way.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
import types
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load  # noqa: E402

os.environ.setdefault("FITBATCH_JIT", "1")  # the compiled kernels at the first call (see the docstring)
from fitbatch.steps import partition  # noqa: E402

SETS = ("cpython_stdlib_functions", "cpython_stdlib_pytokens")
MAX_LEN = 8192


def workload(lengths: np.ndarray) -> np.ndarray:
    return 24576 * lengths + lengths**2


def verl_module(wheel: str | None, tmp: Path) -> Any:
    """verl's seqlen_balancing module, loaded alone from the wheel."""
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "verl==0.9.1", "--no-deps", "-q", "-d", str(tmp)],
                       check=True, capture_output=True)
        wheel = str(next(tmp.glob("verl-*.whl")))
    with zipfile.ZipFile(wheel) as z:
        source = z.read("verl/utils/seqlen_balancing.py").decode()
    for name in ("verl", "verl.protocol", "verl.utils", "verl.utils.tensordict_utils", "verl.utils.device"):
        stub = types.ModuleType(name)
        stub.DataProto = object  # type: ignore[attr-defined]
        stub.get_device_name = lambda: "cpu"  # type: ignore[attr-defined]
        sys.modules.setdefault(name, stub)
    sys.modules["verl.utils"].tensordict_utils = sys.modules["verl.utils.tensordict_utils"]  # type: ignore[attr-defined]
    spec = importlib.util.spec_from_loader("verl_seqlen_balancing", loader=None)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    exec(compile(source, "verl/utils/seqlen_balancing.py", "exec"), module.__dict__)
    return module


def run_verl(sb: Any, lengths: np.ndarray, cap: int, world: int, multiple: int) -> tuple[list[list[list[int]]], float]:
    """verl's trainer balance, then each rank's rearrange with the collectives emulated; its
    micro-batches per rank (global indices) and the time (balance + the slowest rank)."""
    t0 = time.perf_counter()
    ranks = sb.get_seqlen_balanced_partitions(workload(lengths).tolist(), world, equal_size=True)
    balance = time.perf_counter() - t0
    local = [lengths[r] for r in ranks]
    spent = [0.0] * world
    counts = []
    for r, ln in enumerate(local):
        t0 = time.perf_counter()
        counts.append(min(ln.size, -(-int(ln.sum()) // cap)))
        spent[r] += time.perf_counter() - t0
    count = -(-max(counts) // multiple) * multiple  # all_reduce MAX, then roundup_divisible
    while True:
        parts = []
        for r, ln in enumerate(local):
            t0 = time.perf_counter()
            work = workload(ln.astype(np.int64)).tolist()
            tokens = ln.tolist()
            p = sb.get_seqlen_balanced_partitions(work, count, equal_size=False)
            ok = all(sum(tokens[i] for i in part) <= cap for part in p)
            spent[r] += time.perf_counter() - t0
            parts.append((p, ok, work))
        if all(ok for _, ok, _ in parts):  # all_reduce MIN of within_limit
            break
        count += multiple
    out = []
    for r, (p, _, work) in enumerate(parts):
        t0 = time.perf_counter()
        p.sort(key=lambda part: (sum(work[i] for i in part), part[0] if part else 0), reverse=True)
        p = p[::2][::-1] + p[1::2]
        spent[r] += time.perf_counter() - t0
        out.append([[ranks[r][i] for i in part] for part in p])
    return out, balance + max(spent)


def measure(batches: list[list[Any]], lengths: np.ndarray, cap: int) -> tuple[int, int, int, float]:
    """(micro-steps, micro-batches over cap, sequences lost or repeated, step efficiency)."""
    world, m = len(batches), len(batches[0])
    w = workload(lengths.astype(np.float64))
    load = np.array([[w[np.asarray(b, dtype=np.int64)].sum() for b in rank] for rank in batches])
    over = sum(int(lengths[np.asarray(b, dtype=np.int64)].sum() > cap) for rank in batches for b in rank)
    seen = np.bincount(np.concatenate([np.asarray(b, dtype=np.int64) for rank in batches for b in rank]),
                       minlength=lengths.size)
    wrong = int((seen != 1).sum())
    return m, over, wrong, float(w.sum() / world / load.max(axis=0).sum())


def step_lengths(base: np.ndarray, n: int, seed: int) -> np.ndarray:
    scale = MAX_LEN / np.percentile(base, 99)
    drawn = base[np.random.default_rng(seed).integers(0, base.size, n)]
    return np.clip(np.ceil(drawn * scale), 1, MAX_LEN).astype(np.int64)


def _best(fn: Any, repeat: int) -> tuple[float, Any]:
    """The fastest of ``repeat`` calls and the last result, timed as verl's side is: one garbage
    collection before the calls, none between them (one just before a call costs a 512-sequence
    step ~0.6 ms more: the freed memory is faulted in again)."""
    gc.collect()
    best, out = float("inf"), None
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _compiled() -> bool:
    """Whether partition runs its compiled kernels here (loads them)."""
    try:
        from fitbatch.steps import _compiled as kernels
    except ImportError:  # a fitbatch before the compiled kernels
        return False
    partition([1, 2, 3], 4, world=2)
    return kernels.settle() is not None and os.environ.get("FITBATCH_JIT") != "0"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", nargs="+", default=list(SETS))
    p.add_argument("--n", nargs="+", type=int, default=[512, 1024, 4096, 65536])
    p.add_argument("--world", nargs="+", type=int, default=[8, 16, 64])
    p.add_argument("--multiple", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--cap", type=int, default=2 * MAX_LEN)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--verl-wheel")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        sb = verl_module(args.verl_wheel, Path(tmp))
    compiled = "numba " + importlib.import_module("numba").__version__ if _compiled() else "numpy (no numba)"
    print(f"# python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, cap {args.cap}, "
          f"fitbatch kernels: {compiled}")
    print("| set | N | W | mm | micro-steps fitbatch / verl | over cap f / v | lost f / v "
          "| efficiency f / v | bound | time ms f / v | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.sets:
        base = load(name)
        for n in args.n:
            lengths = step_lengths(base, n, seed=n)
            for world in args.world:
                for mm in args.multiple:
                    t_f, part = _best(lambda lengths=lengths, world=world, mm=mm: partition(
                        lengths, args.cap, world=world, weights=workload, micro_multiple=mm), args.repeat)
                    f = measure([part[r] for r in range(world)], lengths, args.cap)
                    repeat = 1 if n > 10_000 else max(1, args.repeat // 2)
                    v_batches, t_v = min((run_verl(sb, lengths, args.cap, world, mm) for _ in range(repeat)),
                                         key=lambda x: x[1])
                    v = measure(v_batches, lengths, args.cap)
                    short = name.replace("cpython_stdlib_", "")
                    print(f"| {short} | {n} | {world} | {mm} | {f[0]} / {v[0]} | {f[1]} / {v[1]} | {f[2]} / {v[2]} "
                          f"| {f[3]:.4f} / {v[3]:.4f} | {part.efficiency_bound:.4f} | {t_f * 1e3:.3f} / {t_v * 1e3:.2f} | {t_v / t_f:.1f}x |",
                          flush=True)


if __name__ == "__main__":
    main()
