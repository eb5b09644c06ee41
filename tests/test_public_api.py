"""The public surface: a sorted __all__ whose names resolve, no torch import on import, and an
example in the docstring of every public name."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import fitbatch

# fitbatch and its public subpackages: every name in their __all__ is public (STYLE 2, 12)
PUBLIC_MODULES = (
    "fitbatch",
    "fitbatch.sizes",
    "fitbatch.index",
    "fitbatch.pipeline",
    "fitbatch.memory",
    "fitbatch.streaming",
    "fitbatch.schedule",
    "fitbatch.steps",
)


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


def _own_doc(obj: object) -> str:
    """The object's own docstring, cleaned: not one inherited from a base class."""
    own = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(own) if isinstance(own, str) else ""


def test_every_public_name_has_an_example():
    """Every public class and function has a ``>>>`` example in its own docstring (STYLE 12).

    Constants, tuples of names and type aliases (``__version__``, ``SizesLike``, ``LR_RULES``)
    have no docstring of their own and are skipped.
    """
    missing: dict[str, str] = {}
    seen: set[int] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isroutine(obj)) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if ">>>" not in _own_doc(obj):
                missing[f"{module_name}.{name}"] = obj.__module__
    report = "\n".join(f"  {name} (defined in {where})" for name, where in sorted(missing.items()))
    assert not missing, f"{len(missing)} public names have no >>> example in their docstring:\n{report}"
