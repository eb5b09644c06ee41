"""The public surface: a sorted __all__ whose names resolve, and no torch import on import."""

from __future__ import annotations

import subprocess
import sys

import fitbatch


def test_all_is_sorted_and_resolves():
    assert fitbatch.__all__ == sorted(fitbatch.__all__)
    assert len(set(fitbatch.__all__)) == len(fitbatch.__all__)
    for name in fitbatch.__all__:
        assert getattr(fitbatch, name) is not None, name


def test_core_names_are_public():
    for name in ("plan_batches", "BatchPlan", "BudgetBatchSampler", "PlanStats", "pad_collate", "as_sizes",
                 "PaddedCost", "SumCost", "PaddedPolynomial", "FunctionCost", "Pooled", "Buckets", "Packed",
                 "Sorted", "Sequential", "resolve_cost", "resolve_strategy", "parse_budget", "__version__"):
        assert name in fitbatch.__all__


def test_import_does_not_import_torch():
    code = (
        "import sys, fitbatch\n"
        "plan = fitbatch.plan_batches([3, 1, 2], 4, cost='sum')\n"
        "sys.exit(0 if 'torch' not in sys.modules else 3)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr or "import fitbatch imported torch"


def test_version():
    assert isinstance(fitbatch.__version__, str) and fitbatch.__version__.count(".") >= 1
