"""bench/workload.py's pure parts: the built-in balanced split and the workload fit (no timing)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("scipy")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import workload  # noqa: E402


def test_greedy_split_exact() -> None:
    lengths = np.array([500, 400, 300, 200, 100, 50, 50, 20])
    parts = workload.greedy_split(lengths, 2, 600, lambda v: v)
    assert [[mb.tolist() for mb in rank] for rank in parts] == [
        [[500, 100], [200, 20]],
        [[400, 50, 50], [300]],
    ]


@given(
    st.lists(st.integers(1, 64), min_size=1, max_size=60),
    st.integers(1, 6),
    st.sampled_from([lambda v: v, lambda v: 24576 * v + v**2]),
)
def test_greedy_split_keeps_every_sample_under_the_cap(sizes, ranks, wl) -> None:
    lengths = np.asarray(sizes)
    parts = workload.greedy_split(lengths, ranks, 64, wl)
    assert len(parts) == ranks
    flat = np.concatenate([mb for rank in parts for mb in rank])
    assert sorted(flat.tolist()) == sorted(sizes)  # every sample exactly once
    assert all(mb.sum() <= 64 for rank in parts for mb in rank)
    loads = sorted(float(wl(np.concatenate(r).astype(float)).sum()) if r else 0.0 for r in parts)
    # LPT: the heaviest rank exceeds the lightest by at most one sample's workload
    assert loads[-1] - loads[0] <= float(wl(lengths.astype(float)).max()) + 1e-9


def test_fit_recovers_the_workload_and_scores_the_default() -> None:
    x = workload.features(
        [np.full(c, n) for c, n in [(8, 32), (4, 256), (1, 2048), (2, 1024), (16, 64)]], "packed"
    )
    t = x @ np.array([2e-6, 5e-9])
    out = workload.fit_layout(x, t)
    assert out["a"] == pytest.approx(2e-6) and out["b"] == pytest.approx(5e-9)
    assert out["fitted"]["mape"] < 1e-9 and out["fitted"]["r2"] == pytest.approx(1.0)
    assert out["default"]["mape"] > 0.01  # a/b = 400 here, not 24576


def test_padded_features_count_every_row_at_the_longest() -> None:
    assert workload.features([np.array([3, 5])], "padded").tolist() == [[10.0, 50.0]]
    assert workload.features([np.array([3, 5])], "packed").tolist() == [[8.0, 34.0]]


def test_split_uses_fitbatch_partition_under_the_cap() -> None:
    lengths = np.array([5, 3, 2, 7, 1, 4])
    parts, used = workload.split(lengths, 2, 8, lambda v: v)
    assert used == "fitbatch.partition"
    assert len(parts[0]) == len(parts[1])  # the same micro-batch count on every rank
    assert sorted(int(x) for r in parts for mb in r for x in mb) == sorted(lengths.tolist())
    assert all(mb.sum() <= 8 for r in parts for mb in r)
