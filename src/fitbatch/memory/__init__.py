"""Memory: measure peaks, fit memory models, calibrate a byte budget, survive OOM.

Importing this package does not import torch; the functions that need it import it on use.
"""

from __future__ import annotations

from typing import Any

from fitbatch.memory.calibrate import Calibration, Probe, calibrate
from fitbatch.memory.guard import OOMEvent, OOMGuard, SampleTooLargeError
from fitbatch.memory.model import (
    BatchMemoryModel,
    SizeMemoryModel,
    fit_batch_model,
    fit_size_model,
    load_memory_model,
)
from fitbatch.memory.profile import (
    MemoryProfile,
    PeakTracker,
    collect_peak_memory,
    detect_capacity,
    is_oom_error,
    measure_peak,
)

__all__ = [
    "BatchMemoryModel",
    "Calibration",
    "MemoryProfile",
    "OOMEvent",
    "OOMGuard",
    "PeakTracker",
    "PolynomialRegression",
    "Probe",
    "SampleTooLargeError",
    "SizeMemoryModel",
    "calibrate",
    "collect_peak_memory",
    "detect_capacity",
    "fit_batch_model",
    "fit_size_model",
    "is_oom_error",
    "load_memory_model",
    "measure_peak",
]


def __getattr__(name: str) -> Any:
    # a torch.nn.Module subclass: built on first access so that this import needs no torch
    if name == "PolynomialRegression":
        from fitbatch.memory import model

        return model.PolynomialRegression
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
