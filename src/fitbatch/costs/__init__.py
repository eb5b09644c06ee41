"""Cost models: what one batch costs, from (count, max size, sum of sizes).

* :mod:`fitbatch.costs._models` — the :class:`CostModel` base and the built-ins (``"sum"``,
  ``"padded"``, ``"polynomial"``, :class:`FunctionCost`), :func:`resolve_cost`;
* :mod:`fitbatch.costs._limits` — :class:`Limits`: several budgets at once over named size
  columns (text tokens *and* images), one composite cost model of fills.

>>> import numpy as np
>>> resolve_cost("padded").evaluate(np.array([4, 2]), np.array([10.0, 50.0]), np.array([30.0, 60.0]))
array([ 40., 100.])
"""

from __future__ import annotations

from fitbatch._validate import parse_budget
from fitbatch.costs._limits import Limits, resolve_limits
from fitbatch.costs._models import (
    COST_NAMES,
    CostModel,
    FloatArray,
    FunctionCost,
    PaddedCost,
    PaddedPolynomial,
    SumCost,
    _check_costs,
    _reduce_length,
    _reduce_sum,
    resolve_cost,
)

__all__ = [
    "COST_NAMES",
    "CostModel",
    "FloatArray",
    "FunctionCost",
    "Limits",
    "PaddedCost",
    "PaddedPolynomial",
    "SumCost",
    "parse_budget",
    "resolve_cost",
    "resolve_limits",
    "_check_costs",
    "_reduce_length",
    "_reduce_sum",
]
