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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")  # every mode compiles from scratch (and
# each runs in its own process with an empty TORCHINDUCTOR_CACHE_DIR: no kernel is reused)
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
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


@dataclass
class Mode:
    name: str
    compile: bool
    dynamic: bool
    k: int | None


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


def run(mode: Mode, lengths: np.ndarray, budget: float) -> dict[str, float]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Mixer()
    compiled = [0]

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        from torch._inductor.compile_fx import compile_fx

        compiled[0] += 1
        return compile_fx(gm, example_inputs)

    step = torch.compile(model, backend=backend, dynamic=mode.dynamic) if mode.compile else model
    plan = batches(lengths, budget, mode.k)
    rng = np.random.default_rng(0)
    data = [inputs(b, rng) for b in plan]
    real = float(sum(b[0].sum() for b in plan))
    positions = float(sum(b[1] * b[2] for b in plan))
    seconds = []
    t_run = time.perf_counter()
    with torch.no_grad():
        for _ in range(2):
            t0 = time.perf_counter()
            for tokens, keep in data:
                step(tokens, keep)
            seconds.append(time.perf_counter() - t0)
    return {
        "batches": len(plan),
        "shapes": len({(b[1], b[2]) for b in plan}),
        "compiles": compiled[0],
        "padding": real / positions,
        "tps1": real / seconds[0],
        "tps2": real / seconds[1],
        "seconds": time.perf_counter() - t_run,
    }


def modes(ks: list[int]) -> list[Mode]:
    return [
        Mode("eager, unbounded", False, False, None),
        Mode("compile dynamic=False, unbounded", True, False, None),
        Mode("compile dynamic=True, unbounded", True, True, None),
        *(Mode(f"compile dynamic=False, max_shapes={k}", True, False, k) for k in ks),
    ]


def child(args: argparse.Namespace) -> None:
    """Run one mode in this fresh process and print its result as one JSON line."""
    torch.set_num_threads(1)
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
    print(json.dumps(run(modes(args.ks)[args.mode], lengths, args.budget)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2500)
    parser.add_argument("--budget", type=float, default=4096)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--mode", type=int, default=None, help=argparse.SUPPRESS)  # a child's mode
    args = parser.parse_args()
    if args.mode is not None:
        child(args)
        return
    lengths = np.minimum(
        resample(load("cpython_stdlib_functions"), args.samples, seed=0), args.max_len
    )
    print(
        f"{lengths.size} samples of cpython_stdlib_functions (<= {args.max_len} tokens, {int(lengths.sum())} "
        f"tokens), budget {args.budget:g} padded tokens, torch {torch.__version__}, 1 thread, "
        "each mode in a fresh process with an empty inductor cache\n"
    )
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
    rows = []
    for i, mode in enumerate(modes(args.ks)):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            argv = [sys.executable, __file__, "--mode", str(i), "--samples", str(args.samples)]
            argv += [
                "--budget",
                str(args.budget),
                "--max-len",
                str(args.max_len),
                "--ks",
                *map(str, args.ks),
            ]
            out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
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
        print(" | ".join(rows[-1]), flush=True)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    print("\n| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


if __name__ == "__main__":
    main()
