"""The O(n) paths for whole-number sizes: the counting sort (equal to a stable argsort) and
sum-cost packing on the histogram of sizes (the same batches as the per-sample first fit)."""

from __future__ import annotations

import math

import numpy as np
from contracts import check_plan
from hypothesis import given
from hypothesis import strategies as st

import fitbatch
from fitbatch._kernels import histogram as H
from fitbatch._kernels import sorting as SK
from fitbatch._kernels.packing import first_fit_laid


@given(
    n=st.integers(0, 3000),
    top=st.sampled_from([1, 2, 7, 255, 256, 4095, 65535, 2**20, 2**31]),
    seed=st.integers(0, 2**16),
)
def test_counting_argsort_is_a_stable_argsort(n, top, seed):
    keys = np.random.default_rng(seed).integers(0, top + 1, n)
    for dtype in (np.int64, np.uint32, np.uint16) if top < 2**16 else (np.int64,):
        k = keys.astype(dtype)
        got = SK.counting_argsort(k, top)
        assert got.dtype == np.int64
        assert got.tolist() == np.argsort(keys, kind="stable").tolist()


def test_counting_argsort_refuses_keys_past_the_top():
    assert SK.counting_argsort(np.array([3, 1, 2]), 3).tolist() == [1, 2, 0]
    assert SK.counting_argsort(np.zeros(0, np.int64), 0).size == 0


@given(
    n=st.integers(0, 400),
    top=st.integers(1, 80),
    budget=st.integers(1, 120),
    half=st.booleans(),
    cap=st.one_of(st.none(), st.integers(1, 9)),
    seed=st.integers(0, 2**16),
)
def test_histogram_first_fit_is_the_per_sample_first_fit(n, top, budget, half, cap, seed):
    """Same batches, in the same order, each with its positions in the same order, for any
    descending whole sizes (zeros, samples over the budget, a count cap), placed a few parts at
    a time."""
    H.PLACE_CHUNK, chunk = 1 + seed % 50, H.PLACE_CHUNK
    try:
        _check_histogram_first_fit(n, top, budget, half, cap, seed)
    finally:
        H.PLACE_CHUNK = chunk


def _check_histogram_first_fit(n, top, budget, half, cap, seed):
    rng = np.random.default_rng(seed)
    laid = np.sort(rng.integers(0, top, n))[::-1].copy()
    b = budget + (0.5 if half else 0.0)
    positions = rng.permutation(n).astype(np.int64)
    ref_order, ref_starts, ref_laid = first_fit_laid(laid.astype(np.float64), positions.copy(), np.zeros(1, np.int64), b, cap)
    dest, starts = H.histogram_first_fit(laid, b, cap)
    assert starts.tolist() == ref_starts.tolist()
    assert sorted(dest.tolist()) == list(range(n)), "every position exactly once"
    order = np.empty(n, np.int64)
    order[dest] = positions
    assert order.tolist() == ref_order.tolist()


def test_histogram_path_packs_few_distinct_sizes_within_budget_every_index_once():
    """Many samples of few sizes (the histogram path): every index once, every batch within the
    budget, no more batches than first fit over all of them sorted (which it is)."""
    rng = np.random.default_rng(3)
    sizes = rng.choice(np.array([3, 17, 64, 100, 250, 511]), 30_000).astype(np.float64)
    assert H.pays(sizes.size, 6)
    plan = fitbatch.plan_batches(sizes, 512, cost="sum", strategy=fitbatch.Packed(pool_size=1000), seed=4)
    check_plan(plan, sizes, 512.0, fitbatch.SumCost())
    _, ffd_starts = fitbatch._kernels.packing.first_fit_starts(np.sort(sizes)[::-1], np.zeros(1, np.int64), 512.0)
    assert len(plan) == ffd_starts.size
    assert len(plan) <= math.ceil(sizes.sum() / 512) * 1.01
