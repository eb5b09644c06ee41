"""fitbatch.steps.partition_local: each rank splits its own sequences; one all-reduce agrees.

Real ranks (``tests/distributed/steps_worker.py``, gloo on CPU, a timeout on every wait) with very
different loads (600 sequences, 40, one): every rank gets the same micro-batch count, the
count no rank can do with fewer, the cap on every micro-batch, every local sequence exactly once,
and the same totals; a rank whose input is refused raises on every rank instead of hanging.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from contracts import run_processes

from fitbatch.steps import partition_local

pytest.importorskip("torch")
WORKER = Path(__file__).resolve().parent / "distributed" / "steps_worker.py"
sys.path.insert(0, str(WORKER.parent))
from steps_worker import local_sizes  # noqa: E402

WORKLOAD = staticmethod(lambda L: 24576 * L + L**2)


def run(case: str, world: int, tmp_path: Path) -> list[dict]:
    store = f"file://{tmp_path / f'store-{case}'}"
    run_processes([[sys.executable, str(WORKER), "--init", store, "--world", str(world), "--rank", str(r),
                    "--out", str(tmp_path), "--case", case] for r in range(world)], timeout=120)
    return [json.loads((tmp_path / f"steps-{case}-rank{r}.json").read_text()) for r in range(world)]


def own_count(sizes, **kw) -> int:
    """The count one rank needs alone (no process group: this process only)."""
    return partition_local(sizes, 8192, weights=WORKLOAD, **kw).n_micro


@pytest.mark.parametrize("world", [2, 3])
def test_uneven_ranks_agree_on_one_count(world, tmp_path) -> None:
    runs = run("uneven", world, tmp_path)
    m = runs[0]["n_micro"]
    assert all(r["n_micro"] == m for r in runs)
    assert m == max(own_count(local_sizes("uneven", r)) for r in range(world))
    assert m >= math.ceil(sum(local_sizes("uneven", 0)) / 8192)
    for rank, r in enumerate(runs):
        sizes = np.array(r["sizes"])
        assert r["ranks"] == [rank] and r["world"] == world and len(r["batches"]) == m
        assert sorted(i for b in r["batches"] for i in b) == list(range(sizes.size))
        assert all(sizes[b].sum() <= 8192 for b in r["batches"])
        if sizes.size <= 1:  # a rank with one sequence (or none) runs empty micro-batches
            assert sum(1 for b in r["batches"] if not b) == m - sizes.size
    totals = [sum(len(r["batches"][j]) for r in runs) for j in range(m)]
    tokens = [sum(np.array(r["sizes"])[r["batches"][j]].sum() for r in runs) for j in range(m)]
    for r in runs:  # the same totals and workloads on every rank, over all ranks
        assert r["step_samples"] == totals
        assert r["step_tokens"] == pytest.approx(tokens)
        assert r["step_loss_tokens"] == pytest.approx([sum((np.array(x["sizes"]) // 2)[x["batches"][j]].sum()
                                                           for x in runs) for j in range(m)])
        assert r["workload"] == runs[0]["workload"] and r["efficiency"] == runs[0]["efficiency"]
        assert r["efficiency"] <= r["efficiency_bound"] * (1 + 1e-12)  # this rank's bound bounds the step
        assert r["n_empty"] == sum(1 for x in runs for b in x["batches"] if not b)
        assert r["lower_bound"] == max(math.ceil(sum(local_sizes("uneven", q)) / 8192) for q in range(world))


def test_a_multiple_and_a_floor_hold_on_every_rank(tmp_path) -> None:
    runs = run("multiple", 3, tmp_path)
    m = runs[0]["n_micro"]
    own = max(own_count(local_sizes("multiple", r)) for r in range(3))
    assert m == max(8, 4 * math.ceil(own / 4)) and all(r["n_micro"] == m for r in runs)


def test_oversized_singles_are_counted_over_all_ranks(tmp_path) -> None:
    runs = run("oversized", 2, tmp_path)
    sizes = np.array(runs[1]["sizes"])
    assert [3] in runs[1]["batches"] and sizes[3] > 8192
    assert all(r["n_micro"] == runs[0]["n_micro"] for r in runs)


def test_a_refused_input_raises_on_every_rank(tmp_path) -> None:
    runs = run("refused", 3, tmp_path)
    assert runs[2]["error"].startswith("ValueError: 1 sequence cost more than budget=8192")
    for r in runs[:2]:
        assert r["error"].startswith("RuntimeError: partition_local: rank 2 (or more) refused its input")


def test_without_a_process_group_it_plans_this_process() -> None:
    p = partition_local([7] * 8, 8)
    assert p.world == 1 and p.ranks == (0,) and p.n_micro == 8 and p.lower_bound == 8
    with pytest.raises(IndexError, match="rank 1 is not held here"):
        p[1]
