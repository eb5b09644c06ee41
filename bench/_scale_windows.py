"""Scale benchmark, part 3: windowed planning (``fitbatch.BudgetBatchSampler``, ``window="auto"``) at 1e8-1e9 samples.

Run through ``python bench/scale.py --windows 1e8,1e9`` (see its docstring). Each measurement
runs in a fresh process over a memory-mapped int32 :class:`fitbatch.SizeIndex` of sizes
resampled from the real CPython function lengths, as one simulated rank of ``--ranks`` (1,024):

* ``run``: the rank's sampler from scratch: time to its first batch, then its batches through
  to the middle of the epoch (every window on the way planned as the real rank would), where it
  saves a state and records the next batches; the peak anonymous memory (``RssAnon`` sampled
  every 10 ms: the memory map's pages are file-backed and the kernel can drop them) and the mean
  time per window.
* ``resume``: a fresh process loads that state: time to its first batch, and whether its next
  batches equal those of the uninterrupted run.
* ``census``: ``len()`` needs each window's own batch count; with ``census="collective"`` rank r
  counts windows r, r + 1024, ... and one ``all_reduce`` sums them. The process counts exactly
  this rank's share (the all_reduce of a few KB is not simulated).
* ``quality``: at sizes where the global plan fits, the windowed epoch (all ranks) against
  ``BudgetBatchSampler(window=None)``'s: steps, batches and padding efficiency.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 16384


def make_index(path: Path, n: int) -> float:
    """An int32 index of ``n`` sizes resampled from the real function lengths; seconds taken."""
    sys.path.insert(0, str(ROOT / "bench"))
    from _common import load, resample

    import fitbatch

    if (path / "manifest.json").exists():
        return 0.0
    base = load("cpython_stdlib_functions")
    step = 20_000_000
    chunks = (resample(base, min(step, n - a), seed=7 + a // step).astype(np.int32) for a in range(0, n, step))
    t0 = time.perf_counter()
    fitbatch.SizeIndex.create(path, chunks, source=f"resampled cpython_stdlib_functions x{n}")
    return time.perf_counter() - t0


class AnonPeak:
    """The peak ``RssAnon`` of this process, sampled every 10 ms by a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.01)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.now())


def _sampler(path: str, ranks: int, rank: int):  # type: ignore[no-untyped-def]
    import fitbatch

    index = fitbatch.SizeIndex.open(path)
    return fitbatch.BudgetBatchSampler(index, BUDGET, num_replicas=ranks, rank=rank, census="local")


def run(path: str, ranks: int, rank: int, out: str) -> dict:
    peak = AnonPeak()
    import torch  # noqa: F401  (a training process has it; the sampler subclasses torch's BatchSampler)

    import fitbatch  # noqa: F401  (imports timed apart)

    base = AnonPeak.now()
    t0 = time.perf_counter()
    sampler = _sampler(path, ranks, rank)
    it = iter(sampler)
    first = next(it)
    t_first = time.perf_counter() - t0
    n_windows = sampler.windows().n_windows
    mid_window = n_windows // 2
    t1 = time.perf_counter()
    rows = 1
    live = sampler._live
    while live is not None and live.plan.index < mid_window:
        next(it)
        rows += 1
        live = sampler._live
    # a few steps into the middle window
    for _ in range(3):
        next(it)
        rows += 1
    walked = time.perf_counter() - t1
    state = sampler.state_dict()
    following = [next(it) for _ in range(20)]
    Path(out).write_text(json.dumps({"state": state, "following": following}))
    return {
        "first_batch_s": t_first, "first_batch_len": len(first), "n_windows": n_windows, "window": sampler.window,
        "state_window": state["window"], "state_step": state["step"],
        "s_per_window": walked / max(mid_window, 1), "anon_peak_mib": peak.stop() / 2**20,
        "anon_at_import_mib": base / 2**20,
    }


def resume(path: str, ranks: int, rank: int, saved: str) -> dict:
    peak = AnonPeak()
    import torch  # noqa: F401

    import fitbatch  # noqa: F401

    record = json.loads(Path(saved).read_text())
    t0 = time.perf_counter()
    sampler = _sampler(path, ranks, rank)
    sampler.load_state_dict(record["state"])
    it = iter(sampler)
    got = [next(it)]
    t_resume = time.perf_counter() - t0
    got += [next(it) for _ in range(len(record["following"]) - 1)]
    return {"resume_s": t_resume, "equal": got == record["following"], "anon_peak_mib": peak.stop() / 2**20, "len": len(record["following"])}


def census(path: str, ranks: int, rank: int) -> dict:
    from fitbatch.epoch import _windows as W

    sampler = _sampler(path, ranks, rank)
    windows = sampler.windows()
    mine = list(range(windows.n_windows))[rank::ranks]
    t0 = time.perf_counter()
    counts = [len(W.own_plan(sampler._column, windows, w, sampler.options, 0)[2]) for w in mine]
    return {"census_share_s": time.perf_counter() - t0, "windows_counted": len(mine), "batches": sum(counts)}


def quality(path: str, ranks: int) -> dict:
    import fitbatch

    index = fitbatch.SizeIndex.open(path)
    t0 = time.perf_counter()
    glob = fitbatch.BudgetBatchSampler(index, BUDGET, num_replicas=ranks, rank=0, window=None).steps()
    t_global = time.perf_counter() - t0
    g_real, g_pad = glob.plan.real_units.sum(), glob.plan.padded_units.sum()
    g = {"steps": glob.n_steps, "batches": len(glob.plan), "pad_eff": g_real / g_pad, "seconds": t_global}
    del glob
    sampler = fitbatch.BudgetBatchSampler(index, BUDGET, num_replicas=ranks, rank=0)
    t0 = time.perf_counter()
    live, steps, batches, real, pad = sampler._current(), 0, 0, 0.0, 0.0
    while True:
        plan = live.timeline.steps.plan
        steps += live.timeline.total
        batches += len(plan)
        real += plan.real_units.sum()
        pad += plan.padded_units.sum()
        if live.last:
            break
        live = sampler._next(live)
    w = {"steps": steps, "batches": batches, "pad_eff": real / pad, "seconds": time.perf_counter() - t0}
    return {"global": g, "windowed": w}


def _call(mode: str, *args: object) -> dict:
    res = subprocess.run(
        [sys.executable, __file__, mode, *map(str, args)], capture_output=True, text=True, check=False,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    if res.returncode:
        raise RuntimeError(f"{mode} failed:\n{res.stderr[-3000:]}")
    out: dict = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def tables(work: Path, sizes: list[int], ranks: int, rank: int, quality_upto: int) -> str:
    lines = [
        f"### Windowed planning: one simulated rank ({rank}) of {ranks:,}, budget {BUDGET} padded, pooled, the default window\n",
        "| samples | index create s | window | windows | first batch s | s per window | resume s | resumed = uninterrupted | census share s | peak anon MiB (run / resume; after imports) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    quality_rows = []
    for n in sizes:
        path = work / f"index-{n}"
        created = make_index(path, n)
        saved = work / f"state-{n}.json"
        r = _call("run", path, ranks, rank, saved)
        s = _call("resume", path, ranks, rank, saved)
        c = _call("census", path, ranks, rank)
        lines.append(
            f"| {n:,} | {created:.0f} | {r['window']:,} | {r['n_windows']} | {r['first_batch_s']:.2f} | {r['s_per_window']:.2f} | "
            f"{s['resume_s']:.2f} | {s['equal']} ({s['len']} batches from window {r['state_window']}, step {r['state_step']:,}) | "
            f"{c['census_share_s']:.2f} ({c['windows_counted']} windows) | {r['anon_peak_mib']:.0f} / {s['anon_peak_mib']:.0f}; {r['anon_at_import_mib']:.0f} |"
        )
        if n <= quality_upto:
            for world in (8, ranks):
                q = _call("quality", path, world)
                g, w = q["global"], q["windowed"]
                quality_rows.append(
                    f"| {n:,} | {world:,} | {g['steps']:,} | {w['steps']:,} | {w['batches'] / g['batches']:.4f} | "
                    f"{g['pad_eff']:.4f} | {w['pad_eff']:.4f} | {g['seconds']:.1f} | {w['seconds']:.1f} |"
                )
    lines += [
        "",
        "### Windowed vs global plan (all ranks; the global plan where it fits in memory)\n",
        "| samples | ranks | global steps | windowed steps | batches windowed/global | global pad eff | windowed pad eff | global s | windowed s (all windows) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *quality_rows,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "run":
        result = run(rest[0], int(rest[1]), int(rest[2]), rest[3])
    elif mode == "resume":
        result = resume(rest[0], int(rest[1]), int(rest[2]), rest[3])
    elif mode == "census":
        result = census(rest[0], int(rest[1]), int(rest[2]))
    elif mode == "quality":
        result = quality(rest[0], int(rest[1]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result))
