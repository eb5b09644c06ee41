"""fitbatch.steps' compiled packing and refinement (numba) give exactly the numpy partitions.

Every comparison runs the same ``partition`` twice, with ``FITBATCH_JIT=0`` (numpy) and
``FITBATCH_JIT=1`` (the compiled kernels, loaded at once), and asserts the same micro-batches in
the same order, the same skipped sequences and the same workloads, over random steps (ties,
weights, groups, costs, options, world sizes) that ``hypothesis`` draws; a digest of 400 fixed
random partitions pins both forms to one result.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from contracts import jit_mode as jit
from hypothesis import given, settings
from hypothesis import strategies as st

from fitbatch._kernels import jit as jit_module
from fitbatch.costs import PaddedCost, PaddedPolynomial, SumCost
from fitbatch.steps import Partition, _compiled, partition

pytest.importorskip("numba")  # in the test extra: this never skips there

COSTS: dict[str, Any] = {
    "sum": SumCost(),
    "padded": PaddedCost(),
    "polynomial": PaddedPolynomial(fixed=5.0, linear=1.0, per_token=1.0, quadratic=0.01),
    "string": "sum",
}




def both(call: Callable[[], Partition]) -> tuple[Partition, Partition]:
    with jit("0"):
        plain = call()
    with jit("1"):
        assert _compiled.kernels() is not None
        compiled = call()
    return plain, compiled


def assert_same(a: Partition, b: Partition) -> None:
    assert a.n_micro == b.n_micro
    np.testing.assert_array_equal(a.order, b.order)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.skipped, b.skipped)
    np.testing.assert_array_equal(a.workload, b.workload)
    assert (a.efficiency, a.n_oversized, a.n_empty) == (b.efficiency, b.n_oversized, b.n_empty)
    # the layout's sums and the bounds are compiled too (lay_out_pool, bound_terms): the same values
    for name in ("step_samples", "step_tokens", "step_loss_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert getattr(a, name).dtype == getattr(b, name).dtype
    assert (a.lower_bound, a.efficiency_bound, a.world, a.ranks) == (b.lower_bound, b.efficiency_bound, b.world, b.ranks)


@st.composite
def steps(draw: Any) -> dict[str, Any]:
    """A step: sizes (some drawn from a few values, so ties abound), its budget and options."""
    n = draw(st.sampled_from([0, 1, 5, 40, 150, 600, 2500]))
    top = draw(st.sampled_from([8, 100, 4000, 8192]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        sizes = rng.choice(np.unique(np.clip(rng.integers(1, top + 1, 4), 1, top)), n)
    else:
        sizes = np.clip(np.ceil(rng.lognormal(math.log(top / 5), 1.0, n)), 1, top).astype(np.int64)
    cost = draw(st.sampled_from(sorted(COSTS)))
    model = COSTS[cost] if cost != "string" else SumCost()
    one = float(model.evaluate(np.ones(1), np.full(1, top), np.full(1, top))[0])
    oversized = draw(st.sampled_from(["error", "single", "skip"]))
    slack = draw(st.floats(0.6 if oversized != "error" else 1.0, 6.0))
    kw: dict[str, Any] = {
        "world": draw(st.sampled_from([1, 2, 3, 8, 16, 64])),
        "cost": COSTS[cost],
        "micro_multiple": draw(st.integers(1, 4)),
        "min_micro": draw(st.one_of(st.none(), st.integers(1, 6))),
        "oversized": oversized,
    }
    weighting = draw(st.sampled_from(["sizes", "workload", "whole", "fraction", "model"]))
    kw["weights"] = {"sizes": None, "workload": lambda L: 24576 * L + L**2,
                     "whole": np.floor(rng.random(n) * 100), "fraction": rng.random(n) * 10,
                     "model": PaddedPolynomial(quadratic=1.0)}[weighting]
    if draw(st.booleans()):  # the loss tokens' sums per micro-step (fractions: summed in order)
        kw["loss_sizes"] = np.floor(sizes * rng.random(n) * 4) / 4
    grouping = draw(st.sampled_from([None, "rank", "micro"]))
    if grouping is not None and n:
        kw["groups"] = rng.integers(0, max(1, n // draw(st.sampled_from([2, 4, 16]))), n)
        kw["keep_groups"] = grouping
        if grouping == "micro" and oversized == "error":
            kw["oversized"] = "single"  # a group over the budget: kept alone
    return {"sizes": sizes, "budget": float(math.ceil(one * slack)), **kw}


@settings(max_examples=150)
@given(steps())
def test_compiled_partition_is_the_numpy_partition(step: dict[str, Any]) -> None:
    def call() -> Partition:
        return partition(**step)

    try:
        plain, compiled = both(call)
    except ValueError:  # an oversized sequence with oversized="error": both forms raise
        with jit("1"), pytest.raises(ValueError):
            call()
        return
    assert_same(plain, compiled)


def _cases() -> Iterator[tuple[np.ndarray, float, dict[str, Any]]]:
    """400 seeded steps over sizes, budgets, costs, weights, groups and options."""
    rng = np.random.default_rng(2026)
    costs = [SumCost(), PaddedCost(), PaddedPolynomial(fixed=5.0, linear=1.0, per_token=1.0, quadratic=0.01), "sum"]
    for i in range(400):
        n = int(rng.integers(0, 3000 if i % 10 == 0 else 300))
        top = int(rng.choice([8, 100, 4000, 8192]))
        sizes = np.clip(np.ceil(rng.lognormal(np.log(top / 5), 1.0, n)), 1, top).astype(np.int64)
        one = {0: top, 1: top, 2: 5 + 1 + top * (1 + 0.01 * top), 3: top}[i % 4]
        budget = float(np.ceil(one * rng.uniform(1.0, 6.0)))
        kw: dict[str, Any] = {"world": int(rng.choice([1, 2, 3, 8, 16, 64])),
                              "micro_multiple": int(rng.integers(1, 5)), "cost": costs[i % 4]}
        if i % 5 == 1:
            kw["weights"] = lambda L: 24576 * L + L**2
        elif i % 5 == 2:
            kw["weights"] = np.floor(rng.random(n) * 100)
        elif i % 5 == 3:
            kw["weights"] = rng.random(n) * 10
        if i % 7 == 3:
            kw["min_micro"] = int(rng.integers(1, 6))
        if i % 6 == 5 and n:
            kw["groups"] = rng.integers(0, max(1, n // 4), n)
            kw["keep_groups"] = "micro" if i % 12 == 5 else "rank"
        if i % 9 == 4:
            kw["oversized"] = "single" if i % 2 else "skip"
            budget = float(np.ceil(one * 0.7))
        if kw.get("keep_groups") == "micro":
            kw["oversized"] = "single"
        yield sizes, budget, kw


def _digest() -> str:
    h = hashlib.sha256()
    for sizes, budget, kw in _cases():
        p = partition(sizes, budget, **kw)
        for a in (p.order, p.offsets, p.skipped):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
            h.update(b"|")
        h.update(np.ascontiguousarray(p.workload, dtype=np.float64).tobytes())
    return h.hexdigest()


# the 400 partitions' digest: a change of any partition is deliberate (and in the changelog)
DIGEST = "be806c6d2ed7fae7aa0e05e0e2113242778a5946cb9e581d0a42eb1884569c5c"


def test_400_partitions_are_pinned_in_both_forms() -> None:
    with jit("0"):
        plain = _digest()
    with jit("1"):
        compiled = _digest()
    assert plain == compiled == DIGEST


def test_the_kernels_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled forms run where they apply (the comparisons above are not numpy twice)."""
    with jit("1"):
        module = _compiled.kernels()
        assert module is not None
        calls: dict[str, int] = {"pack_pool": 0, "refine": 0, "lay_out_pool": 0, "bound_terms": 0, "partition_pool": 0}

        class Counting:
            def __getattr__(self, name: str) -> Any:
                fn = getattr(module, name)

                def counted(*args: Any) -> Any:
                    calls[name] += 1
                    return fn(*args)

                return counted if name in calls else fn

        monkeypatch.setitem(jit_module._companions, "steps", Counting())
        lengths = np.random.default_rng(0).integers(1, 8192, 1024)
        # the whole step in one call (partition_pool): whole weights, the first packing fits
        partition(lengths[:512] // 2, 16384, world=8, weights=lambda L: 24576 * L + L**2)
        assert calls["partition_pool"] == 1 and calls["pack_pool"] == calls["refine"] == calls["lay_out_pool"] == 0
        # a packing that needs more micro-batches than the bound: the general form, its kernels one by one
        partition(lengths, 16384, world=8, weights=lambda L: 24576 * L + L**2)
        assert calls["partition_pool"] == 2 and calls["pack_pool"] >= 2 and calls["refine"] >= 1
        assert calls["lay_out_pool"] == 1 and calls["bound_terms"] == 1
        calls.update(pack_pool=0, refine=0)
        partition(lengths, 16384, world=8, weights=np.random.default_rng(1).random(1024))  # fractions
        assert calls["pack_pool"] >= 1 and calls["refine"] == 0  # the refinement's sums stay in numpy
        calls.update(pack_pool=0, refine=0)
        calls.update(lay_out_pool=0, bound_terms=0)
        partition(lengths, 16384, world=8, cost=_Custom())
        assert calls["pack_pool"] == calls["refine"] == 0  # a model of its own: numpy (but the layout)
        assert calls["partition_pool"] == 3  # not tried for it


class _Custom(SumCost):
    """A cost model the kernels do not know (a subclass may change ``evaluate``)."""


def test_off_and_background_load_leave_the_partition_alone() -> None:
    lengths = np.random.default_rng(3).integers(1, 8192, 512)
    with jit("0"):
        assert _compiled.kernels() is None
        plain = partition(lengths, 16384, world=16)
    during = partition(lengths, 16384, world=16)  # auto: a background load may be under way
    _compiled.settle()
    assert_same(plain, during)
    assert_same(plain, partition(lengths, 16384, world=16))


@settings(max_examples=60)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 8, 64]))
def test_the_bound_reuses_the_stable_order_only_where_ties_cannot_matter(seed: int, per_step: int) -> None:
    """The efficiency bound takes the units heaviest first in the deal's stable order where the
    marginal costs are whole (their running sums exact in any order): the bound of numpy's own
    (unstable) order, on steps full of ties in weight with unequal costs."""
    from fitbatch.steps._partition import _Plan

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    sizes = rng.integers(1, 50, n)
    weights = np.floor(rng.random(n) * 5)  # few weights: ties of unequal sizes
    for mode in ("0", "1"):
        with jit(mode):
            plan = _Plan.build(sizes, 60.0, weights, "sum", 1, None, None, "rank", None, "error", None)
            assert plan.heaviest is None
            mean = float(weights.sum()) / per_step
            unstable = plan._efficiency_bound(per_step, mean)
            plan.micro_rows(np.zeros(n, dtype=np.int64), 1)
            assert plan.heaviest is not None and plan._extra_exact
            assert plan._efficiency_bound(per_step, mean) == unstable


@pytest.mark.parametrize("scale", [1.0, 0.5])  # whole weights (the one compiled call), fractions (the general form)
def test_a_weights_function_is_called_once(scale: float) -> None:
    calls: list[int] = []

    def weights(lengths: np.ndarray) -> np.ndarray:
        calls.append(lengths.size)
        return (24576 * lengths + lengths**2) * scale

    lengths = np.random.default_rng(5).integers(1, 4096, 300)
    with jit("1"):
        got = partition(lengths, 16384, world=8, weights=weights)
    with jit("0"):
        want = partition(lengths, 16384, world=8, weights=lambda L: (24576 * L + L**2) * scale)
    assert calls == [300]
    assert_same(want, got)


@pytest.mark.parametrize("bad", [
    np.array([5, -1, 3], dtype=np.int64),
    np.array([5, -1, 3], dtype=np.int32),
    np.array([5.0, np.nan, 3.0]),
    np.array([5.0, -np.inf, 3.0]),
    np.array([5, 2**53 + 1, 3], dtype=np.int64),
])
def test_bad_sizes_are_refused_as_the_general_form_refuses_them(bad: np.ndarray) -> None:
    """The one compiled call takes a numpy array of sizes unchecked and declines a size not in
    [0, 2**53): the general form then names it, before the weights are called (even a weights
    function that fails on such sizes)."""
    def weights(lengths: np.ndarray) -> np.ndarray:
        if not (lengths >= 0).all():
            raise RuntimeError("weights called on bad sizes")
        return lengths

    for mode in ("0", "1"):
        with jit(mode), pytest.raises(ValueError, match="sizes"):
            partition(bad, 2.0**60, world=2, weights=weights)
        with jit(mode), pytest.raises(ValueError, match="sizes"):
            partition(bad, 2.0**60, world=2)


def test_sizes_at_the_edge_of_exact_are_the_general_forms() -> None:
    """A size of 2**53 (exact, but not below it) runs in the general form: the same partition."""
    sizes = np.array([2**53, 2**52, 7, 1], dtype=np.int64)
    plain, compiled = both(lambda: partition(sizes, 2.0**55, world=2))
    assert_same(plain, compiled)
    assert plain.n_micro == 1


def test_a_forced_count_at_the_bound_takes_the_fewest_micro_batches_padded() -> None:
    """One sequence far heavier than the rest sets the least time: ``micro_multiple`` forces 4
    micro-steps where the cap needs 1, and the packing into 1, padded with empty micro-batches,
    runs at the least time (the efficiency bound); both forms give it."""
    rng = np.random.default_rng(11)
    lengths = np.r_[8192, rng.integers(1, 600, 300)]
    call = lambda: partition(lengths, 16384 * 4, world=64, weights=lambda L: 24576 * L + L**2,  # noqa: E731
                             micro_multiple=4)
    plain, compiled = both(call)
    assert_same(plain, compiled)
    assert plain.n_micro == 4 and plain.efficiency == plain.efficiency_bound < 1
    assert plain.workload[:, 1:].max() == 0  # micro-steps 1-3 empty: the packing into 1, padded


def test_a_padded_start_is_refined_without_balance_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``micro_multiple`` forces more micro-batches than the cap needs and the packing into
    the fewest, padded, runs faster, the refinement starts from it with its exchange passes only
    (a balance pass would pair each loaded micro-batch with an empty one); the forced count's
    own packing still gets them."""
    from fitbatch.steps import _refine

    modes: list[str] = []
    real = _refine._one_pass

    def recording(*args: Any) -> Any:
        modes.append(args[13])
        return real(*args)

    monkeypatch.setattr(_refine, "_one_pass", recording)
    lengths = np.clip(np.ceil(np.random.default_rng(512).lognormal(6.5, 1.0, 512)), 1, 8192).astype(np.int64)
    with jit("0"):
        padded = partition(lengths, 16384, world=16, weights=lambda L: 24576 * L + L**2, micro_multiple=4)
        assert modes and "balance" not in modes
        assert padded.n_empty > 0  # the fewest micro-batches, padded
        modes.clear()
        partition(lengths, 16384, world=16, weights=lambda L: 24576 * L + L**2)
        assert modes[0] == "balance"
    with jit("1"):
        assert_same(padded, partition(lengths, 16384, world=16, weights=lambda L: 24576 * L + L**2, micro_multiple=4))


@pytest.mark.parametrize("heavy", [False, True])
def test_passes_from_one_sort_by_weight_are_the_numpy_passes(heavy: bool) -> None:
    """From ``PRESORTED_FROM`` units the compiled passes take each pair's units from one sort of all
    by weight (a counting sort by pair keeps it) where that is the stable order of their keys;
    where distinct weights share a key (one weight of ``2**51`` beside small ones: the keys' last
    bits drop) they sort as before. Either way, the numpy partition."""
    from fitbatch._kernels import steps as kernels

    rng = np.random.default_rng(4096)
    n = max(2048, kernels.PRESORTED_FROM)
    lengths = np.clip(np.ceil(rng.lognormal(6.5, 1.0, n)), 1, 8192).astype(np.int64)
    weights: Any = lambda L: 24576 * L + L**2  # noqa: E731
    if heavy:
        weights = rng.integers(0, 1000, n).astype(np.float64)
        weights[0] = 2.0**51
    for world, mm in ((64, 1), (16, 2), (8, 1)):
        plain, compiled = both(lambda w=world, m=mm: partition(lengths, 16384, world=w, weights=weights, micro_multiple=m))
        assert_same(plain, compiled)


@pytest.mark.parametrize(("seed", "refined"), [(1, [144]), (5, [144, 136])])
def test_one_more_micro_step_is_tried_first_where_the_packing_is_full(monkeypatch: pytest.MonkeyPatch, seed: int,
                                                                      refined: list[int]) -> None:
    """Where the packing into the fewest micro-batches is spread and full to the cap, one more
    micro-step is packed and refined first; within ``MORE`` of its mean it is kept without
    refining the fewest (seed 1: one refinement, of 18 micro-steps x 8 ranks), otherwise the
    fewest are refined and the faster kept, as before (seed 5: both, 18 micro-steps win); both
    forms give the same partition."""
    from fitbatch.steps import _partition

    sizes: list[int] = []
    real = _partition.refine

    def recording(bins: Any, *args: Any, **kwargs: Any) -> Any:
        sizes.append(bins.load.size)
        return real(bins, *args, **kwargs)

    monkeypatch.setattr(_partition, "refine", recording)
    lengths = np.clip(np.ceil(np.random.default_rng(seed).lognormal(6.5, 1.0, 2048)), 1, 8192).astype(np.int64)
    call = lambda: partition(lengths, 16384, world=8, weights=lambda L: 24576 * L + L**2)  # noqa: E731
    plain, compiled = both(call)
    assert_same(plain, compiled)
    assert sizes == refined and plain.n_micro == 18
    if len(refined) == 1:  # kept at once: within MORE of its mean
        assert plain.workload.max(axis=0).sum() <= plain.workload.sum() / 8 * (1 + _partition.MORE)
