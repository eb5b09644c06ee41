"""Every public name of each seed tool's released API exists in its adapter, with its signature.

The names are those of the released versions (bionemo-size-aware-batching 1.0.0, deep-pipe
0.5.0's ``dpipe.batch_iter``, aistore 2.0.0, equibatch 0.1.3, and the PyTorch-XLA variable batch
size module of the seed document), listed here so that the check runs without the originals.
Where an original is installed (the ``compat-test`` extra plus the ``--no-deps`` installs of the
test command), each callable's parameters are compared with it: same names, kinds and defaults
in the same order; an adapter may only add keyword-only parameters with defaults at the end.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

# (original module, adapter module, names); the adapter module mirrors the original's path
RELEASED = [
    ("bionemo.size_aware_batching.sampler", "fitbatch.compat.bionemo.sampler",
     ["BucketBatchSampler", "Real", "SizeAwareBatchSampler", "size_aware_batching"]),
    ("bionemo.size_aware_batching.utils", "fitbatch.compat.bionemo.utils",
     ["Buckets", "collect_cuda_peak_alloc", "create_buckets"]),
    ("dpipe.batch_iter", "fitbatch.compat.dpipe",
     ["ExpirationPool", "Infinite", "Iterator", "Loky", "Threads", "apply_at", "combine_batches", "combine_pad",
      "combine_to_arrays", "expiration_pool", "load_by_random_id", "multiply", "pad_batch_equal", "random_apply",
      "sample", "sample_args", "unpack_args", "zip_apply"]),
    ("dpipe.batch_iter.pipeline", "fitbatch.compat.dpipe.pipeline",
     ["Infinite", "Iterator", "Loky", "Threads", "combine_batches", "combine_pad", "combine_to_arrays", "wrap_pipeline"]),
    ("dpipe.batch_iter.sources", "fitbatch.compat.dpipe.sources", ["load_by_random_id", "sample"]),
    ("dpipe.batch_iter.utils", "fitbatch.compat.dpipe.utils",
     ["apply_at", "multiply", "pad_batch_equal", "random_apply", "sample_args", "unpack_args", "zip_apply"]),
    ("dpipe.batch_iter.expiration_pool", "fitbatch.compat.dpipe.expiration_pool", ["ExpirationPool", "expiration_pool"]),
    ("aistore.pytorch.dynamic_sampler", "fitbatch.compat.aistore", ["DynamicBatchSampler", "SATURATION_FACTOR"]),
    ("equibatch", "fitbatch.compat.equibatch", ["EquiarealBatchSampler"]),
    (None, "fitbatch.compat.xla_vbs", ["ConstantOptimizer", "CustomSampler", "LinearRuleOptimizer", "RootRuleOptimizer"]),
]
CASES = [pytest.param(orig, ours, name, id=f"{ours}.{name}") for orig, ours, names in RELEASED for name in names]
NEEDS_TORCH = ("bionemo", "aistore", "equibatch", "xla_vbs")


def _adapter(module: str, name: str):
    if any(tool in module for tool in NEEDS_TORCH):
        pytest.importorskip("torch")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(("original", "adapter", "name"), CASES)
def test_the_adapter_has_the_name(original, adapter, name):
    assert _adapter(adapter, name) is not None


def _parameters(obj):
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = list(inspect.signature(target).parameters.values())
    return params[1:] if inspect.isclass(obj) else params


def _default(param):
    value = param.default
    return getattr(value, "__name__", None) if callable(value) else value


@pytest.mark.parametrize(("original", "adapter", "name"), [c for c in CASES if c.values[0] is not None])
def test_the_signature_is_the_originals(original, adapter, name):
    ours = _adapter(adapter, name)
    theirs = getattr(pytest.importorskip(original, reason=f"{original} is not installed (see the README's test command)"), name)
    if not callable(theirs) or not (inspect.isclass(theirs) or inspect.isfunction(theirs)):
        assert type(ours) is type(theirs) and ours == theirs
        return
    mine, orig = _parameters(ours), _parameters(theirs)
    assert [(p.name, p.kind, _default(p)) for p in mine[: len(orig)]] == [(p.name, p.kind, _default(p)) for p in orig]
    for extra in mine[len(orig):]:
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY and extra.default is not inspect.Parameter.empty, extra


def test_every_expected_difference_is_a_line_of_the_migration_guide():
    """The reason of each strict xfail in tests/upstream quotes docs/migrating.md."""
    here = Path(__file__).resolve().parent
    guide = " ".join((here.parents[1] / "docs" / "migrating.md").read_text().split())
    reasons = [r for path in sorted(here.glob("test_*.py")) for r in re.findall(r'docs/migrating\.md: ([^"]+)"', path.read_text())]
    assert len(reasons) >= 3
    for reason in reasons:
        assert reason.rstrip(".") in guide, reason
