"""The public surface: a sorted __all__ whose names resolve, no torch import on import, and an
example in the docstring of every public name."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

import fitbatch

# fitbatch and its public subpackages: every name in their __all__ is public (STYLE 2, 12)
PUBLIC_MODULES = (
    "fitbatch",
    "fitbatch.sizes",
    "fitbatch.index",
    "fitbatch.costs",
    "fitbatch.strategies",
    "fitbatch.plan",
    "fitbatch.epoch",
    "fitbatch.sampler",
    "fitbatch.collate",
    "fitbatch.pipeline",
    "fitbatch.memory",
    "fitbatch.streaming",
    "fitbatch.schedule",
    "fitbatch.cli",
    "fitbatch.steps",
)


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_is_sorted_and_resolves(module_name):
    module = importlib.import_module(module_name)
    public = [n for n in module.__all__ if not n.startswith("_") or n == "__version__"]
    assert public == sorted(public)
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name


def test_the_front_door_is_small_and_holds_the_readme_names():
    assert 25 <= len(fitbatch.__all__) <= 36
    for name in ("plan_batches", "BatchPlan", "BudgetBatchSampler", "PlanStats", "pad_collate", "as_sizes",
                 "PaddedCost", "SumCost", "PaddedPolynomial", "Pooled", "Buckets", "Packed", "Sorted",
                 "Sequential", "make_varlen_collate", "batch_stream", "SizeIndex", "__version__"):
        assert name in fitbatch.__all__


@pytest.mark.parametrize("name", sorted(fitbatch._MOVED))
def test_a_name_that_left_the_front_door_still_works_with_a_warning(name):
    face = importlib.import_module(fitbatch._MOVED[name])
    assert name in face.__all__, f"{name} must be public on {face.__name__}"
    with pytest.warns(DeprecationWarning, match=rf"fitbatch\.{name} moved to {face.__name__}\.{name}.*0\.3\.0"):
        assert getattr(fitbatch, name) is getattr(face, name)


@pytest.mark.parametrize("old", sorted(fitbatch._MOVED_MODULES))
def test_a_module_that_moved_imports_as_its_face_with_a_warning(old):
    code = (
        "import warnings, importlib\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        f"try:\n    importlib.import_module({old!r})\nexcept DeprecationWarning as w:\n    print(w)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"print(importlib.import_module({old!r}).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == [
        f"{old} moved to {fitbatch._MOVED_MODULES[old]} in fitbatch 0.2.0; the old path is removed in 0.3.0",
        fitbatch._MOVED_MODULES[old],
    ]


def test_import_does_not_import_torch():
    code = (
        "import sys, fitbatch\n"
        "plan = fitbatch.plan_batches([3, 1, 2], 4, cost='sum')\n"
        "sys.exit(0 if 'torch' not in sys.modules else 3)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr or "import fitbatch imported torch"


def test_import_leaves_out_what_a_plan_may_not_need():
    """``import fitbatch`` does not load numpy.random (a generator loads it), fractions (exact
    lower bounds load it), numba nor the pattern layout (the histogram path loads it); an
    unshuffled sorted plan of whole sizes draws nothing, lays out no patterns and bounds its
    batch count in integers, so loads none of them either."""
    code = (
        "import sys, numpy, fitbatch\n"
        "later = ('numpy.random', 'fractions', 'numba', 'fitbatch._kernels.pattern_layout')\n"
        "print(*(m in sys.modules for m in later))\n"
        "fitbatch.plan_batches([3, 1, 2, 5], 6, strategy='sorted').to_lists()\n"
        "print(*(m in sys.modules for m in later[:2] + later[3:]))\n"
        "from fitbatch._rng import SeedLike\n"
        "print(numpy.random.SeedSequence in SeedLike.__args__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FITBATCH_JIT"}  # (FITBATCH_JIT=1 loads numba at once)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"] * 7 + ["True"]


@pytest.mark.parametrize(
    ("seed", "expected"),
    [(7, 7), (np.int64(7), 7), (np.random.SeedSequence(9), 9), (0, 0)],
)
def test_resolve_seed_accepts_ints_and_root_seed_sequences(seed, expected):
    from fitbatch._rng import resolve_seed

    assert resolve_seed(seed) == expected and type(resolve_seed(seed)) is int


@pytest.mark.parametrize(
    ("seed", "error"),
    [(True, TypeError), (2.0, TypeError), ("3", TypeError), (-1, ValueError), (np.int8(-2), ValueError),
     (np.random.SeedSequence(1).spawn(1)[0], ValueError)],
)
def test_resolve_seed_refuses_other_seeds(seed, error):
    from fitbatch._rng import resolve_seed

    with pytest.raises(error, match="seed must"):
        resolve_seed(seed)


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
            if name.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if ">>>" not in _own_doc(obj):
                missing[f"{module_name}.{name}"] = obj.__module__
    report = "\n".join(f"  {name} (defined in {where})" for name, where in sorted(missing.items()))
    assert not missing, f"{len(missing)} public names have no >>> example in their docstring:\n{report}"
