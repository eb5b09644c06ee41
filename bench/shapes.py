"""Bounded shapes under torch.compile: recompiles and real tokens/s, unbounded vs ``max_shapes=K``.

torch.compile specialises a graph on its input shapes: a budget planner's hundreds of
``(rows, length)`` batch shapes mean hundreds of compilations (``dynamic=False``), or one
dynamic-shape graph (``dynamic=True``) that runs slower kernels. ``max_shapes=K`` plans every
batch to fit one of K shapes chosen from the data, and each batch is padded to its shape.

The configuration recorded in BENCHMARKS.md (on a loaded 2-core CPU VM, about 22 minutes, nearly
all of it inductor compiling C++ at 9-20 s a graph; ``--samples 600`` is a quicker check):

    python bench/shapes.py --samples 2500 --budget 4096 --max-len 512 --ks 4 8 16

Samples are the real function lengths of the CPython standard library (``cpython_stdlib_functions``,
resampled with a fixed seed, truncated at ``--max-len``), planned with the default strategy
(pooled) and the padded cost. The model (:class:`Mixer`): token embedding, two blocks of masked
mean token mixing and a channel MLP (d=64), a per-token head over a 1024 vocabulary, float32, CPU,
one thread, forward only under ``no_grad``, inductor backend. Every mode runs two epochs over the same batches in the same
order: epoch 1 includes the compilations, epoch 2 is the steady state. Printed per mode:
batches, distinct input shapes, compilations (graphs the backend compiled), padding efficiency
(real tokens / positions computed, rows x length of each input), real tokens/s of epoch 1
(with compiling) and of epoch 2, and the whole run's seconds.

GPU round 2 (issue #42; ``bash bench/gpu_suite.sh shapes``): ``--suite round2`` runs, each in a
fresh process, eager; ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) unbounded and with
``max_shapes=K``; and ``dynamic=True`` (default mode), over a training step (``--train``: forward,
backward, SGD step) of the examples' small LM (``--model lm``, padded layout, causal SDPA).
Compilations are dynamo's ``unique_graphs``; "compile s" is the wall time of the epoch-1 steps
that compiled (CUDA-graph recordings of an already compiled shape are not counted in it). A mode
still compiling after ``--time-cap`` seconds stops there and reports the batches it ran and an
estimate of its whole first epoch (the remaining new shapes at its mean compile-step time, the
rest at its steady step time). ``--out`` writes the rows as JSON. CPU dry run:

    python bench/shapes.py --suite round2 --device cpu --model lm --model-size tiny --train \
        --backend aot_eager --samples 120 --budget 1024 --max-len 128 --ks 4 8 --time-cap 10 \
        --out shapes_dry.json

(``--backend aot_eager``: dynamo's graphs and recompilations without inductor, whose C++
compilation of a training step takes 30-55 s a graph on the loaded 2-core VM; the compile
modes are then not applied.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")  # every mode compiles from scratch (and
# each runs in its own process with an empty TORCHINDUCTOR_CACHE_DIR: no kernel is reused)
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch._dynamo.utils  # noqa: E402
import torch._inductor.config  # noqa: E402
from _common import load, resample  # noqa: E402

import fitbatch  # noqa: E402

VOCAB = 1024


class Mixer(torch.nn.Module):
    """A tiny MLP-mixer for variable lengths: embedding, two blocks of (masked mean token mixing,
    channel MLP), a per-token head; returns the mean log-partition over real tokens."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, d)
        self.mix = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(2)])
        self.mlp = torch.nn.ModuleList(
            [
                torch.nn.Sequential(
                    torch.nn.LayerNorm(d),
                    torch.nn.Linear(d, 4 * d),
                    torch.nn.GELU(),
                    torch.nn.Linear(4 * d, d),
                )
                for _ in range(2)
            ]
        )
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        count = keep.sum(1, keepdim=True).clamp(min=1)[..., None]
        for mix, mlp in zip(self.mix, self.mlp):
            x = x + mix((x * keep[..., None]).sum(1, keepdim=True) / count)
            x = x + mlp(x)
        return (self.head(x).logsumexp(-1) * keep).sum() / keep.sum().clamp(min=1)


class LMLoss(torch.nn.Module):
    """The examples' small causal LM (``examples/_lm_model.py``, padded layout, causal SDPA) and
    its token-mean next-token loss over real tokens; the same ``(tokens, keep)`` inputs as
    :class:`Mixer`."""

    def __init__(self, size: str, max_len: int) -> None:
        super().__init__()
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
        import _lm_model as lm

        self._lm = lm
        self.lm = lm.TinyLM(lm.LMConfig.named(size, vocab=VOCAB, max_len=max_len))

    def forward(self, tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        logits = self.lm.logits(self._lm.LMBatch(tokens, positions, tokens), "dense")
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="none"
        )
        weight = keep[:, 1:].flatten()
        return (nll * weight).sum() / weight.sum().clamp(min=1)


@dataclass
class Mode:
    name: str
    compile: bool
    dynamic: bool
    k: int | None
    cmode: str | None = None  # torch.compile(mode=...): "reduce-overhead" = CUDA graphs


def batches(lengths: np.ndarray, budget: float, k: int | None) -> list[tuple[np.ndarray, int, int]]:
    """(lengths of the batch's samples, rows, length) per batch: the input each batch is padded to."""
    plan = fitbatch.plan_batches(lengths, budget, max_shapes=k, seed=0)
    if plan.shapes is None:
        return [(lengths[b], len(b), int(lengths[b].max())) for b in plan]
    return [(lengths[b], int(r), int(n)) for b, (r, n) in zip(plan, plan.shapes.tolist())]


def inputs(
    batch: tuple[np.ndarray, int, int], rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    sizes, rows, length = batch
    keep = np.arange(length)[None, :] < np.pad(sizes, (0, rows - sizes.size))[:, None]
    tokens = np.where(keep, rng.integers(1, VOCAB, (rows, length)), 0)
    return torch.from_numpy(tokens), torch.from_numpy(keep.astype(np.float32))


def run(
    mode: Mode, lengths: np.ndarray, budget: float, opts: argparse.Namespace | None = None
) -> dict:
    """One mode: ``opts.epochs`` epochs over the same batches (default: two, forward only, CPU)."""
    device = torch.device(getattr(opts, "device", "cpu"))
    train = bool(getattr(opts, "train", False))
    epochs = int(getattr(opts, "epochs", 2))
    cap = getattr(opts, "time_cap", None)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    if getattr(opts, "model", "mixer") == "lm":
        model = LMLoss(opts.model_size, int(lengths.max()) + 1).to(device)
    else:
        model = Mixer().to(device)
    compiled = [0]

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        from torch._inductor.compile_fx import compile_fx

        compiled[0] += 1
        return compile_fx(gm, example_inputs)

    if not mode.compile:
        step = model
    elif mode.cmode is None and getattr(opts, "suite", "cpu") == "cpu":
        step = torch.compile(model, backend=backend, dynamic=mode.dynamic)
    elif getattr(opts, "backend", "inductor") != "inductor":  # a dry run's quick backend: no mode
        step = torch.compile(model, backend=opts.backend, dynamic=mode.dynamic)
    else:  # round 2: the public modes, graphs counted by dynamo
        step = torch.compile(model, mode=mode.cmode, dynamic=mode.dynamic)

    def compiles() -> int:
        return compiled[0] or int(torch._dynamo.utils.counters["stats"]["unique_graphs"])

    plan = batches(lengths, budget, mode.k)
    rng = np.random.default_rng(0)
    data = [tuple(t.to(device) for t in inputs(b, rng)) for b in plan]
    real = float(sum(b[0].sum() for b in plan))
    positions = float(sum(b[1] * b[2] for b in plan))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3) if train else None
    amp = getattr(opts, "dtype", "fp32") == "bf16"
    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
    graphs = mode.cmode == "reduce-overhead" and device.type == "cuda" and mark is not None

    def one(tokens: torch.Tensor, keep: torch.Tensor) -> None:
        if graphs:
            mark()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            if opt is None:
                with torch.no_grad():
                    step(tokens, keep)
                return
            loss = step(tokens, keep)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    seconds, compile_s, compile_steps, steady = [], 0.0, 0, []
    done, capped = 0, False
    t_run = time.perf_counter()
    # epoch 1 step by step: the steps that compiled, and when the time cap is reached
    for tokens, keep in data:
        before = compiles()
        t0 = time.perf_counter()
        one(tokens, keep)
        sync()
        dt = time.perf_counter() - t0
        if compiles() > before:
            compile_s += dt
            compile_steps += 1
        else:
            steady.append(dt)
        done += 1
        if cap is not None and time.perf_counter() - t_run > cap and done < len(data):
            capped = True
            break
    seconds.append(time.perf_counter() - t_run)
    for _ in range(epochs - 1 if not capped else 0):
        t0 = time.perf_counter()
        for tokens, keep in data:
            one(tokens, keep)
        sync()
        seconds.append(time.perf_counter() - t0)
    ran = plan[:done]
    real_done = float(sum(b[0].sum() for b in ran))
    seen = {(b[1], b[2]) for b in ran}
    new_left = len({(b[1], b[2]) for b in plan[done:]} - seen)
    per_compile = compile_s / max(compile_steps, 1)
    per_step = float(np.median(steady)) if steady else per_compile
    estimate = seconds[0] + new_left * per_compile + (len(plan) - done - new_left) * per_step
    out = {
        "batches": len(plan),
        "shapes": len({(b[1], b[2]) for b in plan}),
        "compiles": compiles(),
        "padding": real / positions,
        "tps1": real_done / seconds[0],
        "tps2": real / seconds[1] if len(seconds) > 1 else float("nan"),
        "seconds": time.perf_counter() - t_run,
        "compile_s": compile_s,
        "compile_steps": compile_steps,
        "epoch1_s": seconds[0],
        "batches_run": done,
        "capped": capped,
        "epoch1_s_estimate": estimate,
    }
    # steady rate: the last epoch; capped (one epoch): epoch 1's steps that compiled nothing,
    # at the mean real tokens of the batches that ran
    if len(seconds) > 1:
        out["tps_steady"] = real / seconds[-1]
    else:
        out["tps_steady"] = real_done / max(done, 1) / per_step if steady else float("nan")
    return out


def modes(ks: list[int], suite: str = "cpu") -> list[Mode]:
    if suite == "round2":
        ro = "reduce-overhead"
        return [
            Mode("eager, unbounded", False, False, None),
            Mode('compile mode="reduce-overhead", unbounded', True, False, None, ro),
            *(
                Mode(f'compile mode="reduce-overhead", max_shapes={k}', True, False, k, ro)
                for k in ks
            ),
            Mode("compile dynamic=True, unbounded", True, True, None),
        ]
    return [
        Mode("eager, unbounded", False, False, None),
        Mode("compile dynamic=False, unbounded", True, False, None),
        Mode("compile dynamic=True, unbounded", True, True, None),
        *(Mode(f"compile dynamic=False, max_shapes={k}", True, False, k) for k in ks),
    ]


def child(args: argparse.Namespace) -> None:
    """Run one mode in this fresh process and print its result as one JSON line."""
    torch.set_num_threads(args.threads)
    if args.device == "cpu":
        torch._inductor.config.compile_threads = 1  # compile in-process: no worker pool on 2 cores
    for name in (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    ):
        if hasattr(torch._dynamo.config, name):  # every shape compiles: no fallback to eager
            setattr(torch._dynamo.config, name, 100_000)
    lengths = np.minimum(
        resample(load("cpython_stdlib_functions"), args.samples, seed=0), args.max_len
    )
    print(json.dumps(run(modes(args.ks, args.suite)[args.mode], lengths, args.budget, args)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2500)
    parser.add_argument("--budget", type=float, default=4096)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument(
        "--suite",
        choices=("cpu", "round2"),
        default="cpu",
        help="cpu: the recorded CPU-inductor modes; round2: CUDA graphs (issue #42)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", choices=("mixer", "lm"), default="mixer")
    parser.add_argument("--model-size", default="tiny", help="--model lm: tiny, small, 25M, 100M")
    parser.add_argument("--train", action="store_true", help="forward, backward and an SGD step")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--backend",
        default="inductor",
        help="round2: aot_eager checks dynamo's graphs and recompiles without inductor "
        "(a CPU dry run; compile modes are then not applied)",
    )
    parser.add_argument(
        "--time-cap",
        type=float,
        default=None,
        help="seconds a mode may spend in epoch 1 before it stops and estimates",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="also write the rows as JSON here")
    parser.add_argument("--mode", type=int, default=None, help=argparse.SUPPRESS)  # a child's mode
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.mode is not None:
        child(args)
        return
    lengths = np.minimum(
        resample(load("cpython_stdlib_functions"), args.samples, seed=0), args.max_len
    )
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    what = "training step" if args.train else "forward"
    print(
        f"{lengths.size} samples of cpython_stdlib_functions (<= {args.max_len} tokens, {int(lengths.sum())} "
        f"tokens), budget {args.budget:g} padded tokens, torch {torch.__version__}, {args.threads} thread(s), "
        f"{device}, model {args.model}{'/' + args.model_size if args.model == 'lm' else ''} ({what}, "
        f"{args.dtype}, backend {args.backend}), each mode in a fresh process with an empty inductor cache\n"
    )
    if args.suite == "cpu":
        head = (
            "mode",
            "batches",
            "shapes",
            "compiles",
            "padding eff",
            "tok/s ep1",
            "tok/s ep2",
            "run s",
        )
    else:
        head = (
            "mode",
            "batches",
            "shapes",
            "compiles",
            "compile s",
            "padding eff",
            "steady tok/s",
            "epoch 1 s (with compiling)",
            "run s",
        )
    rows, results = [], []
    for i, mode in enumerate(modes(args.ks, args.suite)):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            argv = [sys.executable, __file__, *sys.argv[1:], "--mode", str(i)]
            limit = None if args.time_cap is None else args.time_cap + 90  # + start-up, one compile
            try:
                proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=limit)
                r = (
                    json.loads(proc.stdout.strip().splitlines()[-1])
                    if proc.returncode == 0
                    else {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
                )
            except subprocess.TimeoutExpired:
                r = {"error": f"timed out after {limit:.0f} s"}
        results.append({"mode": mode.name, **asdict(mode), **r})
        if "error" in r:
            rows.append((mode.name, r["error"], *[""] * (len(head) - 2)))
        elif args.suite == "cpu":
            rows.append(
                (
                    mode.name,
                    f"{r['batches']}",
                    f"{r['shapes']}",
                    f"{r['compiles']}",
                    f"{r['padding']:.3f}",
                    f"{r['tps1']:.0f}",
                    f"{r['tps2']:.0f}",
                    f"{r['seconds']:.1f}",
                )
            )
        else:
            epoch1 = f"{r['epoch1_s']:.1f}"
            if r["capped"]:
                epoch1 = f"capped at {r['batches_run']}/{r['batches']} batches; est. {r['epoch1_s_estimate']:.0f}"
            rows.append(
                (
                    mode.name,
                    f"{r['batches']}",
                    f"{r['shapes']}",
                    f"{r['compiles']}",
                    f"{r['compile_s']:.1f}",
                    f"{r['padding']:.3f}",
                    f"{r['tps_steady']:,.0f}",
                    epoch1,
                    f"{r['seconds']:.1f}",
                )
            )
        print(" | ".join(rows[-1]), flush=True)
        if args.out:  # after every mode: a part stopped by its timeout keeps the modes it ran
            info = {
                "device": device,
                "torch": torch.__version__,
                "samples": int(lengths.size),
                "tokens": int(lengths.sum()),
            }
            Path(args.out).write_text(
                json.dumps({"args": vars(args), **info, "rows": results}, indent=1)
            )
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    print("\n| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


if __name__ == "__main__":
    main()
