"""GPU benchmark of fitbatch.memory: measure, calibrate, predict, recover from OOM, train at capacity.

Run on a CUDA machine (about 5-10 minutes on one H100):

    python bench/memory_gpu.py --out results.json [--capacity 12GiB] [--steps 200]

It trains a small GPT-style transformer in bf16 (autocast) and records, in ``--out`` and as a
printed table:

1. ``collect_peak_memory`` over single real-length samples, and a size-model fit of them;
2. ``calibrate`` (doubling + bisection per length, against a capacity enforced on the allocator
   with ``torch.cuda.set_per_process_memory_fraction``), its model and budget;
3. predicted vs measured peak on held-out (count, length) shapes near the budget (goal: 5 %);
4. a real OOM (a batch predicted at ~1.6x the budget, under the enforced capacity) recovered
   by ``OOMGuard``: micro-batch count, no sample lost, sampler budget lowered;
5. ``--steps`` training steps on batches planned with ``plan_batches(sizes, budget,
   cost=model, strategy="pooled")`` over the real length set
   ``cpython_stdlib_functions`` (``../shared/data``, else ``tests/data``) (goal: zero OOM, mean peak >= 90 % of
   the capacity).

``--device cpu --tiny`` runs the same code paths on CPU in a minute (live-tensor tracker, a
simulated OOM) to check the script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time

# before CUDA initialises: fewer fragmentation OOMs when batch shapes change every step
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fitbatch  # noqa: E402
from fitbatch.memory import (  # noqa: E402
    PeakTracker,
    collect_peak_memory,
    fit_size_model,
)
from fitbatch.memory.calibrate import calibrate  # noqa: E402
from fitbatch.memory.guard import OOMGuard  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import load  # noqa: E402

DATA = "cpython_stdlib_functions"  # bench/_common.load: ../shared/data, else tests/data
GiB = 2**30


# ----------------------------------------------------------------------------- the model


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        )
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, depth: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(max_len, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.ln, self.head = torch.nn.LayerNorm(dim), torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class Trainer:
    """Model, optimizer, and the step / batch functions the memory tools need."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.device = torch.device(args.device)
        torch.manual_seed(0)
        self.vocab = args.vocab
        self.model = GPT(args.vocab, args.dim, args.depth, args.heads, args.max_len + 1).to(
            self.device
        )
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=1e-4, fused=self.device.type == "cuda"
        )
        self.amp = self.device.type == "cuda"
        self.gen = torch.Generator(device=self.device).manual_seed(0)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            logits = self.model(tokens)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)

    def step(self, tokens: torch.Tensor) -> None:
        """A full training step on a dense (count, length) batch: what calibrate probes."""
        self.opt.zero_grad(set_to_none=True)
        self.loss(tokens, tokens.roll(-1, 1)).backward()
        self.opt.step()

    def make_batch(self, count: int, length: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (count, length), device=self.device, generator=self.gen)

    def collate_loss(self, items: list[torch.Tensor]) -> torch.Tensor:
        """Token-mean loss of variable-length samples padded to their longest (for OOMGuard)."""
        longest = max(len(x) for x in items)
        tokens = torch.zeros(len(items), longest, dtype=torch.long, device=self.device)
        targets = torch.full_like(tokens, -100)
        for i, x in enumerate(items):
            tokens[i, : len(x)] = x
            targets[i, : len(x) - 1] = x[1:]
        return self.loss(tokens, targets)

    def sample(self, length: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (int(length),), device=self.device, generator=self.gen)


class BudgetSampler:
    """Stand-in for a fitbatch sampler: the guard lowers or raises ``budget`` through ``set_budget``."""

    def __init__(self, budget: float) -> None:
        self.budget = budget

    def set_budget(self, budget: float) -> None:
        self.budget = budget


# ---------------------------------------------------------------------------- the stages


def absolute_peak(device: torch.device, fn, *args) -> float:  # type: ignore[no-untyped-def]
    with PeakTracker(device) as t:
        fn(*args)
    return float(t.baseline + t.peak)


def stage_collect(tr: Trainer, sizes: np.ndarray, args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(1)
    picked = np.sort(rng.choice(sizes[sizes <= args.max_len], args.collect, replace=False))

    def work(length: int) -> int:
        tr.step(tr.make_batch(1, int(length)))
        return int(length)

    prof = collect_peak_memory(picked.tolist(), work, device=tr.device, warmup=2, progress=True)
    model = fit_size_model(prof.features, prof.peaks, degree=2)
    err = model.predict(prof.features, upper=False) / prof.peaks - 1
    return {
        "items": len(picked),
        "measured": len(prof),
        "failed": len(prof.failed),
        "size_model_margin": model.margin,
        "size_model_max_abs_err": float(np.abs(err).max()),
    }


def stage_calibrate(tr: Trainer, capacity: float, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    lengths = getattr(args, "lengths", None) or [  # bench/longctx_gpu.py: up to 32k
        v for v in (32, 64, 128, 256, 512, 1024, 2048, 4096, args.max_len) if v <= args.max_len
    ]
    log = os.path.splitext(args.out)[0] + ".probes.jsonl"
    if os.path.exists(log) and not args.resume:
        os.remove(log)
    t0 = time.time()
    cal = calibrate(
        tr.step,
        tr.make_batch,
        device=tr.device,
        capacity=capacity,
        lengths=lengths,
        max_count=args.max_count,
        headroom=args.headroom,
        time_limit=args.time_limit,
        log=log,
    )
    m = cal.model
    return cal, {
        "seconds": time.time() - t0,
        "probes": len(cal.probes),
        "fitted": len(m.samples),
        "ooms_during_probing": sum(p.peak is None for p in cal.probes),
        "complete": cal.complete,
        "max_counts": {str(k): v for k, v in cal.max_counts.items()},
        "budget": cal.budget,
        "model": {
            "fixed": m.fixed,
            "linear": m.linear,
            "per_token": m.per_token,
            "quadratic": m.quadratic,
            "margin": m.margin,
        },
    }


def held_out_summary(rows: list[dict]) -> dict:
    """Held-out shapes with their prediction errors: the worst and mean error, coverage, the 5 % goal."""
    errors = np.array([r["error"] for r in rows])
    return {
        "shapes": rows,
        "max_abs_err": float(np.abs(errors).max()),
        "mean_abs_err": float(np.abs(errors).mean()),
        "coverage": float(np.mean([r["covered"] for r in rows])),
        "goal_5pct": bool(np.abs(errors).max() <= 0.05),
    }


def stage_held_out(tr: Trainer, cal, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(2)
    probed = {(p.count, p.length) for p in cal.probes}
    rows = []
    while len(rows) < args.held_out:
        length = int(rng.integers(24, args.max_len))
        most = float(cal.model.max_count(np.array([float(length)]), cal.budget)[0])
        count = max(1, int(rng.uniform(0.3, 1.0) * min(most, args.max_count)))
        if (count, length) in probed:
            continue
        measured = absolute_peak(tr.device, lambda c=count, L=length: tr.step(tr.make_batch(c, L)))
        mean = float(cal.model.predict([count], [length], upper=False)[0])
        upper = float(cal.model.predict([count], [length])[0])
        rows.append(
            {
                "count": count,
                "length": length,
                "measured": measured,
                "predicted": mean,
                "error": mean / measured - 1,
                "covered": upper >= measured,
            }
        )
    return held_out_summary(rows)


def stage_oom(tr: Trainer, cal, capacity: float, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    length = min(args.max_len, 1024)
    per_sample = float(cal.model.predict([1], [length])[0] - cal.model.fixed)
    count = int(math.ceil(1.6 * (cal.budget - cal.model.fixed) / per_sample))
    items = [tr.sample(length - i % 7) for i in range(count)]
    sampler = BudgetSampler(cal.budget)
    guard = OOMGuard(tr.model, tr.opt, sampler=sampler, size_fn=len, cost=cal.model)
    seen: list[int] = []

    def loss_fn(micro: list[torch.Tensor]) -> torch.Tensor:
        if (
            tr.device.type != "cuda"
            and float(cal.model.predict([len(micro)], [max(map(len, micro))])[0]) > capacity
        ):
            raise torch.OutOfMemoryError("simulated (CPU dry run)")
        seen.extend(id(x) for x in micro)
        return tr.collate_loss(micro)

    t0 = time.time()
    guard.step(items, loss_fn)
    event = guard.events[0] if guard.events else None
    # the last attempt covered every sample exactly once
    last = seen[-count:]
    return {
        "count": count,
        "length": length,
        "predicted_peak": float(cal.model.predict([count], [length])[0]),
        "capacity": capacity,
        "recovered": event is not None,
        "parts": event.parts if event else 1,
        "no_sample_lost": sorted(last) == sorted(id(x) for x in items),
        "budget_before": cal.budget,
        "budget_after": sampler.budget,
        "seconds": time.time() - t0,
        "real_oom": tr.device.type == "cuda",
    }


def stage_train(
    tr: Trainer, sizes: np.ndarray, cal, capacity: float, args: argparse.Namespace
) -> dict:  # type: ignore[no-untyped-def]
    lengths = np.minimum(sizes, args.max_len)
    strategy = getattr(args, "strategy", "pooled")  # bench/longctx_gpu.py packs with "packed"
    plan = fitbatch.plan_batches(lengths, cal.budget, cost=cal.model, strategy=strategy, seed=0)
    sampler = BudgetSampler(cal.budget)
    guard = OOMGuard(tr.model, tr.opt, sampler=sampler, size_fn=len, cost=cal.model)
    peaks, fills, tokens = [], [], 0
    t0 = time.time()
    for k, batch in enumerate(plan):
        if k == args.steps:
            break
        items = [tr.sample(lengths[i]) for i in batch]
        peaks.append(absolute_peak(tr.device, guard.step, items, tr.collate_loss))
        fills.append(
            float(
                cal.model.evaluate(
                    np.array([len(batch)]),
                    np.array([lengths[batch].max()]),
                    np.array([lengths[batch].sum()]),
                )[0]
            )
            / cal.budget
        )
        tokens += int(lengths[batch].sum())
    if tr.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.time() - t0
    ratio = np.array(peaks) / capacity
    return {
        "steps": len(peaks),
        "batches_in_plan": len(plan),
        "ooms": guard.ooms,
        "mean_peak_fraction": float(ratio.mean()),
        "min_peak_fraction": float(ratio.min()),
        "max_peak_fraction": float(ratio.max()),
        "mean_planned_fill": float(np.mean(fills)),
        "tokens_per_second": tokens / seconds,
        "seconds": seconds,
        "goal_zero_oom": guard.ooms == 0,
        "goal_90pct": bool(ratio.mean() >= 0.90),
    }


# ------------------------------------------------------------------------------- driver


MODELS = {
    "30M": dict(vocab=8192, dim=512, depth=8, heads=8, max_len=5120, max_count=4096),
    "100M": dict(vocab=16384, dim=768, depth=12, heads=12, max_len=4096, max_count=4096),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="memory_gpu_results.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--capacity", default="12GiB", help="memory the run may use (enforced on CUDA)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--headroom", type=float, default=0.03)
    p.add_argument("--held-out", type=int, default=20)
    p.add_argument("--collect", type=int, default=40, help="single samples for collect_peak_memory")
    p.add_argument("--time-limit", type=float, default=600.0)
    p.add_argument("--resume", action="store_true", help="reuse the probe log of an earlier run")
    p.add_argument("--tiny", action="store_true", help="small model and capacity (CPU dry run)")
    p.add_argument("--model-size", choices=sorted(MODELS), default="100M",
                   help="the GPU model: 100M (~110 M parameters) or 30M (~30 M)")
    args = p.parse_args(argv)
    tiny = dict(vocab=256, dim=32, depth=2, heads=4, max_len=256, max_count=256)
    for k, v in (tiny if args.tiny else MODELS[args.model_size]).items():
        setattr(args, k, v)
    if args.tiny:
        args.steps, args.held_out, args.collect = (
            min(args.steps, 20),
            min(args.held_out, 8),
            min(args.collect, 10),
        )
    return args


def cap_device(device: torch.device, capacity: float, cpu_name: str) -> str | None:
    """Hold a CUDA device's allocator to ``capacity`` bytes; the device's name (``cpu_name`` on
    CPU), or ``None`` (said on stderr) when the capacity exceeds 95 % of the device."""
    if device.type != "cuda":
        return cpu_name
    total = torch.cuda.get_device_properties(device).total_memory
    if capacity > 0.95 * total:
        print(f"capacity {capacity / GiB:.1f} GiB exceeds this device's {total / GiB:.1f} GiB", file=sys.stderr)
        return None
    torch.cuda.set_per_process_memory_fraction(capacity / total, device.index or 0)
    return torch.cuda.get_device_name(device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --tiny for a dry run", file=sys.stderr)
        return 2
    tr = Trainer(args)
    # --tiny on CUDA: 1 GiB leaves room for the context and the cuBLAS workspaces
    tiny_capacity = "8MiB" if tr.device.type == "cpu" else "1GiB"
    capacity = fitbatch.costs.parse_budget(tiny_capacity if args.tiny else args.capacity)
    name = cap_device(tr.device, capacity, "cpu (dry run: live-tensor tracker, simulated OOM)")
    if name is None:
        return 2
    sizes = load(DATA).astype(np.int64)
    results: dict = {
        "device": name,
        "torch": torch.__version__,
        "capacity": capacity,
        "params": sum(p.numel() for p in tr.model.parameters()),
        "precision": "bf16 autocast" if tr.amp else "fp32",
        "args": vars(args),
    }
    results["collect"] = stage_collect(tr, sizes, args)
    cal, results["calibrate"] = stage_calibrate(tr, capacity, args)
    results["held_out"] = stage_held_out(tr, cal, args)
    results["oom"] = stage_oom(tr, cal, capacity, args)
    results["train"] = stage_train(tr, sizes, cal, capacity, args)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1, default=float)
    print_table(results)
    return 0


def print_table(r: dict) -> None:
    c, h, o, t = r["calibrate"], r["held_out"], r["oom"], r["train"]
    rows = [
        ("device", r["device"]),
        ("model parameters", f"{r['params'] / 1e6:.1f} M ({r['precision']}, AdamW)"),
        ("capacity given", f"{r['capacity'] / GiB:.2f} GiB"),
        (
            "collect_peak_memory",
            f"{r['collect']['measured']} measured, {r['collect']['failed']} OOM; "
            f"size model max err {r['collect']['size_model_max_abs_err']:.4%}",
        ),
        (
            "calibrate",
            f"{c['probes']} probes ({c['ooms_during_probing']} OOM) in {c['seconds']:.0f} s; "
            f"margin {c['model']['margin']:.2%}; budget {c['budget'] / GiB:.2f} GiB",
        ),
        (
            "held-out shapes",
            f"{len(h['shapes'])}: max |err| {h['max_abs_err']:.4%}, mean {h['mean_abs_err']:.4%}, "
            f"bound covers {h['coverage']:.0%} (goal 5 %: {h['goal_5pct']})",
        ),
        (
            "OOM recovery",
            f"{o['count']} x {o['length']} tokens, predicted {o['predicted_peak'] / GiB:.2f} GiB: "
            f"recovered={o['recovered']} as {o['parts']} parts, no sample lost={o['no_sample_lost']}, "
            f"budget {o['budget_before'] / GiB:.2f} -> {o['budget_after'] / GiB:.2f} GiB",
        ),
        (
            "training",
            f"{t['steps']} steps, {t['ooms']} OOM, mean peak {t['mean_peak_fraction']:.1%} of capacity "
            f"(min {t['min_peak_fraction']:.1%}, max {t['max_peak_fraction']:.1%}), "
            f"planned fill {t['mean_planned_fill']:.1%}, {t['tokens_per_second']:.0f} tok/s",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    sys.exit(main())
