"""Smoke tests: every training example and ``bench/train.py`` run end to end with tiny arguments.

Each runs in a subprocess with a timeout (a few standard-library files, a few thousand tokens);
optional dependencies (Lightning, ``datasets``) skip their example when absent (the ``integrations``
extra installs them, and CI runs both).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TINY = ["--files", "12", "--vocab", "256", "--max-len", "64", "--budget", "512", "--tokens", "1500"]


def run(args: list[str], timeout: float = 60) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def lm_model() -> Any:
    """``examples/_lm_model.py``, imported without leaving ``examples/`` on ``sys.path``."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import _lm_model
    finally:
        sys.path.remove(str(EXAMPLES))
    return _lm_model


def test_lm_data_and_model_doctests() -> None:
    out = run([sys.executable, "-m", "doctest", str(EXAMPLES / "_lm_data.py"), str(EXAMPLES / "_lm_model.py")])
    assert out == ""


def test_packed_attention_matches_padded() -> None:
    """Block-diagonal packed attention (every backend) equals padded causal attention."""
    import torch

    lm = lm_model()
    torch.manual_seed(0)
    model = lm.TinyLM(lm.LMConfig(vocab=64, dim=16, layers=2, heads=2, max_len=80))
    seqs = [torch.randint(1, 64, (int(n),)) for n in (3, 70, 17, 2, 33, 9)]
    want, n = model(lm.collate_padded(seqs))
    for attention in ("dense", "grouped"):
        got, m = model(lm.collate_packed(seqs), attention)
        assert int(m) == int(n)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    got, _ = model(lm.collate_packed(seqs, pad_to=200), "grouped")  # filler attends only to itself
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_train_lm_all_modes() -> None:
    out = run([sys.executable, "examples/train_lm.py", *TINY, "--threads", "1"])
    for mode in ("fixed", "padded", "packed"):
        assert f"| {mode} |" in out


def test_train_lm_ddp_two_ranks() -> None:
    out = run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "examples/train_lm_ddp.py", *TINY, "--mode", "packed"],
        timeout=90,
    )
    assert "2 rank(s)" in out and "replica weights identical" in out and "| packed |" in out


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")
def test_train_lightning() -> None:
    out = run([sys.executable, "examples/train_lightning.py", *TINY], timeout=90)
    assert "padded:" in out and "held-out loss" in out


@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="datasets is not installed")
def test_train_hf_datasets() -> None:
    out = run([sys.executable, "examples/train_hf_datasets.py", *TINY, "--mode", "packed"], timeout=90)
    assert "packed:" in out and "held-out loss" in out


def test_bench_train(tmp_path: Path) -> None:
    result = tmp_path / "rows.json"
    out = run(
        [sys.executable, "bench/train.py", *TINY, "--threads", "1", "--modes", "fixed,packed,padding-free,lhotse",
         "--out", str(result)],
        timeout=90,
    )
    assert "| mode | real tokens/s |" in out
    rows = {r["mode"]: r for r in json.loads(result.read_text())["rows"]}
    assert rows["fixed"]["real_tokens"] >= 1500 and rows["packed"]["padded_fraction"] == 0.0
    assert rows["packed"]["max_fill"] <= 1.0 and rows["fixed"]["max_fill"] <= 1.0
    # make_varlen_collate gives the model the example's packed batches: the same training run
    assert rows["padding-free"]["heldout_loss"] == pytest.approx(rows["packed"]["heldout_loss"], abs=1e-6)
    assert "tokens_per_s" in rows["lhotse"] or "lhotse" in rows["lhotse"]["error"]


def test_bench_time_to_quality(tmp_path: Path) -> None:
    """The time-to-quality run: an LR sweep, budget modes by rule, equal tokens per step, a plot."""
    prefix = tmp_path / "ttq"
    out = run(
        [
            sys.executable,
            "bench/time_to_quality.py",
            *TINY,
            "--eval-every",
            "500",
            "--eval-tokens",
            "300",
            "--lr-sweep",
            "3e-3,1e-2",
            "--modes",
            "padded",
            "--lr-rules",
            "sqrt,linear",
            "--extra-budgets",
            "256",
            "--out",
            str(prefix),
        ],
        timeout=120,
    )
    assert "| run | lr | tokens/step | time to target (CPU-s) |" in out
    result = json.loads(prefix.with_suffix(".json").read_text())
    runs = {r["name"]: r for r in result["runs"]}
    fixed = [r for r in result["runs"] if r["mode"] == "fixed"]
    assert sorted(r["lr"] for r in fixed) == [3e-3, 1e-2]
    baseline = result["runs"][0]  # the best-rate fixed run comes first
    assert baseline["final_loss"] == min(r["final_loss"] for r in fixed)
    # the budget modes' rates follow the documented rules from the baseline's rate
    ratio = runs["padded, lr linear"]["lr"] / baseline["lr"]
    assert runs["padded, lr sqrt"]["lr"] / baseline["lr"] == pytest.approx(ratio**0.5)
    equal = next(r for r in result["runs"] if r["rule"] == "equal-step")
    assert equal["lr"] == baseline["lr"] and equal["budget"] < 512
    for r in result["runs"]:
        curve = r["curve"]
        assert curve[0]["tokens"] == 0 and curve[-1]["tokens"] >= 1500
        assert all(
            b["tokens"] > a["tokens"] and b["cpu_seconds"] >= a["cpu_seconds"]
            for a, b in zip(curve, curve[1:])
        )
        assert r["eval_cpu_seconds"] > 0  # evaluation is timed apart from training
    targets = [t["loss"] for t in result["meta"]["targets"]]
    assert len(targets) == 2 and set(result["tables"]) == {f"{t:.4f}" for t in targets}
    for target in targets:
        rows = {r["name"]: r for r in result["tables"][f"{target:.4f}"]}
        assert rows[baseline["name"]]["reached"] == (
            min(p["loss"] for p in baseline["curve"]) <= target
        )
        for row in rows.values():
            hit = next((p for p in runs[row["name"]]["curve"] if p["loss"] <= target), None)
            assert row["reached"] == (hit is not None)
            if hit is not None:
                assert (
                    row["tokens_to_target"] == hit["tokens"]
                    and row["steps_to_target"] == hit["steps"]
                )
    # the first default target is reached by the baseline and every budget run
    every = result["tables"][f"{targets[0]:.4f}"]
    assert all(
        r["reached"]
        for r in every
        if r["name"] == baseline["name"] or not r["name"].startswith("fixed")
    )
    assert prefix.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert prefix.with_suffix(".md").read_text().startswith(result["meta"]["date"])


def test_time_to_quality_doctests() -> None:
    assert run([sys.executable, "-m", "doctest", "bench/time_to_quality.py"]) == ""


def test_the_training_docs_equal_step_budget_snippet(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/training.md's "equal tokens per step" budget: its printed line is what it computes."""
    text = (ROOT / "docs" / "training.md").read_text()
    block = text.split("<!-- equal-step-budget -->\n```python\n", 1)[1].split("```", 1)[0]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        namespace: dict[str, object] = {}
        exec(compile(block, "docs/training.md[equal-step-budget]", "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert capsys.readouterr().out.split() == block.rsplit("# ", 1)[1].split()
    import fitbatch

    lengths, budget = namespace["lengths"], namespace["budget"]
    plan = fitbatch.plan_batches(lengths, budget, seed=0)
    # within one 64-token step of the fixed batch's tokens per step, and far below the 4096 cap
    assert abs(lengths.sum() / len(plan) - namespace["per_step"]) < 64 and budget < 1024


def test_train_until_checkpoints_leave_evaluation_off_the_clocks() -> None:
    """``checkpoint`` runs after each ``checkpoint_every`` real tokens; its time is not training time."""
    import time

    import torch

    lm = lm_model()
    torch.manual_seed(0)
    model = lm.TinyLM(lm.LMConfig(vocab=32, dim=8, layers=1, heads=1, max_len=16))
    seqs = [torch.randint(1, 32, (n,)) for n in (10, 6)]  # 16 real tokens, 14 predicted per step

    def batches():  # endless, like data.iterate_batches
        while True:
            yield lm.collate_padded(seqs), 16, 14

    seen: list[tuple[int, int, float]] = []

    def checkpoint(res: lm.TrainResult, consumed: int) -> bool:
        seen.append((consumed, res.steps, res.seconds))
        time.sleep(0.2)  # an "evaluation"
        return False

    t0 = time.perf_counter()
    res = lm.train_until(model, batches(), tokens=160, checkpoint=checkpoint, checkpoint_every=48)
    elapsed = time.perf_counter() - t0
    # after the first step reaching 48, 96, 144 real tokens, and after the last step
    assert [(c, s) for c, s, _ in seen] == [(48, 3), (96, 6), (144, 9), (160, 10)]
    # the four 0.2 s "evaluations" are on the evaluation clock, not the training clock (no
    # comparison of the two clocks: a loaded machine may train slower than it sleeps)
    assert res.steps == 10 and res.eval_seconds >= 0.8 and res.seconds <= elapsed - 0.8
    assert [t for _, _, t in seen] == sorted(t for _, _, t in seen) and seen[-1][2] <= res.seconds
    # returning True stops training at that checkpoint
    stop = lm.train_until(
        model, batches(), tokens=160, checkpoint=lambda r, c: c >= 96, checkpoint_every=48
    )
    assert stop.steps == 6 and stop.real_tokens == 96
