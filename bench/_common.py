"""What the benchmarks share: the real length sets, the seed tools' loop, plan metrics."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

import fitbatch

# The library's metrics, under the names the benchmarks use.
from fitbatch.plan._metrics import batch_of_sample as batch_ids  # noqa: E402, F401
from fitbatch.plan._metrics import position_size_correlation as spearman_position_size  # noqa: E402, F401
from fitbatch.plan._metrics import repeat_rate  # noqa: E402, F401


def best_time(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """The fastest of ``repeat`` calls of ``fn`` (after a garbage collection each) and its result.

    The previous result is released before each call, so at most one is alive while timing.
    """
    best, out = float("inf"), None
    for _ in range(max(repeat, 1)):
        out = None
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def optimal_padded_batches(sizes: np.ndarray, budget: float, cost="padded", **kw) -> int:
    """Greedy over globally sorted sizes: optimal batch count for the padded cost."""
    return len(fitbatch.plan_batches(sizes, budget, cost=cost, strategy="sorted", **kw))


ROOT = Path(__file__).resolve().parents[1]
DATA_DIRS = (ROOT.parent / "shared" / "data", ROOT / "tests" / "data")


def load(name: str) -> np.ndarray:
    """A real length set by name (the shared data, else the copy in tests/data)."""
    for root in DATA_DIRS:
        path = root / f"{name}.npy"
        if path.exists():
            return np.load(path)
    raise FileNotFoundError(f"{name}.npy not found in {[str(d) for d in DATA_DIRS]}")


def resample(base: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``n`` lengths drawn with replacement from ``base`` (``base`` itself when n is its size)."""
    if n == base.size:
        return base
    return base[np.random.default_rng(seed).integers(0, base.size, n)]


def seed_greedy(dataset: Iterable[int], sizeof: Callable[[int], float], max_total: float) -> Iterator[list[int]]:
    """The seed tools' loop (bionemo/equibatch/aistore): sum budget, order kept, no logging/collate."""
    batch: list[int] = []
    total = 0.0
    for data in dataset:
        size = sizeof(data)
        if batch and total + size > max_total:
            yield batch
            batch, total = [], 0.0
        batch.append(data)
        total += size
    if batch:
        yield batch


def synthetic(n: int) -> dict[str, np.ndarray]:
    """In addition to the real sets: shapes like those issue #18 names (short verse-like
    sentences, long-tailed quotations, molecule atom counts), whose epochs at 20k samples hold
    only ~40 batches of 16,384 tokens. Not real data: they only show the few-batch regime."""
    rng = np.random.default_rng(0)
    return {
        "synthetic verses (lognormal 3.3, 0.45)": np.clip(np.round(rng.lognormal(3.3, 0.45, n)), 3, None),
        "synthetic quotes (lognormal 3.0, 1.0)": np.clip(np.round(rng.lognormal(3.0, 1.0, n)), 2, None),
        "synthetic atoms (normal 27, 9)": np.clip(np.round(rng.normal(27, 9, n)), 3, None),
    }
