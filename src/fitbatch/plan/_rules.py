"""Planning rules shared by indexed plans and streams, so both follow them the same way.

A plan (:func:`fitbatch.plan_batches`) sees every size at once, a stream
(:func:`fitbatch.batch_stream`) one chunk at a time; both apply these rules to what they see:

* :func:`screen_oversized` — a sample whose cost alone exceeds the budget is refused, planned
  alone or skipped (the policies in :data:`OVERSIZED`), refused with one message;
* :func:`planning_budget` — with fractional sizes, kernels plan against a slightly lower budget.

>>> import numpy as np
>>> screen_oversized(np.array([3.0, 12.0, 5.0]), 10.0, "skip")
Screened(skipped=array([1]), kept=array([0, 2]))
>>> planning_budget(10.0, integral=False) < 10.0
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

#: what becomes of a sample whose own cost exceeds the budget: refused with a ``ValueError``,
#: given a batch of its own, or left out (and counted).
OVERSIZED = ("error", "single", "skip")
# Offenders an oversized error names.
SHOWN = 5
# Relative amount by which the budget is lowered for fractional sizes (see planning_budget).
ROUNDING_MARGIN = 1e-12
#: whole-number costs below this add exactly in float64
EXACT_SUMS = 2.0**53


class Screened(NamedTuple):
    """What the oversized policy leaves: positions skipped, and positions kept (``None``: all)."""

    skipped: IntArray
    kept: IntArray | None


def screen_oversized(
    alone: FloatArray,
    budget: float,
    policy: str,
    *,
    sizes: NDArray[np.float64] | None = None,
    positions: IntArray | None = None,
    label: str = "index",
    noun: str = "sample",
    counted_in: str = "plan's stats",
    describe: Callable[[int], str] | None = None,
) -> Screened:
    """Apply ``policy`` (one of :data:`OVERSIZED`) to samples whose costs alone are ``alone``.

    The error names the costliest offenders as ``{label} {position} (cost c, size s)``:
    ``positions`` maps positions into ``alone`` to the numbers shown (default: themselves),
    ``sizes`` are the samples' sizes (shown when they differ from the costs). ``noun`` and
    ``counted_in`` name the samples and where skipped ones are counted. ``describe(k)``, when
    given, says what the sample at position ``k`` exceeds (the limits of several named columns:
    ``"tokens 20000 > 16384"``), in place of its cost and size.

    Raises:
        ValueError: under ``"error"`` when a sample costs more than ``budget`` alone; the
            message counts them, names the costliest and gives the other policies.
    """
    none = Screened(np.zeros(0, np.int64), None)
    # max() propagates NaN: one pass tells that no cost exceeds the budget
    if policy == "single" or not alone.size or alone.max() <= budget:
        return none
    over = np.flatnonzero(alone > budget)
    if not over.size:  # NaN costs are kept
        return none
    if policy == "error":
        worst = over[np.argsort(-alone[over], kind="stable")]
        described = _offenders(worst, alone, sizes, positions, label, describe)
        what = f"exceed{'s' if over.size == 1 else ''} a limit" if describe is not None else f"cost more than the budget {budget:g}"
        raise ValueError(
            f"{over.size} {noun}{'s' if over.size > 1 else ''} {what} even alone; largest: {described}. "
            "Pass oversized='single' to give each its own batch, or oversized='skip' to leave "
            f"them out (they are counted in the {counted_in})."
        )
    return Screened(over.astype(np.int64), kept_positions(alone, budget))


def kept_positions(alone: FloatArray, budget: float) -> IntArray:
    """The positions a ``"skip"`` screen keeps: those whose cost alone is within ``budget``.

    >>> kept_positions(np.array([3.0, 12.0, 5.0]), 10.0).tolist()
    [0, 2]
    """
    return np.flatnonzero(alone <= budget).astype(np.int64, copy=False)


def _offenders(
    worst: IntArray,
    alone: FloatArray,
    sizes: NDArray[np.float64] | None,
    positions: IntArray | None,
    label: str,
    describe: Callable[[int], str] | None = None,
) -> str:
    """'index 2 (cost 208.0, size 8.0), ...': the size is left out where it equals the cost."""
    shown = []
    for k in worst[:SHOWN]:
        if describe is not None:
            shown.append(f"{label} {int(k if positions is None else positions[k])} ({describe(int(k))})")
            continue
        cost = float(alone[k])
        what = f"cost {cost}"
        if sizes is not None:
            size = np.asarray(sizes[k], dtype=np.float64)
            if size.ndim:
                what += f", size ({', '.join(str(float(x)) for x in size)})"
            elif float(size) != cost:
                what += f", size {float(size)}"
        shown.append(f"{label} {int(k if positions is None else positions[k])} ({what})")
    more = worst.size - SHOWN
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def planning_budget(budget: float, integral: bool) -> float:
    """The budget the kernels plan against: ``budget`` for whole-number sizes, else a hair lower.

    Kernels add sizes in another order than the batch measurements do: with fractional sizes
    a budget one part in 1e12 lower keeps rounding from pushing a measured batch over it.
    Whole numbers add exactly up to ``2**53``, so below it every cost that fits is exact and
    every one that does not rounds to more than the budget; a budget of ``2**53`` or more takes
    the margin too (there ``2**53 + 1`` rounds to ``2**53``).

    >>> planning_budget(2.0**53 - 2, integral=True) == 2.0**53 - 2, planning_budget(2.0**53, integral=True) < 2.0**53
    (True, True)
    """
    return budget if integral and budget < EXACT_SUMS else budget * (1.0 - ROUNDING_MARGIN)
