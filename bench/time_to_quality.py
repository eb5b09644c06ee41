"""Time to quality: training time until a target held-out loss, fixed batches vs budget batches.

Throughput (``bench/train.py``) counts real tokens per second; this script asks what a user
buys with them: the training time until the model reaches a held-out loss. The reproducible
CPU run recorded in BENCHMARKS.md (under 15 minutes on 2 cores):

    python bench/time_to_quality.py --device cpu --model-size tiny --max-len 512 --budget 4096 \\
        --tokens 240000 --files 200 --vocab 2048 --threads 1 --out bench/results/time_to_quality_cpu

Runs, each in a fresh process, from the same initial weights, on the same samples and the same
learning-rate schedule per real token (linear warm-up over the first 5 % of ``--tokens``, then
cosine to 10 %; ``_lm_model.token_lr``):

1. ``fixed`` at every rate of ``--lr-sweep``: the largest safe fixed batch size (the
   baseline of ``bench/train.py``); the rate with the lowest final held-out loss is the
   baseline ("fixed, best lr");
2. every mode of ``--modes`` (``padded``, ``packed``) at the ``--budget``, with its rate from the
   best baseline rate by each rule of ``--lr-rules``: ``sqrt`` or ``linear`` in real tokens per
   step (``_lm_model.mode_lr``; the rules of ``fitbatch.schedule.GradientAccumulator(lr_rule=)``);
3. ``padded`` at *equal tokens per step*: the budget whose plan carries the fixed batch's real
   tokens per step, at the baseline's rate: the speed-up of removing padding alone, without
   larger steps;
4. ``padded`` at each of ``--extra-budgets`` (``sqrt`` rule): budgets between the two.

Every run evaluates the held-out loss on the same fixed subset of held-out samples
(``--eval-tokens``) after each ``--eval-every`` real tokens; evaluation time is left out of the
training clocks (and reported). Targets are ``--target``, or by default two: the highest final
loss among the baseline and the budget runs (a quality every compared run reaches, so every row
has a time to it) and, stricter, the loss the baseline reaches after ``--target-fraction`` of
its tokens. Per target and run the table gives the training time (wall, and CPU-seconds of the
process: the steadier clock on a shared machine), real tokens and steps to the first
evaluation at or below the target, and the speed-up over the baseline; ``--out PREFIX`` writes
``PREFIX.json``, the tables as ``PREFIX.md`` and the held-out loss against training time and
against tokens as ``PREFIX.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train as tb  # noqa: E402  (bench/train.py: samplers, corpus files, per-mode setup)

data = tb.data


# ----------------------------------------------------------------------------- one run


def eval_subset(heldout: list[np.ndarray], tokens: int) -> list[np.ndarray]:
    """The first held-out samples holding ``tokens`` tokens (all of them if fewer): the same for every run.

    >>> [len(s) for s in eval_subset([np.arange(3), np.arange(5), np.arange(4)], 6)]
    [3, 5]
    """
    if tokens <= 0:
        return list(heldout)
    ends = np.cumsum([len(s) for s in heldout])
    return list(heldout[: int(np.searchsorted(ends, tokens)) + 1])


def run_curve(spec: dict[str, Any], args: dict[str, Any], corpus_path: str) -> dict[str, Any]:
    """Train one run (``spec``: mode, budget, lr) in this process, evaluating on a token schedule.

    Returns the run with its ``curve``: one point per evaluation (real tokens, steps, training
    wall and CPU seconds so far, held-out loss), the first at step 0.
    """
    import _lm_model as lm

    s = tb.prepare(spec["mode"], args, corpus_path, budget=spec["budget"])
    if isinstance(s, dict):
        return {**spec, **s}
    subset = eval_subset(s.heldout, args["eval_tokens"])

    def evaluate() -> float:
        return lm.evaluate(
            s.model, subset, device=s.device, dtype=s.dtype, token_batch=min(spec["budget"], 8192)
        )

    curve = [{"tokens": 0, "steps": 0, "seconds": 0.0, "cpu_seconds": 0.0, "loss": evaluate()}]

    def checkpoint(res: Any, consumed: int) -> bool:
        curve.append(
            {
                "tokens": consumed,
                "steps": res.steps,
                "seconds": res.seconds,
                "cpu_seconds": res.cpu_seconds,
                "loss": evaluate(),
            }
        )
        return res.cpu_seconds >= args["time_cap"] or not np.isfinite(curve[-1]["loss"])

    res = lm.train_until(
        s.model,
        s.batches,
        tokens=args["tokens"],
        lr=spec["lr"],
        device=s.device,
        dtype=s.dtype,
        attention=args["attention"],
        checkpoint=checkpoint,
        checkpoint_every=args["eval_every"],
    )
    return {
        **spec,
        "curve": curve,
        "steps": res.steps,
        "real_tokens": res.real_tokens,
        "seconds": res.seconds,
        "cpu_seconds": res.cpu_seconds,
        "eval_seconds": res.eval_seconds,
        "eval_cpu_seconds": res.eval_cpu_seconds,
        "padded_fraction": res.padded_fraction,
        "tokens_per_step": res.real_tokens / max(res.steps, 1),
        "final_loss": curve[-1]["loss"],
        "params": lm.n_params(s.model),
    }


# ----------------------------------------------------------------------------- reading curves


def first_reach(curve: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation at or below ``target`` (None if the run never got there).

    >>> first_reach([{"loss": 5.0}, {"loss": 3.9}, {"loss": 3.5}], 4.0)
    {'loss': 3.9}
    >>> first_reach([{"loss": 5.0}], 4.0) is None
    True
    """
    return next((p for p in curve if p["loss"] <= target), None)


def loss_at(curve: list[dict[str, Any]], tokens: float) -> float:
    """The held-out loss at the first evaluation after ``tokens`` real tokens (the last if none).

    >>> loss_at([{"tokens": 0, "loss": 7.0}, {"tokens": 90, "loss": 5.0}, {"tokens": 180, "loss": 4.0}], 100)
    4.0
    """
    return next((p["loss"] for p in curve if p["tokens"] >= tokens), curve[-1]["loss"])


def equal_step_budget(lengths: np.ndarray, tokens_per_step: float, budget: int, seed: int) -> int:
    """The padded budget whose plan's real tokens per step are closest to ``tokens_per_step``.

    Searched between the longest sample (the smallest budget that holds every sample) and ``budget``.
    """
    import fitbatch

    candidates = np.unique(np.linspace(int(lengths.max()), budget, 48).astype(np.int64))
    per_step = np.asarray(
        [
            lengths.sum()
            / len(
                fitbatch.plan_batches(lengths, int(b), cost="padded", strategy="pooled", seed=seed)
            )
            for b in candidates
        ]
    )
    return int(candidates[int(np.argmin(np.abs(per_step - tokens_per_step)))])


def summarize(
    runs: list[dict[str, Any]], baseline: dict[str, Any], target: float
) -> list[dict[str, Any]]:
    """Per run: time, tokens and steps to ``target`` and the speed-up over ``baseline`` (both clocks)."""
    base = first_reach(baseline["curve"], target)
    rows = []
    for r in runs:
        row = {k: r[k] for k in ("name", "mode", "budget", "lr", "rule") if k in r}
        if "error" in r:
            rows.append({**row, "error": r["error"]})
            continue
        hit = first_reach(r["curve"], target)
        row.update(
            reached=hit is not None,
            final_loss=r["final_loss"],
            steps=r["steps"],
            real_tokens=r["real_tokens"],
            seconds=r["seconds"],
            cpu_seconds=r["cpu_seconds"],
            padded_fraction=r["padded_fraction"],
            tokens_per_step=r["tokens_per_step"],
            tokens_per_cpu_s=r["real_tokens"] / max(r["cpu_seconds"], 1e-9),
            loss_at_baseline_tokens=loss_at(r["curve"], baseline["real_tokens"]),
        )
        if hit is not None:
            row.update(
                {f"{k}_to_target": hit[k] for k in ("seconds", "cpu_seconds", "tokens", "steps")},
            )
            if base is not None:
                row["speedup_wall"] = base["seconds"] / max(hit["seconds"], 1e-9)
                row["speedup_cpu"] = base["cpu_seconds"] / max(hit["cpu_seconds"], 1e-9)
        rows.append(row)
    return rows


def choose_targets(
    compared: list[dict[str, Any]], baseline: dict[str, Any], args: argparse.Namespace
) -> list[tuple[float, str]]:
    """``--target`` values, or two: the loss every compared run reaches, and the baseline's after a share of its tokens.

    The first is the highest final loss among the baseline and the budget runs (runs that
    diverged are left out), so every row has a time to it; the second, stricter, is the
    baseline's loss after ``--target-fraction`` of ``--tokens``.
    """
    if args.target:
        return [(t, "--target") for t in floats(args.target, "--target")]
    finals = [
        r["final_loss"] for r in compared if "error" not in r and np.isfinite(r["final_loss"])
    ]
    strict = loss_at(baseline["curve"], args.target_fraction * args.tokens)
    return [
        (max(finals), "reached by every run: the highest final loss among them"),
        (strict, f"the best fixed run's loss after {args.target_fraction:g} of its tokens"),
    ]


def table(rows: list[dict[str, Any]], meta: dict[str, Any], target: float, source: str) -> str:
    """The markdown table of ``summarize``'s rows for one target, under a line naming the machine and the run."""
    lines = [
        f"{meta['date']} · {meta['device']} · torch {meta['torch']} · Python {meta['python']} · model "
        f"{meta['model_size']} ({meta['params'] / 1e6:.1f} M parameters) · budget {meta['budget']} tokens · "
        f"up to {meta['tokens']:,} real tokens per run · evaluation every {meta['eval_every']:,} real tokens on "
        f"{meta['eval_samples']} held-out samples ({meta['eval_tokens']:,} tokens) · "
        f"**target held-out loss {target:.3f}** ({source})",
        "",
        "| run | lr | tokens/step | time to target (CPU-s) | speed-up (CPU-s) | time to target (wall s) "
        "| speed-up (wall) | tokens to target | steps to target | final loss | tokens/CPU-s | padded fraction |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['error'][:100]} |" + " |" * 10)
            continue
        if r["reached"]:
            reach = (
                f"{r['cpu_seconds_to_target']:.1f} | {r.get('speedup_cpu', float('nan')):.2f}x | "
                f"{r['seconds_to_target']:.1f} | {r.get('speedup_wall', float('nan')):.2f}x | "
                f"{r['tokens_to_target']:,} | {r['steps_to_target']:,}"
            )
        else:
            reach = (
                f"not reached in {r['cpu_seconds']:.1f} | - | not reached in {r['seconds']:.1f} | - | "
                f"> {r['real_tokens']:,} | > {r['steps']:,}"
            )
        lines.append(
            f"| {r['name']} | {r['lr']:.3g} | {r['tokens_per_step']:,.0f} | {reach} | {r['final_loss']:.3f} | "
            f"{r['tokens_per_cpu_s']:,.0f} | {r['padded_fraction']:.3f} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], targets: list[float], path: str, baseline: str) -> None:
    """Held-out loss against training CPU-seconds and against real tokens, one line per run."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    by_time, by_tokens = fig.subplots(1, 2, sharey=True)
    for r in runs:
        if "curve" not in r:
            continue
        x_cpu = [p["cpu_seconds"] for p in r["curve"]]
        x_tok = [p["tokens"] for p in r["curve"]]
        y = [p["loss"] for p in r["curve"]]
        faint = r["mode"] == "fixed" and r["name"] != baseline
        style = {"lw": 1.0, "alpha": 0.45, "ls": ":"} if faint else {"lw": 1.8}
        by_time.plot(x_cpu, y, label=r["name"], **style)
        by_tokens.plot(x_tok, y, label=r["name"], **style)
    for ax, xlabel in (
        (by_time, "training CPU-seconds (evaluation excluded)"),
        (by_tokens, "real tokens trained"),
    ):
        for target in targets:
            ax.axhline(target, color="black", lw=0.8, ls="--")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    by_time.set_ylabel("held-out loss (nats / token)")
    by_time.set_title("held-out loss vs training time")
    by_tokens.set_title("held-out loss vs real tokens (dashed: targets)")
    by_tokens.legend(fontsize=8)
    losses = [p["loss"] for r in runs if "curve" in r for p in r["curve"] if np.isfinite(p["loss"])]
    if losses:
        by_time.set_ylim(min(losses) - 0.1, min(max(losses), max(targets) + 2.5))
    fig.savefig(path, dpi=110)


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(tb.DTYPES), default="fp32")
    p.add_argument("--model-size", default="tiny", choices=("tiny", "small", "25M", "100M"))
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--budget", type=int, default=4096, help="tokens per step (padded or summed)")
    p.add_argument(
        "--tokens", type=int, default=240_000, help="real tokens per run, the schedule's horizon"
    )
    p.add_argument(
        "--files", type=int, default=200, help="standard-library files to tokenise (0: all)"
    )
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--modes", default="padded,packed", help="budget modes to time")
    p.add_argument(
        "--lr-sweep", default="1.5e-3,3e-3,6e-3,1.2e-2", help="the fixed baseline's rates"
    )
    p.add_argument(
        "--lr-rules",
        default="sqrt,linear",
        help="rules from the baseline's rate to a budget mode's",
    )
    p.add_argument(
        "--no-equal-step",
        action="store_true",
        help="skip padded at the fixed batch's tokens per step",
    )
    p.add_argument(
        "--extra-budgets",
        default="1024",
        help="padded at these budgets too (sqrt rule); '' for none",
    )
    p.add_argument(
        "--target",
        default=None,
        help="held-out losses to reach, comma-separated (default: two, see the docstring)",
    )
    p.add_argument(
        "--target-fraction",
        type=float,
        default=0.5,
        help="default target: the baseline's loss after this share of --tokens",
    )
    p.add_argument("--eval-every", type=int, default=6000, help="real tokens between evaluations")
    p.add_argument(
        "--eval-tokens", type=int, default=6000, help="held-out tokens evaluated (0: all)"
    )
    p.add_argument(
        "--time-cap", type=float, default=300.0, help="training CPU-seconds per run at most"
    )
    p.add_argument(
        "--attention", default="auto", choices=("auto", "dense", "flex", "grouped", "njt")
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write PREFIX.json, PREFIX.md (table) and PREFIX.png (plot)")
    return p.parse_args(argv)


def floats(text: str, name: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{name}: expected comma-separated numbers, got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    import _lm_model as lm

    args = parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    rules = [r.strip() for r in args.lr_rules.split(",") if r.strip()]
    if set(modes) - {"padded", "packed"} or set(rules) - set(lm.LR_RULES):
        raise SystemExit(
            f"--modes from padded,packed and --lr-rules from {','.join(lm.LR_RULES)}; got {modes}, {rules}"
        )
    sweep = floats(args.lr_sweep, "--lr-sweep")
    t_start = time.perf_counter()
    corpus = data.load_corpus(
        files=args.files or None, vocab_size=args.vocab, max_len=args.max_len, seed=args.seed
    )
    lengths = corpus.train_lengths
    base_per_step = float(lengths.sum()) / len(
        data.make_sampler("fixed", lengths, args.budget, seed=args.seed)
    )
    cfg = vars(args)
    runs: list[dict[str, Any]] = []

    def launch(name: str, mode: str, budget: int, lr: float, rule: str) -> dict[str, Any]:
        spec = {"name": name, "mode": mode, "budget": budget, "lr": lr, "rule": rule}
        run = {**spec, **tb.in_fresh_process(run_curve, spec, cfg, path)}
        runs.append(run)
        done = (
            run.get("error")
            or f"final loss {run['final_loss']:.3f}, {run['cpu_seconds']:.0f} CPU-s"
        )
        print(f"# {name} (lr {lr:.3g}, budget {budget}): {done}", flush=True)
        return run

    def per_step(mode: str, budget: int) -> float:
        return float(lengths.sum()) / len(data.make_sampler(mode, lengths, budget, seed=args.seed))

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "corpus.npz")
        tb.save_npz(path, corpus)
        fixed = [launch(f"fixed lr {lr:g}", "fixed", args.budget, lr, "sweep") for lr in sweep]
        ok = [r for r in fixed if "error" not in r and np.isfinite(r["final_loss"])]
        if not ok:
            raise SystemExit("every fixed-batch run failed; see the lines above")
        baseline = min(ok, key=lambda r: r["final_loss"])
        baseline["name"] = f"fixed, best lr ({baseline['lr']:g})"
        best = baseline["lr"]
        for mode in modes:
            for rule in rules:
                lr = lm.mode_lr(best, per_step(mode, args.budget), base_per_step, rule)
                launch(f"{mode}, lr {rule}", mode, args.budget, lr, rule)
        if not args.no_equal_step:
            b = equal_step_budget(lengths, base_per_step, args.budget, args.seed)
            launch(f"padded, equal tokens/step (budget {b})", "padded", b, best, "equal-step")
        for b in (int(v) for v in floats(args.extra_budgets, "--extra-budgets")):
            lr = lm.mode_lr(best, per_step("padded", b), base_per_step, "sqrt")
            launch(f"padded, budget {b}, lr sqrt", "padded", b, lr, "sqrt")
    compared = [baseline] + [r for r in runs if r["mode"] != "fixed"]
    targets = choose_targets(compared, baseline, args)
    order = [baseline] + [r for r in runs if r is not baseline]
    subset = eval_subset(corpus.heldout, args.eval_tokens)
    import torch

    meta = {
        "date": str(datetime.date.today()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"CPU ({os.cpu_count()} cores)",
        "model_size": args.model_size,
        "params": next((r["params"] for r in runs if "params" in r), 0),
        "budget": args.budget,
        "tokens": args.tokens,
        "eval_every": args.eval_every,
        "eval_samples": len(subset),
        "eval_tokens": int(sum(len(s) for s in subset)),
        "targets": [{"loss": t, "source": src} for t, src in targets],
        "total_seconds": time.perf_counter() - t_start,
    }
    tables = {f"{t:.4f}": summarize(order, baseline, t) for t, _ in targets}
    text = "\n\n".join(table(tables[f"{t:.4f}"], meta, t, src) for t, src in targets)
    print()
    print(text)
    print(f"\n# whole run: {meta['total_seconds']:.0f} s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.json").write_text(
            json.dumps({"args": cfg, "meta": meta, "tables": tables, "runs": order}, indent=1)
        )
        Path(f"{args.out}.md").write_text(text + "\n")
        plot(order, [t for t, _ in targets], f"{args.out}.png", baseline["name"])


if __name__ == "__main__":
    main()
