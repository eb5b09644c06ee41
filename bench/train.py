"""Training throughput: fixed batches vs fitbatch's padded and packed budgets vs peer samplers.

The documented GPU run (bf16, ~98 M-parameter decoder, samples up to 2048 tokens):

    python bench/train.py --device cuda --dtype bf16 --model-size 100M --max-len 2048 \\
        --budget 65536 --tokens 20000000

The CPU configuration recorded in BENCHMARKS.md (a few minutes on 2 cores):

    python bench/train.py --device cpu --model-size tiny --max-len 512 --budget 4096 \\
        --tokens 50000 --files 200 --vocab 2048 --threads 1 --repeats 3

Samples are the functions of the running Python's standard library, tokenised (no download;
``examples/_lm_data.py``): a real long-tailed length set, truncated at ``--max-len``. Every
mode trains the same model from the same initialisation on the same number of real
(unpadded) tokens, each in a fresh process, under the same per-step memory budget:

* ``fixed``: the largest fixed batch size whose worst batch fits the budget
  (``largest_safe_batch_size``), shuffled, padded to each batch's longest sample;
* ``padded``: ``BudgetBatchSampler(cost="padded", strategy="pooled")``, padded batches;
* ``packed``: ``BudgetBatchSampler(cost="sum", strategy="packed")``, one row per batch with
  block-diagonal causal attention (varlen: nested tensors / FlashAttention on CUDA,
  length-grouped SDPA on CPU);
* ``padding-free``: the ``packed`` sampler, collated by ``fitbatch.make_varlen_collate``
  (``input_ids``/``position_ids``/``cu_seq_lens_q`` of one ``(1, T)`` row) into the same
  model's varlen attention: the library's collate instead of the example's ``collate_packed``;
* ``lhotse``: lhotse's ``DynamicBucketingSampler`` over dummy cuts whose duration is the
  token length, ``max_duration=budget`` (lhotse budgets the *sum*), padded batches;
* ``speechbrain``: SpeechBrain's ``DynamicBatchSampler(max_batch_length=budget)``, padded
  batches (reported as not available when it does not import).

Printed per mode: real tokens/s, the ratio to ``fixed``, the padded fraction of computed
positions, real tokens per CPU-second of the process (steadier than wall time on a shared
machine), peak memory (CUDA: ``max_memory_allocated``; CPU: the process's peak RSS), the
number of out-of-memory errors (such a batch is skipped and counted), the held-out loss per
predicted token after the same real tokens, and the largest batch cost relative to the budget
(padded tokens / budget; a peer that budgets sums can go over).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import itertools
import json
import multiprocessing as mp
import os
import platform
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import _lm_data as data  # noqa: E402

MODES = ("fixed", "padded", "packed", "padding-free", "lhotse", "speechbrain")
DTYPES = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


# ----------------------------------------------------------------------------- peers


class IndexBatches:
    """A peer sampler's batches as index lists, with ``set_epoch`` and ``len``."""

    def __init__(self, make: Any) -> None:
        self._make, self._epoch = make, 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def __iter__(self) -> Any:
        return iter(self._make(self._epoch))

    def __len__(self) -> int:
        return sum(1 for _ in self._make(self._epoch))


def lhotse_sampler(lengths: np.ndarray, budget: int, seed: int) -> IndexBatches:
    import warnings

    from lhotse import CutSet
    from lhotse.dataset.sampling import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    cuts = CutSet.from_cuts(dummy_cut(i, duration=float(n)) for i, n in enumerate(lengths.tolist()))

    def batches(epoch: int) -> list[list[int]]:
        with warnings.catch_warnings():  # "eagerly read CutSet": expected for in-memory cuts
            warnings.simplefilter("ignore")
            sampler = DynamicBucketingSampler(
                cuts, max_duration=float(budget), shuffle=True, seed=seed
            )
        sampler.set_epoch(epoch)
        return [[int(c.id.rsplit("-", 1)[1]) for c in batch] for batch in sampler]

    return IndexBatches(batches)


def speechbrain_sampler(lengths: np.ndarray, budget: int, seed: int) -> IndexBatches:
    import inspect

    from speechbrain.dataio.sampler import DynamicBatchSampler

    class Rows:  # the sampler reads ``data_ids`` and ``len`` of its dataset
        data_ids = [str(i) for i in range(len(lengths))]

        def __len__(self) -> int:
            return len(lengths)

    params = inspect.signature(DynamicBatchSampler).parameters
    kwargs: dict[str, Any] = {
        "lengths_list": lengths.tolist(),
        "seed": seed,
        "batch_ordering": "random",
    }
    if "num_buckets" in params:
        kwargs["num_buckets"] = 20
    if "left_bucket_length" in params:
        kwargs["left_bucket_length"] = int(lengths.min())
    shuffle = "shuffle" if "shuffle" in params else "shuffle_examples"
    kwargs[shuffle] = True

    def batches(epoch: int) -> list[list[int]]:
        sampler = DynamicBatchSampler(Rows(), budget, **kwargs)
        sampler.set_epoch(epoch)
        return [[int(i) for i in batch] for batch in sampler]

    return IndexBatches(batches)


def make_sampler(mode: str, lengths: np.ndarray, budget: int, seed: int) -> Any:
    if mode == "fixed":
        from fitbatch.plan import largest_safe_batch_size

        size = largest_safe_batch_size(lengths, budget)
        if size != data.fixed_batch_size(lengths, budget):  # the examples' rule is the same
            raise RuntimeError("fixed batch size rules disagree")
    if mode == "padding-free":
        mode = "packed"  # the same plan as ``packed``; only the collate differs
    if mode in data.MODES:
        return data.make_sampler(mode, lengths, budget, seed=seed)
    return {"lhotse": lhotse_sampler, "speechbrain": speechbrain_sampler}[mode](
        lengths, budget, seed
    )


def varlen_batches(sampler: Any, train: list[np.ndarray]) -> Any:
    """``padding-free``: ``make_varlen_collate``'s row as the model's packed ``LMBatch``, endless.

    Yields ``(batch, step real tokens, step predicted tokens)`` like ``data.iterate_batches``.
    """
    import _lm_model as lm
    import torch
    from torch.utils.data import DataLoader

    from fitbatch import make_varlen_collate

    varlen = make_varlen_collate()

    def collate(seqs: list[np.ndarray]) -> Any:
        out = varlen([{"input_ids": s} for s in seqs])
        # the model predicts targets[t] at position t: the next label (-100 at each sample's last token)
        targets = torch.full_like(out["labels"], -100)
        targets[:, :-1] = out["labels"][:, 1:]
        return lm.LMBatch(
            out["input_ids"],
            out["position_ids"],
            targets,
            cu_seqlens=out["cu_seq_lens_q"].long(),
            max_seqlen=out["max_length_q"],
            real_tokens=int(out["input_ids"].shape[1]),
        )

    loader = DataLoader(data.TokenDataset(train), batch_sampler=sampler, collate_fn=collate)
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        totals = sampler.step_totals()
        samples, units = totals.samples, totals.units
        for k, batch in enumerate(loader):
            yield batch, int(units[k]), int(units[k] - samples[k])


# ----------------------------------------------------------------------------- one mode


def load_npz(path: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    z = np.load(path)
    split = lambda key: np.split(z[f"{key}_tokens"], z[f"{key}_offsets"][1:-1])  # noqa: E731
    return split("train"), split("heldout")


def save_npz(path: str, corpus: data.Corpus) -> None:
    arrays = {}
    for key, seqs in (("train", corpus.train), ("heldout", corpus.heldout)):
        arrays[f"{key}_tokens"] = np.concatenate(seqs)
        arrays[f"{key}_offsets"] = np.concatenate([[0], np.cumsum([len(s) for s in seqs])])
    np.savez(path, **arrays)


@dataclass
class Setup:
    """One mode ready to train in this process: data, sampler, model and its endless batches."""

    device: Any
    dtype: Any
    lengths: np.ndarray
    heldout: list[np.ndarray]
    sampler: Any
    plan_s: float
    layout: str
    attention: str
    model: Any
    batches: Any


def prepare(
    mode: str, args: dict[str, Any], corpus_path: str, budget: int | None = None
) -> Setup | dict[str, Any]:
    """Build ``mode``'s sampler (at ``budget``, default ``args["budget"]``), the model and its batches.

    Every mode gets the same initial weights (``args["seed"]``). Returns the row of a peer
    that does not import (``{"mode", "error"}``) instead of raising.
    """
    import _lm_model as lm
    import torch

    torch.set_num_threads(args["threads"])
    device = torch.device(args["device"])
    dtype = getattr(torch, DTYPES[args["dtype"]]) if DTYPES[args["dtype"]] else None
    train, heldout = load_npz(corpus_path)
    lengths = np.asarray([len(s) for s in train], dtype=np.int64)
    budget = args["budget"] if budget is None else budget
    t0 = time.perf_counter()
    try:
        sampler = make_sampler(mode, lengths, budget, args["seed"])
    except ImportError as err:
        return {"mode": mode, "error": f"not importable: {err}"}
    plan_s = time.perf_counter() - t0
    layout = "packed" if mode in ("packed", "padding-free") else "padded"
    attention = lm.resolve_attention(args["attention"], device)
    pad_to = budget if (layout == "packed" and attention == "flex") else None
    torch.manual_seed(args["seed"])
    cfg = lm.LMConfig.named(args["model_size"], vocab=args["vocab"], max_len=args["max_len"])
    model = lm.TinyLM(cfg).to(device)
    if mode == "padding-free":
        batches = varlen_batches(sampler, train)
    else:
        batches = data.iterate_batches(layout, sampler, train, pad_to=pad_to)
    return Setup(
        device, dtype, lengths, heldout, sampler, plan_s, layout, attention, model, batches
    )


def run_mode(
    mode: str, args: dict[str, Any], corpus_path: str, base_tokens_per_step: float
) -> dict[str, Any]:
    """Train one mode in this (fresh) process; returns the row of the table."""
    import _lm_model as lm
    import torch

    s = prepare(mode, args, corpus_path)
    if isinstance(s, dict):
        return s
    n_batches = len(s.sampler)
    lr = lm.mode_lr(
        args["lr"], float(s.lengths.sum()) / n_batches, base_tokens_per_step, args["lr_rule"]
    )
    worst = _worst_fill(s.sampler, s.lengths, args["budget"], s.layout)
    if s.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(s.device)
    res = lm.train_until(
        s.model,
        s.batches,
        tokens=args["tokens"],
        lr=lr,
        device=s.device,
        dtype=s.dtype,
        attention=args["attention"],
    )
    if s.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(s.device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    loss = lm.evaluate(
        s.model, s.heldout, device=s.device, dtype=s.dtype, token_batch=min(args["budget"], 32768)
    )
    return {
        "mode": mode,
        "batches_per_epoch": n_batches,
        "plan_s": s.plan_s,
        "steps": res.steps,
        "real_tokens": res.real_tokens,
        "seconds": res.seconds,
        "tokens_per_s": res.real_tokens / res.seconds,
        "tokens_per_cpu_s": res.real_tokens / max(res.cpu_seconds, 1e-9),
        "padded_fraction": res.padded_fraction,
        "peak_bytes": int(peak),
        "ooms": res.ooms,
        "heldout_loss": loss,
        "lr": lr,
        "max_fill": worst,
        "attention": s.attention if s.layout == "packed" else "sdpa",
        "params": lm.n_params(s.model),
    }


def in_fresh_process(fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a new spawned process: clean peak memory, no allocator or thread state carried over.

    An exception becomes an ``{"error"}`` row, so a failing peer does not lose the other rows.
    """
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        try:
            return pool.submit(fn, *args).result()
        except Exception as err:
            return {"error": f"{type(err).__name__}: {err}"}


def _worst_fill(sampler: Any, lengths: np.ndarray, budget: int, layout: str) -> float:
    """The largest batch cost of epoch 0 as a share of the budget (padded or summed tokens)."""
    sampler.set_epoch(0)
    worst = 0
    for batch in sampler:
        ls = lengths[batch]
        worst = max(worst, int(ls.sum()) if layout == "packed" else len(ls) * int(ls.max()))
    return worst / budget


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--model-size", default="tiny", choices=("tiny", "small", "25M", "100M"))
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--budget", type=int, default=4096, help="tokens per step (padded or summed)")
    p.add_argument("--tokens", type=int, default=60_000, help="real tokens each mode trains on")
    p.add_argument(
        "--files", type=int, default=0, help="standard-library files to tokenise (0: all)"
    )
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument(
        "--lr", type=float, default=None, help="the baseline's (default 3e-3; 6e-4 for 25M/100M)"
    )
    p.add_argument("--lr-rule", choices=("same", "sqrt", "linear"), default="sqrt")
    p.add_argument(
        "--attention", default="auto", choices=("auto", "dense", "flex", "grouped", "njt")
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="runs per mode; the fastest is kept")
    p.add_argument("--out", help="also write the rows as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.lr is None:
        args.lr = 6e-4 if args.model_size in ("25M", "100M") else 3e-3
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = sorted(set(modes) - set(MODES))
    if bad:
        raise SystemExit(f"--modes: unknown {bad}; choose from {', '.join(MODES)}")
    t0 = time.perf_counter()
    corpus = data.load_corpus(
        files=args.files or None, vocab_size=args.vocab, max_len=args.max_len, seed=args.seed
    )
    lengths = corpus.train_lengths
    print(
        f"# {len(lengths)} train functions, {int(lengths.sum())} tokens (median {int(np.median(lengths))}, "
        f"p99 {int(np.percentile(lengths, 99))}, max {int(lengths.max())}); {len(corpus.heldout)} held out; "
        f"tokenised in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    base_tokens_per_step = float(lengths.sum()) / len(
        data.make_sampler("fixed", lengths, args.budget, seed=args.seed)
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "corpus.npz")
        save_npz(path, corpus)
        for mode in modes:
            runs = []
            for _ in range(max(1, args.repeats)):
                runs.append(
                    {
                        "mode": mode,
                        **in_fresh_process(run_mode, mode, vars(args), path, base_tokens_per_step),
                    }
                )
                if "error" in runs[-1]:
                    break
            row = max(runs, key=lambda r: r.get("tokens_per_s", 0.0))
            if len(runs) > 1 and "error" not in row:
                row["tokens_per_s_runs"] = [r["tokens_per_s"] for r in runs]
            rows.append(row)
            print(f"# {mode}: {json.dumps(row)}", flush=True)
    print()
    print(table(rows, args))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    import torch

    device = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"CPU ({os.cpu_count()} cores)"
    )
    params = next((r["params"] for r in rows if "params" in r), 0)
    fixed = next((r for r in rows if r["mode"] == "fixed" and "tokens_per_s" in r), None)
    lines = [
        f"{datetime.date.today()} · {device} · torch {torch.__version__} · Python {platform.python_version()} · "
        f"model {args.model_size} ({params / 1e6:.1f} M parameters), {args.dtype} · budget {args.budget} tokens · "
        f"max length {args.max_len} · {args.tokens} real tokens per mode",
        "",
        "| mode | real tokens/s | vs fixed | tokens/CPU-s | vs fixed | padded fraction | peak memory | OOM "
        "| held-out loss | steps | lr | max cost / budget |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r['error'][:120]} |" + " |" * 11)
            continue
        ratio = f"{r['tokens_per_s'] / fixed['tokens_per_s']:.2f}x" if fixed else "-"
        cpu_ratio = f"{r['tokens_per_cpu_s'] / fixed['tokens_per_cpu_s']:.2f}x" if fixed else "-"
        lines.append(
            f"| {r['mode']} | {r['tokens_per_s']:,.0f} | {ratio} | {r['tokens_per_cpu_s']:,.0f} | {cpu_ratio} | "
            f"{r['padded_fraction']:.3f} | "
            f"{r['peak_bytes'] / 2**20:,.0f} MiB | {r['ooms']} | {r['heldout_loss']:.3f} | {r['steps']} | "
            f"{r['lr']:.2g} | {r['max_fill']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
