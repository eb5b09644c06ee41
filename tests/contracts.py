"""Invariants every plan must satisfy, shared by the test modules (STYLE 13).

:func:`check_plan` recomputes everything it checks from the sizes and the cost model alone, one
batch at a time (through :mod:`reference`), never from the plan's own per-batch arrays. The
plan-quality metrics at the bottom come from ``fitbatch.plan._metrics`` (tests never import
``bench/``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import reference as R

import fitbatch

# Every strategy by name, plus instances with small pools so that small inputs cross several
# pool (segment) borders.
STRATEGY_NAMES = ("sequential", "sorted", "pooled", "buckets", "packed")
SMALL_POOL = 64
STRATEGIES: dict[str, Any] = {
    "sequential": "sequential",
    "sorted": "sorted",
    "sorted-desc": fitbatch.Sorted(descending=True),
    "pooled": fitbatch.Pooled(pool_size=SMALL_POOL),
    "pooled-exact": fitbatch.Pooled(pool_size=SMALL_POOL, randomness=None),
    "buckets": "buckets",
    "buckets-fixed": fitbatch.Buckets(boundaries=(4.0, 16.0, 64.0)),
    "packed": fitbatch.Packed(pool_size=SMALL_POOL),
}


def _user_cost(count: np.ndarray, max_size: np.ndarray, sum_size: np.ndarray) -> np.ndarray:
    """A monotone user cost: padded tokens plus a quarter of the real ones plus 2 per sample."""
    m = np.asarray(max_size, dtype=np.float64)
    s = np.asarray(sum_size, dtype=np.float64)
    if m.ndim > 1:  # D-dimensional sizes: reduce like a padded volume
        m, s = m.prod(axis=-1), s.sum(axis=-1)
    return count * (m + 2.0) + 0.25 * s


COSTS: dict[str, Any] = {
    "sum": fitbatch.SumCost(),
    "padded": fitbatch.PaddedCost(),
    "polynomial": fitbatch.PaddedPolynomial(fixed=5.0, linear=1.0, per_token=1.0, quadratic=0.01),
    "function": fitbatch.costs.FunctionCost(_user_cost),
}

# Float sums are rounded differently by the kernels (prefix sums) and by measure_batches
# (reduceat), so for non-integral sizes a batch may exceed the budget by a few ulps.
FLOAT_SLACK = 1e-12


def sample_cost(model: Any, sizes: Sequence[Any]) -> list[float]:
    """Cost of each sample alone, one at a time."""
    cost = R.model_cost(model)
    return [cost(1, x, x) for x in sizes]


def check_plan(
    plan: fitbatch.BatchPlan,
    sizes: Any,
    budget: float,
    model: Any,
    *,
    oversized: str = "error",
    max_batch_size: int | None = None,
    multiple: int = 1,
    max_unaligned: int | None = None,
    exact: bool | None = None,
) -> None:
    """Assert the contract of one epoch's plan over ``sizes`` (a numpy (n,) or (n, D) array).

    * every index appears exactly once among the batches, ``plan.skipped`` and ``plan.dropped``;
    * ``plan.skipped`` is exactly the samples over budget alone when ``oversized="skip"``;
    * every batch costs at most ``budget``, except a lone oversized sample under "single";
    * ``plan.costs`` equals the cost model evaluated on each batch from scratch;
    * ``max_batch_size`` holds; at most ``max_unaligned`` batches of >= ``multiple`` samples are
      not a multiple of it (the batches that ended a segment);
    * indexing, iteration, ``to_lists`` and ``order``/``offsets`` agree;
    * the statistics agree with independently computed values.
    """
    values = np.asarray(sizes, dtype=np.float64)
    n = values.shape[0]
    py = R.as_python(values)
    cost = R.model_cost(model)
    if exact is None:
        exact = bool(np.all(values == np.floor(values)))
    slack = 0.0 if exact else FLOAT_SLACK * budget

    # --- structure: indexing, iteration and lists agree
    lists = plan.to_lists()
    assert len(lists) == len(plan)
    assert [b.tolist() for b in plan] == lists
    assert [plan[i].tolist() for i in range(len(plan))] == lists
    if len(plan):
        assert plan[-1].tolist() == lists[-1]
        assert plan[-len(plan)].tolist() == lists[0]
    assert all(b.dtype == np.int64 for b in plan)
    assert plan.offsets.tolist() == np.concatenate([[0], np.cumsum([len(b) for b in lists])]).tolist()
    assert plan.order.tolist() == [i for b in lists for i in b]
    assert all(len(b) >= 1 for b in lists), "no empty batch"

    # --- coverage: each index exactly once, among batches, skipped and dropped
    placed = [i for b in lists for i in b]
    skipped = plan.skipped.tolist()
    dropped = plan.dropped.tolist()
    everything = sorted(placed + skipped + dropped)
    assert everything == list(range(n)), "every sample exactly once (placed, skipped or dropped)"
    alone = sample_cost(model, py)
    over = [i for i in range(n) if alone[i] > budget]
    if oversized == "skip":
        assert sorted(skipped) == over
    else:
        assert skipped == []
    if oversized == "error":
        assert over == []

    # --- budget, costs, caps
    costs = [R.batch_cost(b, py, cost) for b in lists]
    np.testing.assert_allclose(plan.costs, costs, rtol=1e-12, atol=0)
    lone_over = 0
    for b, c in zip(lists, costs, strict=True):
        if len(b) == 1 and alone[b[0]] > budget:
            assert oversized == "single", f"lone oversized sample {b} under oversized={oversized!r}"
            lone_over += 1
            continue
        assert c <= budget + slack, f"batch {b[:8]}... costs {c!r} > budget {budget!r}"
        if max_batch_size is not None:
            assert len(b) <= max_batch_size
    if max_unaligned is not None and multiple > 1:
        unaligned = [len(b) for b in lists if len(b) >= multiple and len(b) % multiple]
        assert len(unaligned) <= max_unaligned, f"batch sizes not a multiple of {multiple}: {unaligned[:10]}"

    # --- statistics, recomputed
    st = plan.stats()
    assert st.n_batches == len(plan)
    assert st.n_samples == len(placed)
    assert st.skipped == len(skipped)
    assert st.dropped == len(dropped)
    if not dropped:
        assert st.dropped_batches == 0
    assert st.oversized_batches == sum(1 for c in costs if c > budget)
    if lone_over and exact:
        assert st.oversized_batches == lone_over
    real = padded = 0.0
    for b in lists:
        rows = values[b]
        if values.ndim == 1:
            real += float(rows.sum())
            padded += len(b) * float(rows.max())
        else:
            real += float(np.prod(rows, axis=1).sum())
            padded += len(b) * float(np.prod(rows.max(axis=0)))
    expected_eff = real / padded if padded > 0 else 1.0
    assert math.isclose(st.padding_efficiency, expected_eff, rel_tol=1e-9, abs_tol=1e-12)
    if lists:
        assert math.isclose(st.mean_fill, sum(costs) / len(costs) / budget, rel_tol=1e-9)
        assert math.isclose(st.max_fill, max(costs) / budget, rel_tol=1e-9)
    else:
        assert st.mean_fill == 0.0 and st.max_fill == 0.0
    if model.name in ("sum", "padded") and exact and model.weights is None:
        # a sample over the budget fills one batch alone: one budget's worth of the bound
        total = sum(min(alone[i], budget) for i in placed)
        # a plan that places samples needs a batch even when they cost nothing
        assert st.lower_bound == (max(1, math.ceil(total / budget)) if placed else 0)
    assert st.lower_bound <= st.n_batches


def plan_hash(plan: fitbatch.BatchPlan) -> str:
    """A digest of the batches (order and boundaries) and of the left-out samples."""
    h = hashlib.sha256()
    for arr in (plan.order, plan.offsets, plan.skipped, plan.dropped):
        h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()


def batch_sets(plan: fitbatch.BatchPlan) -> set[tuple[int, ...]]:
    """The batches as a set of sorted tuples (ignores batch order and order inside batches)."""
    return {tuple(sorted(b.tolist())) for b in plan}



def load_script(path: Path, name: str) -> Any:
    """Import a worker script (run by subprocesses) as a module, to call its functions in-process."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def run_processes(commands: list[list[str]], timeout: float) -> list[str]:
    """Run one process per command at once (one thread each, this sys.path); all must exit 0.

    Returns their combined stdout/stderr; a process still running after a failure is killed.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd in commands
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(logs)
    return logs


# --------------------------------------------------------------------------- quality metrics
# The library's own metrics (fitbatch.plan._metrics), under the names the tests use.


@contextlib.contextmanager
def jit_mode(mode: str) -> Iterator[None]:
    """``FITBATCH_JIT=mode`` inside the block (``"0"`` numpy only, ``"1"`` compiled at once)."""
    before = os.environ.get("FITBATCH_JIT")
    os.environ["FITBATCH_JIT"] = mode
    try:
        yield
    finally:
        if before is None:
            del os.environ["FITBATCH_JIT"]
        else:
            os.environ["FITBATCH_JIT"] = before


from fitbatch.plan._metrics import batch_of_sample as batch_ids  # noqa: E402, F401
from fitbatch.plan._metrics import position_size_correlation as spearman_position_size  # noqa: E402, F401
from fitbatch.plan._metrics import repeat_rate  # noqa: E402, F401
