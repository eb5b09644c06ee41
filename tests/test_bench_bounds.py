"""The lower bounds the benchmarks print are exact: checked against brute force on small cases."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
from contracts import load_script
from hypothesis import given, settings
from hypothesis import strategies as st

lone_batch_bound = load_script(Path(__file__).resolve().parents[1] / "bench" / "distributed.py", "bench_distributed").lone_batch_bound


def least_lone_waste(lone: np.ndarray, world: int, n_steps: int) -> float:
    """Every way of dealing the lone batches to steps (at most ``world`` a step)."""
    best = np.inf
    for deal in itertools.product(range(n_steps), repeat=lone.size):
        step = np.array(deal)
        if np.bincount(step, minlength=n_steps).max() > world:
            continue
        waste = sum(float(lone[step == s].max() * np.sum(step == s) - lone[step == s].sum()) for s in set(deal))
        best = min(best, waste)
    return best


@settings(max_examples=150, deadline=None)
@given(
    world=st.integers(1, 3),
    n_steps=st.integers(1, 3),
    data=st.data(),
)
def test_lone_batch_bound_is_the_least_waste_of_any_deal(world: int, n_steps: int, data: st.DataObject) -> None:
    budget = 16.0
    lone = np.array(data.draw(st.lists(st.integers(9, 16), min_size=1, max_size=world * n_steps)), np.float64)
    small = np.array(data.draw(st.lists(st.integers(1, 8), max_size=5)), np.float64)  # never lone
    sizes = np.concatenate([small, lone])
    expected = 1.0 + least_lone_waste(lone, world, n_steps) / (world * budget * n_steps)
    assert abs(lone_batch_bound(sizes, budget, world, n_steps) - expected) < 1e-12


def test_lone_batch_bound_without_lone_batches_is_one() -> None:
    assert lone_batch_bound(np.array([1.0, 8.0, 3.0]), 16.0, 8, 2) == 1.0


def test_lone_batch_bound_worked_example() -> None:
    # two steps of two: {12, 11} and {10, 9} waste 1 + 1 = 2 (any other deal wastes more)
    assert lone_batch_bound(np.array([12.0, 11, 10, 9, 2]), 16.0, 2, 2) == 1.0 + 2.0 / (2 * 16 * 2)
