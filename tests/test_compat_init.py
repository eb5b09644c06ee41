"""fitbatch.compat: lazy submodules, no torch import where an adapter does not need it, helpers."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fitbatch.compat as compat


@pytest.mark.parametrize("tool", ["aistore", "bionemo", "dpipe", "equibatch"])
def test_importing_an_adapter_does_not_import_torch(tool):
    # Only what the adapter itself adds counts: fitbatch's own imports are its business.
    code = (
        "import sys, fitbatch; before = set(sys.modules); "
        f"import fitbatch.compat.{tool}; "
        "print(sorted(m for m in set(sys.modules) - before if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_submodules_resolve_lazily():
    assert sorted(compat.__all__) == compat.__all__ == list(compat.TOOLS)
    for tool in compat.TOOLS:
        assert getattr(compat, tool).__name__ == f"fitbatch.compat.{tool}"
    with pytest.raises(AttributeError):
        compat.nope  # noqa: B018


def test_every_adapter_exports_what_it_lists():
    for tool in compat.TOOLS:
        module = getattr(compat, tool)
        assert sorted(module.__all__) == module.__all__
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_plan_in_order_maps_back_to_the_given_order():
    order = [7, 3, 9, 1]
    plan = compat.plan_in_order(order, [4, 4, 4, 4], 8)
    assert compat.batches_of(plan, order) == [[7, 3], [9, 1]]
    assert compat.batches_of(plan, ["a", "b", "c", "d"]) == [["a", "b"], ["c", "d"]]
    with pytest.raises(ValueError, match="3 sizes for 4 samples"):
        compat.plan_in_order(order, [1, 2, 3], 8)


def test_measure_names_the_bad_samples():
    with pytest.raises(ValueError, match=r"sizeof .* 1 bad: sample 'b' \(size -1.0\)"):
        compat.measure(["a", "b"], {"a": 1, "b": -1}.__getitem__, "sizeof")
    with pytest.raises(TypeError, match="real numbers, got None"):
        compat.measure([0], lambda i: None, "sizeof")
    with pytest.raises(TypeError, match="real numbers, got '3'"):
        compat.measure([0], lambda i: "3", "sizeof")
    with pytest.raises(TypeError, match="real numbers, got True"):
        compat.measure([0], lambda i: True, "sizeof")
    assert compat.measure([0, 1], [2, 3].__getitem__, "sizeof").integral


def test_the_samplers_are_plan_samplers():
    from fitbatch.compat.aistore import DynamicBatchSampler
    from fitbatch.compat.bionemo import SizeAwareBatchSampler
    from fitbatch.compat.equibatch import EquiarealBatchSampler
    from fitbatch.compat.xla_vbs import CustomSampler
    from fitbatch.sampler._protocol import PlanSampler

    for cls in (DynamicBatchSampler, SizeAwareBatchSampler, EquiarealBatchSampler, CustomSampler):
        assert issubclass(cls, PlanSampler), cls
    ordered = compat.OrderedPlanSampler
    assert issubclass(SizeAwareBatchSampler, ordered) and issubclass(EquiarealBatchSampler, ordered)
