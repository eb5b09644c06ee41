"""Workload model on a device: measured forward+backward time against ``a*L + b*L**2`` per sample.

A step partitioner balances micro-batches across ranks by a per-sample workload, by default
``24576*L + L**2`` (linear layers, plus attention's pairs). This script checks that model against
kernel time (issue #42; ``bash bench/gpu_suite.sh workload``, one call of about two minutes):

1. **Compositions.** Micro-batches of many (count, lengths) compositions under a token cap
   (``--caps``): ``count`` samples of one length on a geometric grid, mixtures drawn from the
   real long-tailed set ``cpython_stdlib_pytokens`` (truncated at ``--max-len``), and one long
   sample among many short ones. Each is timed (forward + backward of the examples' LM,
   ``examples/_lm_model.py``; median of ``--repeats`` after a warm-up) in two layouts:
   *packed* (one row, block-diagonal causal attention: ``njt``, FlashAttention varlen through
   nested tensors on CUDA, length-grouped SDPA on CPU) and *padded* (rows padded to the
   longest, causal SDPA).
2. **Fit.** Least squares on relative error, non-negative, of the measured seconds against
   ``a*sum(L) + b*sum(L**2)`` (packed) or ``count*(a*Lmax + b*Lmax**2)`` (padded), with and
   without a per-micro-batch constant ``c``. Reported per layout: the fitted ``a/b`` beside the
   default's 24576, and how well each model predicts the measured time (R^2, mean absolute %
   error): fitted (in sample, and 2-fold: each half predicted by the other half's fit), fitted
   with ``c``, the default workload (one scale fitted: workload units are not seconds), and
   tokens only (``sum(L)``).
3. **Step efficiency.** ``--steps`` global batches drawn from the real set are split over
   ``--ranks`` W ranks by each workload (default, fitted, tokens): a greedy balanced split
   (samples sorted by workload, longest-processing-time to the W ranks, then each rank's samples
   into micro-batches under the token cap). Every rank's micro-batches are timed on the one
   device, in the packed layout; efficiency = mean rank time / slowest rank time (1.0: no rank
   waits), beside the efficiency the workload itself predicted.

The partitioner: ``fitbatch.partition`` (:func:`partition_hook`), balancing by each workload;
the built-in split :func:`greedy_split` runs only where it is missing, and the JSON says which
one ran.

``--device cpu --tiny`` runs every stage in well under a minute on CPU (a dry run: CPU times
say nothing about a GPU's kernels).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _lm_model as lm  # noqa: E402
from _common import load  # noqa: E402

DATA = "cpython_stdlib_pytokens"
DEFAULT_A = 24576.0  # the default workload: 24576*L + L**2 per sample


# ----------------------------------------------------------------------------- compositions


def compositions(
    lengths: np.ndarray, caps: list[int], max_len: int, n_mixed: int, seed: int = 0
) -> list[np.ndarray]:
    """Sample lengths of micro-batches: uniform grids, real mixtures, one long among short ones."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    grid = [int(v) for v in 2 ** np.arange(5, int(np.log2(max_len)) + 1)]
    for cap in caps:
        for length in grid:
            if length > cap:
                continue
            for share in (0.25, 1.0):
                count = max(1, int(share * cap) // length)
                out.append(np.full(count, length))
        for _ in range(n_mixed):  # real mixtures, filled to 40-100 % of the cap
            target = rng.uniform(0.4, 1.0) * cap
            picked: list[int] = []
            for v in rng.choice(lengths, 4 * cap // 32 + 8).tolist():
                v = min(int(v), max_len, cap)
                if sum(picked) + v <= target:
                    picked.append(v)
            if picked:
                out.append(np.asarray(picked))
        long = min(max_len, cap // 2)
        out.append(np.asarray([long] + [32] * ((cap - long) // 32)))
    return out


def padded_fits(lengths: np.ndarray, cap: int) -> np.ndarray:
    """The longest prefix (sorted ascending) of a composition that fits ``cap`` padded tokens."""
    s = np.sort(lengths)
    keep = np.arange(1, s.size + 1) * s <= cap
    return s[: max(int(keep.sum()), 1)]


# ----------------------------------------------------------------------------- timing


class Timer:
    """Forward + backward of the examples' LM on synthetic tokens of given sample lengths."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.manual_seed(0)
        self.device = torch.device(args.device)
        cfg = lm.LMConfig.named(args.model_size, vocab=args.vocab, max_len=args.max_len + 1)
        self.model = lm.TinyLM(cfg).to(self.device)
        self.dtype = torch.bfloat16 if args.dtype == "bf16" else None
        self.attention = lm.resolve_attention(args.attention, self.device)
        self.repeats = args.repeats
        self.vocab = args.vocab
        self.gen = torch.Generator().manual_seed(0)

    def batch(self, lengths: np.ndarray, layout: str) -> lm.LMBatch:
        seqs = [torch.randint(1, self.vocab, (int(n),), generator=self.gen) for n in lengths]
        collate = lm.collate_packed if layout == "packed" else lm.collate_padded
        return collate(seqs).to(self.device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def once(self, batch: lm.LMBatch) -> float:
        self.sync()
        t0 = time.perf_counter()
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            loss, n = self.model(batch, self.attention)
        (loss / n.clamp(min=1)).backward()
        self.sync()
        dt = time.perf_counter() - t0
        self.model.zero_grad(set_to_none=True)
        return dt

    def seconds(self, lengths: np.ndarray, layout: str) -> float:
        """Median forward+backward seconds of one micro-batch, after one warm-up run."""
        batch = self.batch(lengths, layout)
        self.once(batch)
        return float(np.median([self.once(batch) for _ in range(max(self.repeats, 1))]))


# ----------------------------------------------------------------------------- the fit


def features(comps: list[np.ndarray], layout: str) -> np.ndarray:
    """Per micro-batch: (sum of L, sum of L**2) over its samples (padded: every row at Lmax)."""
    rows = []
    for ls in comps:
        ls = ls.astype(np.float64)
        if layout == "padded":
            rows.append((ls.size * ls.max(), ls.size * ls.max() ** 2))
        else:
            rows.append((ls.sum(), (ls**2).sum()))
    return np.asarray(rows)


def fit(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Non-negative least squares of ``t ~ x @ coef`` on relative error."""
    from scipy.optimize import nnls

    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls((x / scale) / t[:, None], np.ones_like(t))
    return coef / scale


def quality(pred: np.ndarray, t: np.ndarray) -> dict[str, float]:
    res = t - pred
    return {
        "r2": float(1 - (res**2).sum() / ((t - t.mean()) ** 2).sum()),
        "mape": float(np.mean(np.abs(res) / t)),
    }


def fit_layout(x: np.ndarray, t: np.ndarray) -> dict[str, Any]:
    """The fitted, fitted-with-constant, default and tokens-only models of one layout."""
    ab = fit(x, t)
    cab = fit(np.column_stack([np.ones(len(t)), x]), t)
    w_default = DEFAULT_A * x[:, 0] + x[:, 1]
    s_default = fit(w_default[:, None], t)[0]
    s_tokens = fit(x[:, :1], t)[0]
    # out of sample: each half's times predicted by the other half's fit (2-fold)
    held = np.full_like(t, np.nan)
    halves = (np.arange(len(t)) % 2 == 0, np.arange(len(t)) % 2 == 1)
    for train_, test_ in (halves, halves[::-1]):
        if train_.sum() >= 2:
            held[test_] = x[test_] @ fit(x[train_], t[train_])
    out: dict[str, Any] = {
        "a": float(ab[0]),
        "b": float(ab[1]),
        "a_over_b": float(ab[0] / ab[1]) if ab[1] > 0 else float("inf"),
        "c_a_b": [float(v) for v in cab],
        "c_a_over_b": float(cab[1] / cab[2]) if cab[2] > 0 else float("inf"),
        "default_scale": float(s_default),
        "fitted": quality(x @ ab, t),
        "fitted_held_out": quality(held, t),
        "fitted_with_c": quality(cab[0] + x @ cab[1:], t),
        "default": quality(s_default * w_default, t),
        "tokens": quality(s_tokens * x[:, 0], t),
    }
    return out


# ----------------------------------------------------------------------------- partition


def greedy_split(
    lengths: np.ndarray, ranks: int, cap: int, workload: Callable[[np.ndarray], np.ndarray]
) -> list[list[np.ndarray]]:
    """Built-in balanced split: LPT of samples (by workload) to ``ranks``, then micro-batches.

    Samples sorted by workload, heaviest first, each to the rank with the least workload so
    far; each rank's samples (still heaviest first) then fill micro-batches of at most ``cap``
    tokens, first fit. Returns, per rank, its micro-batches as arrays of sample lengths.
    """
    w = workload(lengths.astype(np.float64))
    order = np.argsort(-w, kind="stable")
    load_ = np.zeros(ranks)
    owner = np.empty(lengths.size, dtype=np.int64)
    for i in order:  # LPT: inherently sequential (each choice depends on the loads so far)
        r = int(np.argmin(load_))
        owner[i] = r
        load_[r] += w[i]
    out = []
    for r in range(ranks):
        bins: list[list[int]] = []
        room: list[int] = []
        for i in order[owner[order] == r]:
            n = int(lengths[i])
            j = next((k for k, left in enumerate(room) if left >= n), None)
            if j is None:
                bins.append([n])
                room.append(cap - n)
            else:
                bins[j].append(n)
                room[j] -= n
        out.append([np.asarray(b) for b in bins])
    return out


def partition_hook(
    lengths: np.ndarray, ranks: int, cap: int, workload: Callable[[np.ndarray], np.ndarray]
) -> list[list[np.ndarray]] | None:
    """The step partitioner ``fitbatch.partition``, balancing by ``workload``.

    Per rank, its micro-batches as arrays of sample lengths; ``None`` (the built-in
    :func:`greedy_split` then runs) only when this fitbatch has no ``partition``.
    """
    try:
        from fitbatch import partition
    except ImportError:
        return None
    p = partition(lengths, cap, world=ranks, weights=workload, cost="sum")
    return [[lengths[idx] for idx in p[r]] for r in range(ranks)]


def split(
    lengths: np.ndarray, ranks: int, cap: int, workload: Callable[[np.ndarray], np.ndarray]
) -> tuple[list[list[np.ndarray]], str]:
    parts = partition_hook(lengths, ranks, cap, workload)
    if parts is not None:
        return parts, "fitbatch.partition"
    return greedy_split(lengths, ranks, cap, workload), "builtin greedy (LPT + first fit)"


def simulate(
    timer: Timer, lengths: np.ndarray, args: argparse.Namespace, fitted: dict[str, Any]
) -> dict[str, Any]:
    """Step efficiency of each workload's split, with every rank's micro-batches timed."""
    rng = np.random.default_rng(3)
    cap = max(args.caps)
    a, b = fitted["a"], fitted["b"]
    workloads: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "default 24576*L + L**2": lambda L: DEFAULT_A * L + L**2,
        f"fitted {a:.3g}*L + {b:.3g}*L**2": lambda L: a * L + b * L**2,
        "tokens L": lambda L: L,
    }
    pool = np.minimum(lengths, min(args.max_len, cap))
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in workloads}
    used = ""
    for _ in range(args.steps):
        # one global step: about ``per_rank`` tokens per rank, drawn from the real set
        total = args.ranks * args.per_rank * cap
        drawn = rng.choice(pool, 4 * total // max(int(np.median(pool)), 1) + 16)
        step = drawn[: int(np.searchsorted(np.cumsum(drawn), total)) + 1]
        for name, wl in workloads.items():
            parts, used = split(step, args.ranks, cap, wl)
            times = np.array([sum(timer.seconds(mb, "packed") for mb in rank) for rank in parts])
            predicted = np.array(
                [sum(float(wl(mb.astype(np.float64)).sum()) for mb in rank) for rank in parts]
            )
            rows[name].append(
                {
                    "efficiency": float(times.mean() / times.max()),
                    "predicted_efficiency": float(predicted.mean() / predicted.max()),
                    "slowest_s": float(times.max()),
                    "micro_batches": int(sum(len(r) for r in parts)),
                    "samples": int(step.size),
                }
            )
    summary = {
        name: {
            "efficiency": float(np.mean([r["efficiency"] for r in rs])),
            "min_efficiency": float(np.min([r["efficiency"] for r in rs])),
            "predicted_efficiency": float(np.mean([r["predicted_efficiency"] for r in rs])),
            "slowest_s": float(np.mean([r["slowest_s"] for r in rs])),
            "steps": rs,
        }
        for name, rs in rows.items()
    }
    return {"partitioner": used, "ranks": args.ranks, "cap": cap, "workloads": summary}


# ----------------------------------------------------------------------------- driver


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--model-size", default="100M", choices=sorted(lm.MODEL_SIZES))
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument(
        "--max-len", type=int, default=8192, help="longest sample (the real set is truncated)"
    )
    p.add_argument(
        "--caps", type=int, nargs="+", default=[8192, 32768], help="tokens per micro-batch"
    )
    p.add_argument("--mixed", type=int, default=12, help="real mixtures per cap")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument(
        "--per-rank", type=int, default=2, help="micro-batches' worth of tokens per rank per step"
    )
    p.add_argument("--steps", type=int, default=3, help="global steps simulated")
    p.add_argument("--attention", default="auto", choices=lm.ATTENTIONS)
    p.add_argument(
        "--time-limit",
        type=float,
        default=400.0,
        help="seconds of composition timing (half per layout)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny sizes (CPU dry run)")
    p.add_argument("--out", default="workload.json")
    args = p.parse_args(argv)
    if args.tiny:
        args.model_size, args.vocab, args.max_len, args.caps = "tiny", 512, 256, [512]
        args.mixed, args.repeats, args.ranks, args.steps, args.per_rank = 3, 1, 2, 1, 1
        if args.device == "cpu":
            args.dtype = "fp32"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --tiny for a dry run", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, torch.get_num_threads()))
    timer = Timer(args)
    lengths = load(DATA).astype(np.int64)
    comps = compositions(lengths, args.caps, args.max_len, args.mixed)
    t0 = time.time()
    layouts: dict[str, Any] = {}
    for layout in ("packed", "padded"):
        done, times, t_layout = [], [], time.time()
        for k, ls in enumerate(comps):
            if time.time() - t_layout > args.time_limit / 2 and k >= 4:  # half the limit per layout
                break
            ls = ls if layout == "packed" else padded_fits(ls, max(args.caps))
            done.append(ls)
            times.append(timer.seconds(ls, layout))
        t = np.asarray(times)
        x = features(done, layout)
        layouts[layout] = {
            "micro_batches": len(done),
            "seconds": [float(v) for v in t],
            "compositions": [
                [int(v) for v in ls]
                if ls.size <= 64
                else {"count": int(ls.size), "sum": int(ls.sum()), "max": int(ls.max())}
                for ls in done
            ],
            **fit_layout(x, t),
        }
    # saved before the simulation: a run stopped by its timeout keeps the fits
    Path(args.out).write_text(json.dumps({"args": vars(args), "layouts": layouts}, indent=1))
    sim = simulate(timer, lengths, args, layouts["packed"])
    device = (
        torch.cuda.get_device_name(timer.device) if timer.device.type == "cuda" else "cpu (dry run)"
    )
    result = {
        "date": str(datetime.date.today()),
        "device": device,
        "torch": torch.__version__,
        "params": lm.n_params(timer.model),
        "attention_packed": timer.attention,
        "data": DATA,
        "args": vars(args),
        "layouts": layouts,
        "step_efficiency": sim,
        "seconds": time.time() - t0,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print_table(result)
    return 0


def print_table(r: dict[str, Any]) -> None:
    a = r["args"]
    print(
        f"{r['date']} · {r['device']} · torch {r['torch']} · model {a['model_size']} ({r['params'] / 1e6:.1f} M, "
        f"{a['dtype']}) · packed attention {r['attention_packed']} · caps {a['caps']} tokens · "
        f"{r['seconds']:.0f} s\n"
    )
    print("| layout | micro-batches | fitted a/b | with c: a/b | model | R^2 | mean abs % error |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for layout, f in r["layouts"].items():
        for key, label in (
            ("fitted", "fitted a*L + b*L^2"),
            ("fitted_held_out", "fitted a*L + b*L^2, 2-fold held out"),
            ("fitted_with_c", "fitted c + a*L + b*L^2"),
            ("default", "default 24576*L + L^2 (scaled)"),
            ("tokens", "tokens L (scaled)"),
        ):
            q = f[key]
            print(
                f"| {layout} | {f['micro_batches']} | {f['a_over_b']:,.0f} | {f['c_a_over_b']:,.0f} | {label} | "
                f"{q['r2']:.4f} | {q['mape']:.1%} |"
            )
    s = r["step_efficiency"]
    print(
        f"\nstep efficiency, {s['ranks']} ranks, micro-batches <= {s['cap']} tokens, split: {s['partitioner']}\n"
    )
    print(
        "| split by workload | measured efficiency (mean) | min | predicted by the workload | slowest rank s |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, w in s["workloads"].items():
        print(
            f"| {name} | {w['efficiency']:.3f} | {w['min_efficiency']:.3f} | {w['predicted_efficiency']:.3f} | "
            f"{w['slowest_s']:.3f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
