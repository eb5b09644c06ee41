"""Samplers: the plan as a torch ``BatchSampler`` with epochs, exact ``len()``, ranks and resume.

:class:`PlanSampler` is the protocol every fitbatch sampler fills (iteration, ``len()``,
``set_epoch``, the resume cursor, the state envelope); :class:`BudgetBatchSampler` is the one a
``DataLoader`` takes. The classes that subclass torch's ``BatchSampler`` load on first use, so
importing this package does not import torch.

>>> from fitbatch.sampler import BudgetBatchSampler
>>> list(BudgetBatchSampler([3, 1, 4, 1, 5, 9, 2, 6], 12, strategy="sorted"))
[[3, 1], [6, 0, 2], [4, 7], [5]]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitbatch.epoch._arrange import StepTotals
from fitbatch.sampler._protocol import EpochHook, PlanSampler, RankLayout

if TYPE_CHECKING:
    from fitbatch.sampler._budget import BudgetBatchSampler
    from fitbatch.sampler._windowed import WindowedBatchSampler

_LAZY = {
    "BudgetBatchSampler": "fitbatch.sampler._budget",
    "WindowedBatchSampler": "fitbatch.sampler._windowed",
}


def __getattr__(name: str) -> Any:
    # these subclass torch's BatchSampler: torch loads on first use, not on import
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fitbatch.sampler' has no attribute {name!r}")


__all__ = [
    "BudgetBatchSampler",
    "EpochHook",
    "PlanSampler",
    "RankLayout",
    "StepTotals",
    "WindowedBatchSampler",
]
