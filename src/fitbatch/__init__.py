"""fitbatch: training batches that fit a memory budget instead of a fixed sample count.

The front door holds what a user of the README needs: the planner, the sampler, the collates,
the cost and strategy names, the stream, the size index, the memory tools and the step
partitioner. Everything else lives in the face of the package named after its concept:
``fitbatch.sizes``, ``fitbatch.index``, ``fitbatch.costs``, ``fitbatch.strategies``,
``fitbatch.plan``, ``fitbatch.epoch``, ``fitbatch.sampler``, ``fitbatch.collate``,
``fitbatch.streaming``, ``fitbatch.schedule``, ``fitbatch.pipeline``, ``fitbatch.memory``,
``fitbatch.compat``, ``fitbatch.integrations`` (``docs/architecture.md`` draws the layers).

>>> import fitbatch
>>> plan = fitbatch.plan_batches([12, 3, 7, 9, 4, 15], 24, cost="padded", strategy="sorted")
>>> plan.to_lists()
[[1, 4, 2], [3, 0], [5]]
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import TYPE_CHECKING, Any

from fitbatch._lazy import exports
from fitbatch.costs import CostModel, Limits, PaddedCost, PaddedPolynomial, SumCost
from fitbatch.plan import BatchPlan, PlanStats, plan_batches
from fitbatch.sizes import Sizes, as_sizes
from fitbatch.strategies import Buckets, Packed, Pooled, Sequential, Sorted

if TYPE_CHECKING:  # loaded on first use below: a plan needs none of them (some import torch)
    from fitbatch.collate import (
        PaddedBatch,
        check_budget,
        make_hf_collate,
        make_pad_collate,
        make_varlen_collate,
        pad_collate,
        varlen_collate,
    )
    from fitbatch.index import SizeIndex, build_size_index
    from fitbatch.memory import OOMGuard, calibrate
    from fitbatch.sampler import BudgetBatchSampler
    from fitbatch.steps import cp_shard, partition, partition_local
    from fitbatch.streaming import batch_stream

__version__ = "0.2.0"

#: front-door names loaded on first use: ``import fitbatch`` imports only what a plan needs
_LAZY = {
    "BudgetBatchSampler": "fitbatch.sampler",
    "OOMGuard": "fitbatch.memory",
    "PaddedBatch": "fitbatch.collate",
    "SizeIndex": "fitbatch.index",
    "batch_stream": "fitbatch.streaming",
    "build_size_index": "fitbatch.index",
    "calibrate": "fitbatch.memory",
    "check_budget": "fitbatch.collate",
    "cp_shard": "fitbatch.steps",
    "make_hf_collate": "fitbatch.collate",
    "make_pad_collate": "fitbatch.collate",
    "make_varlen_collate": "fitbatch.collate",
    "pad_collate": "fitbatch.collate",
    "partition": "fitbatch.steps",
    "partition_local": "fitbatch.steps",
    "varlen_collate": "fitbatch.collate",
}

#: names that left the front door in 0.2.0: where they live now (removed from here in 0.3.0)
_MOVED = {
    "BatchMemoryModel": "fitbatch.memory",
    "BatchSizeSchedule": "fitbatch.schedule",
    "BatchStream": "fitbatch.streaming",
    "EqualSteps": "fitbatch.streaming",
    "Fixed": "fitbatch.strategies",
    "FunctionCost": "fitbatch.costs",
    "GradientAccumulator": "fitbatch.schedule",
    "Infinite": "fitbatch.pipeline",
    "MicroBatchInfo": "fitbatch.schedule",
    "PlanOptions": "fitbatch.plan",
    "ScheduledBatchSampler": "fitbatch.schedule",
    "SizeMemoryModel": "fitbatch.memory",
    "StepTotals": "fitbatch.sampler",
    "Strategy": "fitbatch.strategies",
    "StreamDataset": "fitbatch.streaming",
    "StreamShard": "fitbatch.streaming",
    "StreamSummary": "fitbatch.streaming",
    "WindowedBatchSampler": "fitbatch.sampler",
    "block_causal_mask": "fitbatch.collate",
    "collect_peak_memory": "fitbatch.memory",
    "document_block_mask": "fitbatch.collate",
    "epoch_repeat_rate": "fitbatch.plan",
    "equal_steps": "fitbatch.streaming",
    "fixed_size_plan": "fitbatch.plan",
    "from_array": "fitbatch.sizes",
    "from_dataset": "fitbatch.sizes",
    "from_files": "fitbatch.sizes",
    "from_source": "fitbatch.sizes",
    "from_tokenizer": "fitbatch.sizes",
    "largest_safe_batch_size": "fitbatch.plan",
    "list_files": "fitbatch.sizes",
    "measure_peak": "fitbatch.memory",
    "parse_budget": "fitbatch.costs",
    "per_chunk": "fitbatch.streaming",
    "pick_shape": "fitbatch.collate",
    "position_size_correlation": "fitbatch.plan",
    "repeat_rate": "fitbatch.plan",
    "resolve_cost": "fitbatch.costs",
    "resolve_strategy": "fitbatch.strategies",
}

#: modules that became packages' private parts in 0.2.0: the face that holds their public names
_MOVED_MODULES = {
    "fitbatch.baseline": "fitbatch.plan",
    "fitbatch.distributed": "fitbatch.epoch",
    "fitbatch.metrics": "fitbatch.plan",
    "fitbatch.options": "fitbatch.plan",
    "fitbatch.resume": "fitbatch._state",
    "fitbatch.stats": "fitbatch.plan",
    "fitbatch.windowed": "fitbatch.sampler",
}


def _moved(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new} in fitbatch 0.2.0; the old path is removed in 0.3.0", DeprecationWarning, stacklevel=3)


#: the package faces, loaded on first use as attributes (``fitbatch.schedule.GradientAccumulator``)
_PACKAGES = frozenset({
    "cli", "collate", "compat", "costs", "epoch", "index", "integrations", "memory", "pipeline", "plan", "sampler",
    "schedule", "sizes", "steps", "strategies", "streaming",
})


_lazy_getattr, _lazy_dir = exports(__name__, _LAZY, globals())


def __getattr__(name: str) -> Any:
    # importing torch takes seconds: numpy-only users of the planner never pay for it
    if name in _PACKAGES:
        return importlib.import_module(f"fitbatch.{name}")
    if name in _LAZY:
        return _lazy_getattr(name)
    if name in _MOVED:
        _moved(f"fitbatch.{name}", f"{_MOVED[name]}.{name}")
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'fitbatch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(_lazy_dir()) | _PACKAGES)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import fitbatch.distributed`` (a module before 0.2.0) gives its package face, with a warning."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        _moved(spec.name, _MOVED_MODULES[spec.name])
        return importlib.import_module(_MOVED_MODULES[spec.name])

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the module is the face it moved to."""


sys.meta_path.append(_MovedModules())

__all__ = [
    "BatchPlan",
    "Buckets",
    "BudgetBatchSampler",
    "CostModel",
    "Limits",
    "OOMGuard",
    "Packed",
    "PaddedBatch",
    "PaddedCost",
    "PaddedPolynomial",
    "PlanStats",
    "Pooled",
    "Sequential",
    "SizeIndex",
    "Sizes",
    "Sorted",
    "SumCost",
    "__version__",
    "as_sizes",
    "batch_stream",
    "build_size_index",
    "calibrate",
    "check_budget",
    "cp_shard",
    "make_hf_collate",
    "make_pad_collate",
    "make_varlen_collate",
    "pad_collate",
    "partition",
    "partition_local",
    "plan_batches",
    "varlen_collate",
]
