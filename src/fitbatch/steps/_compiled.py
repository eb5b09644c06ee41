"""The compiled forms of a step's packing and refinement (the ``fast`` extra: numba).

:mod:`fitbatch._kernels.steps` holds :func:`~fitbatch.steps._pack.pack` of one pool,
:func:`~fitbatch.steps._refine.refine`, the pool's layout (``by_step`` and the totals of
``_Plan.result``) and the efficiency bound's running sums as numba loops that make the same decisions in the same
order as the numpy forms, so a partition is the same with or without them (a property test
compares the two on random steps). They apply to the built-in cost models only
(:class:`~fitbatch.costs.SumCost`, :class:`~fitbatch.costs.PaddedCost`,
:class:`~fitbatch.costs.PaddedPolynomial`, exactly those classes); the refinement also only
where every weight is a whole number and their total is below ``2**52`` (its step times are
sums, pairwise in numpy: exact, so equal, only then). Other steps run in numpy.

Loading (:func:`fitbatch._kernels.jit.companion`, the one loader of compiled modules):
``FITBATCH_JIT=0`` never; ``FITBATCH_JIT=1`` (or numba imported by the program) at the
first partition of the process, which waits for it (numba's cached machine code: ~0.7 s;
compiling on a fresh install, once: ~34 s of CPU on the 2-core VM); otherwise a background
thread starts loading at the first partition, and partitions run in numpy until it is done (the
first call costs what numpy does). Either way the partition is the same: only the time differs.
Sorts of at least ``SORT_FROM`` keys in :mod:`fitbatch.steps` use the compiled radix sort once
loaded (:func:`argsort`: a stable order is unique, so the same positions).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
from numpy.typing import NDArray

from fitbatch._kernels import jit
from fitbatch.costs import CostModel

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: the refinement is compiled only where the weights' total is below this (all sums exact)
EXACT_BELOW = float(2**52)


def kernels() -> ModuleType | None:
    """The compiled module, or ``None`` (not loaded yet, not installed, or ``FITBATCH_JIT=0``).

    Loaded by :func:`fitbatch._kernels.jit.companion` (in the background from the first call,
    at once with ``FITBATCH_JIT=1`` or numba imported by the program)."""
    return jit.companion("steps", _warm)


def settle() -> ModuleType | None:
    """Wait for a background load under way; the compiled module or ``None``.

    >>> settle() is None or settle() is not None
    True
    """
    return jit.settle_companion("steps")


def _loaded() -> ModuleType | None:
    """The compiled module if it is loaded now (starts nothing, waits for nothing)."""
    return jit._companions.get("steps") if jit._mode() != "off" else None


def _warm(module: ModuleType) -> None:
    units = [np.array([3.0, 2.0, 1.0]) for _ in range(4)]
    order, alone = np.array([0, 1, 2], dtype=np.int64), np.full(1, -1, dtype=np.int64)
    module.pack_pool(order, alone, *units, 2, 10.0, 0, np.zeros(4), 32)
    flat, placed = np.array([0, 1, 1], dtype=np.int64), np.arange(3, dtype=np.int64)
    bins = [np.array([3.0, 3.0]) for _ in range(4)]
    module.refine(*bins, flat, placed, *units, 10.0, 0, np.zeros(4), True, 1, 2, True, 1, 3.0, 2, True,
                  np.array([1.0, 0.0, 0.0, 4.0, 4.0, 4.0]))
    bin_of, kept = np.array([0, 1, 1], dtype=np.int64), np.ones(3, dtype=bool)
    module.lay_out_pool(bins[0], bin_of, order, kept, 1, 2, units[0], units[1])
    module.bound_terms(units[0], units[1], kept, False, True, 5.0, 2)
    module.step_time(bins[0], 1, 2, True, 1)
    sizes = np.array([3.0, 2.0, 1.0, 2.0])
    module.partition_pool(sizes, sizes.copy(), sizes.copy(), 4.0, 0, np.zeros(4), False, 1, 0, 2, 32,
                          np.array([1.0, 0.0, 0.0, 4.0, 4.0, 4.0]), np.array([1e-3, 5e-5, 0.98, 5e-5, 24, 2, 1024, 16384, 2.0**52, 2.0**53]))
    module.argsort(np.arange(40.0))
    module.argsort_int(np.arange(40))


def cost_kind(model: CostModel) -> tuple[int, FloatArray] | None:
    """The compiled cost kind and parameters of ``model``, or ``None`` for a model the kernels lack."""
    return jit._cost_params(model)


def kernels_for(model: CostModel | None) -> tuple[ModuleType, int, FloatArray] | None:
    """The compiled module with the cost kind and parameters of ``model``, or ``None`` where
    the kernels do not apply (a model they lack) or are not loaded."""
    kind = jit._cost_params(model) if model is not None else None
    module = kernels() if kind is not None else None
    if module is None or kind is None:
        return None
    return module, kind[0], kind[1]


def whole(weight: FloatArray) -> bool:
    """Whether every sum of these (non-negative) weights is exact in any order."""
    return bool(np.all(weight == np.floor(weight))) and float(weight.sum()) < EXACT_BELOW


#: below this many keys numpy's stable sort is as fast as the compiled one
SORT_FROM = 512


def argsort(key: NDArray[np.float64] | IntArray) -> IntArray:
    """``np.argsort(key, kind="stable")`` (a stable order is unique: the same positions), by the
    compiled radix sort where it is loaded, for float64 keys without NaN or int64 keys >= 0."""
    module = _loaded() if key.size >= SORT_FROM else None
    if module is not None and key.ndim == 1:
        if key.dtype == np.float64:
            out: IntArray = module.argsort(np.ascontiguousarray(key))
            return out
        if key.dtype == np.int64 and int(key.min()) >= 0:
            out = module.argsort_int(np.ascontiguousarray(key))
            return out
    return np.argsort(key, kind="stable")
