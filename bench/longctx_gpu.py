"""Long-context memory on a device: ``calibrate`` up to 32k tokens, packed (sum cost) and padded.

Round 1 (``bench/memory_gpu.py``) fitted the memory model up to 4,096 tokens; users train at
32k. This script (issue #42; ``bash bench/gpu_suite.sh longctx``, one call of about three
minutes) reuses memory_gpu.py's stages on the examples' LM (``examples/_lm_model.py``, ~30 M
parameters, bf16 autocast, AdamW), for two layouts:

* **padded**: ``(count, L)`` rows, causal SDPA; the fitted ``BatchMemoryModel`` is the cost,
  planned with ``strategy="pooled"``;
* **packed**: the samples of a batch in one row with block-diagonal causal attention (CUDA:
  FlashAttention varlen through nested tensors); ``calibrate`` probes rows of ``count`` samples
  of length ``L``, and the fitted ``fixed + count*(linear + per_token*L + quadratic*L**2)`` is
  turned into the packed *sum* cost ``fixed + linear*count + per_token*sum + quadratic*max*sum``
  (exact for one length; an upper bound otherwise, since ``sum(L**2) <= max*sum``), planned
  with ``strategy="packed"``.

Per layout: calibrate at lengths 128 ... 32,768 against a capacity enforced on the allocator
(``--capacity``); held-out peaks (padded: ``(count, L)`` shapes; packed: also rows of real
mixed lengths, predicted as ``fixed + sum(linear + per_token*L + quadratic*L**2)``) against the
5 % goal; an epoch of ``cpython_stdlib_pytokens`` (real file token counts, truncated at 32k;
up to ``--steps`` steps) planned at the calibrated budget, run under ``OOMGuard``: OOMs (goal 0)
and mean peak / capacity (goal >= 90 %). JSON to ``--out``, a table on stdout.

``--device cpu --tiny`` runs the same code paths on CPU (live-tensor tracker, lengths 128, 256, 512,
an 8 MiB capacity) in well under a minute: a dry run, not a result.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import memory_gpu as mg  # noqa: I001  (sets PYTORCH_CUDA_ALLOC_CONF before torch initialises CUDA)
import numpy as np
import torch

from fitbatch._validate import parse_budget
from fitbatch.costs import FunctionCost

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import _lm_model as lm  # noqa: E402
from _common import load  # noqa: E402

DATA = "cpython_stdlib_pytokens"
GiB = 2**30


class LMTrainer:
    """memory_gpu.Trainer's interface (step, make_batch, sample, collate_loss) on the examples'
    LM, in the padded or the packed layout."""

    def __init__(self, args: argparse.Namespace, layout: str) -> None:
        self.device = torch.device(args.device)
        self.layout = layout
        torch.manual_seed(0)
        self.vocab = args.vocab
        cfg = lm.LMConfig(
            vocab=args.vocab,
            dim=args.dim,
            layers=args.depth,
            heads=args.heads,
            max_len=args.max_len + 1,
        )
        self.model = lm.TinyLM(cfg).to(self.device)
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=1e-4, fused=self.device.type == "cuda"
        )
        self.amp = self.device.type == "cuda"
        self.attention = lm.resolve_attention(args.attention, self.device)
        self.gen = torch.Generator(device=self.device).manual_seed(0)

    def _tokens(self, n: int) -> torch.Tensor:
        return torch.randint(1, self.vocab, (n,), device=self.device, generator=self.gen)

    def loss(self, batch: lm.LMBatch) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            total, n = self.model(batch, self.attention)
        return total / n.clamp(min=1)

    def step(self, batch: lm.LMBatch) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.loss(batch).backward()
        self.opt.step()

    def packed(self, lengths: list[int]) -> lm.LMBatch:
        """One packed row of samples of ``lengths``, built on the device."""
        lens = torch.tensor(lengths, dtype=torch.long, device=self.device)
        cu = torch.zeros(len(lengths) + 1, dtype=torch.long, device=self.device)
        cu[1:] = lens.cumsum(0)
        total = int(cu[-1])
        tokens = self._tokens(total)[None]
        positions = (
            torch.arange(total, device=self.device) - torch.repeat_interleave(cu[:-1], lens)
        )[None]
        targets = tokens.roll(-1, 1)
        targets[0, cu[1:] - 1] = -100
        return lm.LMBatch(
            tokens, positions, targets, cu_seqlens=cu, max_seqlen=max(lengths), real_tokens=total
        )

    def make_batch(self, count: int, length: int) -> lm.LMBatch:
        if self.layout == "packed":
            return self.packed([int(length)] * int(count))
        tokens = self._tokens(count * length).view(count, length)
        positions = torch.arange(length, device=self.device).expand(count, length)
        targets = tokens.roll(-1, 1)
        targets[:, -1] = -100
        return lm.LMBatch(tokens, positions, targets, max_seqlen=length, real_tokens=count * length)

    def sample(self, length: int) -> torch.Tensor:
        return self._tokens(int(length))

    def collate_loss(self, items: list[torch.Tensor]) -> torch.Tensor:
        """Token-mean loss of variable-length samples (for OOMGuard), in this trainer's layout."""
        if self.layout == "packed":
            lens = [len(x) for x in items]
            batch = self.packed(lens)
            batch.tokens = torch.cat(items)[None]
            batch.targets = batch.tokens.roll(-1, 1)
            batch.targets[0, batch.cu_seqlens[1:] - 1] = -100
            return self.loss(batch)
        longest = max(len(x) for x in items)
        tokens = torch.zeros(len(items), longest, dtype=torch.long, device=self.device)
        targets = torch.full_like(tokens, -100)
        for i, x in enumerate(items):
            tokens[i, : len(x)] = x
            targets[i, : len(x) - 1] = x[1:]
        positions = torch.arange(longest, device=self.device).expand(len(items), longest)
        return self.loss(lm.LMBatch(tokens, positions, targets, max_seqlen=longest))


def packed_cost(model: Any) -> FunctionCost:
    """The packed sum cost of a batch model fitted on packed rows: an upper bound in bytes."""
    fixed, linear, per_token, quadratic = (
        model.fixed,
        model.linear,
        model.per_token,
        model.quadratic,
    )

    def packed_sum_bytes(
        count: np.ndarray, max_size: np.ndarray, sum_size: np.ndarray
    ) -> np.ndarray:
        m, s = np.asarray(max_size, dtype=np.float64), np.asarray(sum_size, dtype=np.float64)
        return fixed + linear * count + per_token * s + quadratic * m * s

    return FunctionCost(packed_sum_bytes)


def held_out_mixed(tr: LMTrainer, cal: Any, sizes: np.ndarray, args: argparse.Namespace) -> dict:
    """Packed rows of real mixed lengths, filled to 30-100 % of the budget: measured vs predicted."""
    rng = np.random.default_rng(5)
    mean = cal.model.mean
    rows = []
    pool = np.minimum(sizes, args.max_len)
    while len(rows) < args.held_out:
        target = rng.uniform(0.3, 1.0) * cal.budget
        picked: list[int] = []
        for v in rng.choice(pool, 256).tolist():
            trial = picked + [int(v)]
            if (
                float(mean.fixed + mean.per_sample(np.asarray(trial)).sum())
                * (1 + cal.model.margin)
                > target
            ):
                continue
            picked = trial
        if len(picked) < 2:
            continue
        measured = mg.absolute_peak(tr.device, lambda p=picked: tr.step(tr.packed(p)))
        predicted = float(mean.fixed + mean.per_sample(np.asarray(picked, dtype=np.float64)).sum())
        bound = float(
            packed_cost(cal.model).evaluate(
                np.array([len(picked)]), np.array([max(picked)]), np.array([sum(picked)])
            )[0]
        )
        rows.append(
            {
                "count": len(picked),
                "max": max(picked),
                "sum": sum(picked),
                "measured": measured,
                "predicted": predicted,
                "error": predicted / measured - 1,
                "covered": bound >= measured,
            }
        )
    return mg.held_out_summary(rows)


def run_layout(layout: str, args: argparse.Namespace, capacity: float, sizes: np.ndarray) -> dict:
    tr = LMTrainer(args, layout)
    out_base = Path(args.out).with_suffix("")
    cal_args = SimpleNamespace(
        **{**vars(args), "out": f"{out_base}.{layout}.json", "resume": False}
    )
    t0 = time.time()
    cal, res = mg.stage_calibrate(tr, capacity, cal_args)
    result: dict[str, Any] = {
        "layout": layout,
        "attention": tr.attention if layout == "packed" else "sdpa",
        "calibrate": res,
        "params": lm.n_params(tr.model),
    }
    result["held_out"] = mg.stage_held_out(tr, cal, cal_args)
    if layout == "packed":
        result["held_out_mixed"] = held_out_mixed(tr, cal, sizes, args)
        planned = SimpleNamespace(model=packed_cost(cal.model), budget=cal.budget)
        train_args = SimpleNamespace(**{**vars(cal_args), "strategy": "packed"})
    else:
        planned, train_args = cal, SimpleNamespace(**{**vars(cal_args), "strategy": "pooled"})
    result["train"] = train = mg.stage_train(tr, sizes, planned, capacity, train_args)
    # off CUDA nothing enforces the capacity: a peak above it would have been an OOM there
    train["goal_90pct"] = bool(train["goal_90pct"] and train["max_peak_fraction"] <= 1.0)
    result["seconds"] = time.time() - t0
    del tr, cal, planned
    gc.collect()  # the next layout's absolute peaks start from a clean allocator
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="longctx.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--capacity", default="24GiB", help="memory the run may use (enforced on CUDA)")
    p.add_argument("--layouts", default="packed,padded")
    p.add_argument("--max-len", type=int, default=32768)
    p.add_argument(
        "--steps", type=int, default=150, help="most training steps of the epoch per layout"
    )
    p.add_argument("--headroom", type=float, default=0.03)
    p.add_argument("--held-out", type=int, default=12)
    p.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds of calibration probes per layout"
    )
    p.add_argument("--attention", default="auto", choices=lm.ATTENTIONS)
    p.add_argument(
        "--tiny", action="store_true", help="small model, lengths and capacity (CPU dry run)"
    )
    args = p.parse_args(argv)
    model = dict(vocab=8192, dim=512, depth=8, heads=8, max_count=65536)  # ~30 M parameters
    if args.tiny:
        model = dict(vocab=256, dim=32, depth=2, heads=4, max_count=512)
        args.max_len, args.steps, args.held_out = (
            min(args.max_len, 512),
            min(args.steps, 4),
            min(args.held_out, 3),
        )
        args.time_limit = min(args.time_limit, 60.0)
    for k, v in model.items():
        setattr(args, k, v)
    grid = [128, 256] if args.tiny else [int(v) for v in 2 ** np.arange(7, 16)]  # 128 ... 32768
    args.lengths = [v for v in grid if v < args.max_len] + [args.max_len]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --tiny for a dry run", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    capacity = parse_budget("8MiB" if args.tiny and device.type == "cpu" else args.capacity)
    name = mg.cap_device(device, capacity, "cpu (dry run: live-tensor tracker)")
    if name is None:
        return 2
    sizes = load(DATA).astype(np.int64)
    results: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "capacity": capacity,
        "data": DATA,
        "args": vars(args),
        "layouts": {},
    }
    for layout in [v.strip() for v in args.layouts.split(",") if v.strip()]:
        results["layouts"][layout] = run_layout(layout, args, capacity, sizes)
        Path(args.out).write_text(json.dumps(results, indent=1, default=float))
    print_table(results)
    return 0


def print_table(r: dict) -> None:
    print(
        f"{r['device']} · torch {r['torch']} · capacity {r['capacity'] / GiB:.3g} GiB · lengths "
        f"{r['args']['lengths'][0]}-{r['args']['lengths'][-1]} · epoch: {r['data']} (<= {r['args']['max_len']})\n"
    )
    print(
        "| layout | params | probes (OOM) | margin | budget | held-out max / mean abs err (5 %) | covered "
        "| mixed rows max abs err | epoch steps | OOM | mean peak / capacity (90 %) | tok/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layout, x in r["layouts"].items():
        c, h, t = x["calibrate"], x["held_out"], x["train"]
        mixed = x.get("held_out_mixed")
        mixed_s = (
            f"{mixed['max_abs_err']:.3%} ({'met' if mixed['goal_5pct'] else 'NOT met'})"
            if mixed
            else "-"
        )
        print(
            f"| {layout} ({x['attention']}) | {x['params'] / 1e6:.1f} M | {c['probes']} ({c['ooms_during_probing']}) "
            f"| {c['model']['margin']:.2%} | {c['budget'] / GiB:.3g} GiB | {h['max_abs_err']:.3%} / {h['mean_abs_err']:.3%} "
            f"({'met' if h['goal_5pct'] else 'NOT met'}) | {h['coverage']:.0%} | {mixed_s} | {t['steps']} of "
            f"{t['batches_in_plan']} | {t['ooms']} | {t['mean_peak_fraction']:.1%} "
            f"({'met' if t['goal_90pct'] else 'NOT met'}) | {t['tokens_per_second']:,.0f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
