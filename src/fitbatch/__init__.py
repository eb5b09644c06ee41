"""fitbatch: training batches that fit a memory budget instead of a fixed sample count.

The whole API is importable from here. Six namespaces group the rest of what is public:
``fitbatch.sizes`` (sizes from columns, datasets, files), ``fitbatch.streaming`` (streams of
unknown length), ``fitbatch.schedule`` (batch-size schedules, gradient accumulation),
``fitbatch.pipeline`` (background batch iterators), ``fitbatch.memory`` (peak memory, memory
models, OOM guard) and ``fitbatch.compat`` (the seed tools' APIs). ``docs/architecture.md``
says which module owns what.

>>> import fitbatch
>>> plan = fitbatch.plan_batches([12, 3, 7, 9, 4, 15], 24, cost="padded", strategy="sorted")
>>> plan.to_lists()
[[1, 4, 2], [3, 0], [5]]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitbatch._plan_sampler import StepTotals
from fitbatch._validate import parse_budget
from fitbatch.baseline import fixed_size_plan, largest_safe_batch_size
from fitbatch.collate import (
    PaddedBatch,
    block_causal_mask,
    document_block_mask,
    make_hf_collate,
    make_pad_collate,
    make_varlen_collate,
    pad_collate,
    pick_shape,
    varlen_collate,
)
from fitbatch.costs import (
    CostModel,
    FunctionCost,
    Limits,
    PaddedCost,
    PaddedPolynomial,
    SumCost,
    resolve_cost,
)
from fitbatch.index import SizeIndex, build_size_index
from fitbatch.memory import (
    BatchMemoryModel,
    OOMGuard,
    SizeMemoryModel,
    calibrate,
    collect_peak_memory,
    measure_peak,
)
from fitbatch.metrics import epoch_repeat_rate, position_size_correlation, repeat_rate
from fitbatch.options import PlanOptions
from fitbatch.plan import BatchPlan, plan_batches
from fitbatch.sizes import (
    Sizes,
    as_sizes,
    from_array,
    from_dataset,
    from_files,
    from_source,
    from_tokenizer,
    list_files,
)
from fitbatch.stats import PlanStats
from fitbatch.strategies import (
    Buckets,
    Fixed,
    Packed,
    Pooled,
    Sequential,
    Sorted,
    Strategy,
    resolve_strategy,
)

if TYPE_CHECKING:  # imported lazily below: these subclass or import torch
    from fitbatch.pipeline import Infinite
    from fitbatch.sampler import BudgetBatchSampler
    from fitbatch.schedule import (
        BatchSizeSchedule,
        GradientAccumulator,
        MicroBatchInfo,
        ScheduledBatchSampler,
    )
    from fitbatch.streaming import (
        BatchStream,
        EqualSteps,
        StreamDataset,
        StreamShard,
        StreamSummary,
        batch_stream,
        equal_steps,
        per_chunk,
    )
    from fitbatch.windowed import WindowedBatchSampler

__version__ = "0.2.0"


_LAZY = {
    "BatchSizeSchedule": "fitbatch.schedule",
    "BatchStream": "fitbatch.streaming",
    "BudgetBatchSampler": "fitbatch.sampler",
    "EqualSteps": "fitbatch.streaming",
    "GradientAccumulator": "fitbatch.schedule",
    "Infinite": "fitbatch.pipeline",
    "MicroBatchInfo": "fitbatch.schedule",
    "ScheduledBatchSampler": "fitbatch.schedule",
    "StreamDataset": "fitbatch.streaming",
    "StreamShard": "fitbatch.streaming",
    "StreamSummary": "fitbatch.streaming",
    "WindowedBatchSampler": "fitbatch.windowed",
    "batch_stream": "fitbatch.streaming",
    "equal_steps": "fitbatch.streaming",
    "per_chunk": "fitbatch.streaming",
}


def __getattr__(name: str) -> Any:
    # Importing torch takes seconds; numpy-only users of the planner never pay for it.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fitbatch' has no attribute {name!r}")

__all__ = [
    "BatchMemoryModel",
    "BatchPlan",
    "BatchSizeSchedule",
    "BatchStream",
    "Buckets",
    "BudgetBatchSampler",
    "CostModel",
    "EqualSteps",
    "Fixed",
    "FunctionCost",
    "GradientAccumulator",
    "Infinite",
    "Limits",
    "MicroBatchInfo",
    "OOMGuard",
    "Packed",
    "PaddedBatch",
    "PaddedCost",
    "PaddedPolynomial",
    "PlanOptions",
    "PlanStats",
    "Pooled",
    "ScheduledBatchSampler",
    "Sequential",
    "SizeIndex",
    "SizeMemoryModel",
    "Sizes",
    "Sorted",
    "StepTotals",
    "Strategy",
    "StreamDataset",
    "StreamShard",
    "StreamSummary",
    "SumCost",
    "WindowedBatchSampler",
    "__version__",
    "as_sizes",
    "batch_stream",
    "block_causal_mask",
    "build_size_index",
    "calibrate",
    "collect_peak_memory",
    "document_block_mask",
    "epoch_repeat_rate",
    "equal_steps",
    "fixed_size_plan",
    "from_array",
    "from_dataset",
    "from_files",
    "from_source",
    "from_tokenizer",
    "largest_safe_batch_size",
    "list_files",
    "make_hf_collate",
    "make_pad_collate",
    "make_varlen_collate",
    "measure_peak",
    "pad_collate",
    "parse_budget",
    "per_chunk",
    "pick_shape",
    "plan_batches",
    "position_size_correlation",
    "repeat_rate",
    "resolve_cost",
    "resolve_strategy",
    "varlen_collate",
]
