"""Memory models: cost models whose coefficients are least-squares fits of measured peaks.

Two shapes of model, both :class:`~fitbatch.costs.CostModel` so the planner can budget in bytes:

* :class:`BatchMemoryModel` — ``peak ≈ fixed + count * (linear + per_token * L + quadratic * L**2)``
  over (batch count, padded length L): a :class:`~fitbatch.costs.PaddedPolynomial`, fitted
  (:func:`fit_batch_model`) from peaks of whole training steps.
* :class:`SizeMemoryModel` — a 1-D polynomial of one sample's size (the seed tool's
  ``PolynomialRegression``), fitted (:func:`fit_size_model`) on inputs mapped to [-1, 1] so that
  degree 6 is as accurate as degree 1. A batch costs ``count * p(padded length)``.

Both fit *relative* errors (memory spans orders of magnitude, and a 5 % error is what matters),
and both evaluate to an **upper prediction bound**, not the mean: the mean times ``1 + margin``
where the margin is the one-sided Student-t prediction bound of the relative residuals at
``confidence``, and never less than the largest under-prediction seen while fitting. Models
are plain data: ``to_dict``/``save``/:func:`load_memory_model`; the size model also converts to
and from a ``torch.nn.Module`` whose buffers hold its coefficients.

>>> import numpy as np
>>> counts = np.array([1, 2, 4, 8, 1, 2, 4, 1, 2])
>>> lengths = np.array([64, 64, 64, 64, 256, 256, 256, 1024, 1024])
>>> peaks = 1000 + counts * (50 + 3.0 * lengths + 0.01 * lengths**2)
>>> model = fit_batch_model(counts, lengths, peaks)
>>> [round(v, 6) for v in (model.mean.fixed, model.mean.per_token, model.mean.quadratic)]
[1000.0, 3.0, 0.01]
>>> float(model.evaluate(np.array([2]), np.array([100]), np.array([150]))[0])
1900.0
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from fitbatch.memory._batch_model import BatchMemoryModel, fit_batch_model
from fitbatch.memory._fit import MODEL_VERSION
from fitbatch.memory._size_model import (
    SizeMemoryModel,
    _polynomial_regression_class,
    fit_size_model,
)

logger = logging.getLogger(__name__)

__all__ = [
    "MODEL_VERSION",
    "BatchMemoryModel",
    "SizeMemoryModel",
    "fit_batch_model",
    "fit_size_model",
    "load_memory_model",
]


_MODELS: dict[str, Any] = {
    BatchMemoryModel.name: BatchMemoryModel,
    SizeMemoryModel.name: SizeMemoryModel,
}


def load_memory_model(
    source: str | os.PathLike[str] | dict[str, Any],
) -> BatchMemoryModel | SizeMemoryModel:
    """Load a model saved with ``model.save(path)`` (or given as its ``to_dict()``).

    >>> m = fit_size_model([1, 2, 3], [2, 4, 6], degree=1)
    >>> load_memory_model(m.to_dict()) == m
    True
    """
    if isinstance(source, dict):
        data = source
    else:
        with open(source, encoding="utf-8") as fh:
            data = json.load(fh)
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in _MODELS:
        raise ValueError(f"unknown memory model kind {kind!r}; expected one of {tuple(_MODELS)}")
    return _MODELS[kind].from_dict(data)  # type: ignore[no-any-return]


def __getattr__(name: str) -> Any:
    if name == "PolynomialRegression":
        return _polynomial_regression_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
