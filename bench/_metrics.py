"""Quality metrics of plans shared by the benchmarks: randomness and optimality."""

from __future__ import annotations

import numpy as np

import fitbatch

# The library's metrics, under the names the benchmarks use.
from fitbatch.metrics import batch_of_sample as batch_ids  # noqa: E402, F401
from fitbatch.metrics import position_size_correlation as spearman_position_size  # noqa: E402, F401
from fitbatch.metrics import repeat_rate  # noqa: E402, F401


def optimal_padded_batches(sizes: np.ndarray, budget: float, cost="padded", **kw) -> int:
    """Greedy over globally sorted sizes: optimal batch count for the padded cost."""
    return len(fitbatch.plan_batches(sizes, budget, cost=cost, strategy="sorted", **kw))
