"""Least squares, prediction margins and plain-data plumbing shared by the memory models.

Both models (:mod:`fitbatch.memory._batch_model`, :mod:`fitbatch.memory._size_model`) fit
*relative* errors and evaluate to an upper prediction bound: the mean times ``1 + margin``,
where :func:`_margin` is the one-sided Student-t prediction bound of the relative residuals,
never less than the largest under-prediction seen while fitting.

>>> round(_t_quantile(0.975, 2), 6)
4.302653
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import statistics
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from fitbatch.costs import FloatArray

logger = logging.getLogger("fitbatch.memory.model")  # the models' logger, as before the split

MODEL_VERSION = 1


# ---------------------------------------------------------------------------------- fitting


def _t_quantile(p: float, dof: int) -> float:
    """One-sided Student-t quantile (exact for 1 and 2 degrees of freedom, Cornish-Fisher above)."""
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    v = float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def _relative_nnls(design: FloatArray, peaks: FloatArray) -> FloatArray:
    """Non-negative coefficients minimising the squared *relative* error.

    With at most four columns every subset of free coefficients is tried: the best feasible
    unconstrained fit over the subsets is the exact non-negative least-squares optimum.
    """
    a = design / peaks[:, None]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    b = np.ones(len(peaks))
    best, best_err = np.zeros(a.shape[1]), float(b @ b)
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            sol = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            if np.any(sol < 0):
                continue
            err = float(np.sum((a[:, cols] @ sol - b) ** 2))
            if err < best_err - 1e-15:
                best, best_err = np.zeros(a.shape[1]), err
                best[list(cols)] = sol
    return best / scale


def _margin(peaks: FloatArray, predicted: FloatArray, n_params: int, confidence: float) -> float:
    """Relative margin making ``predicted * (1 + margin)`` an upper prediction bound."""
    n = len(peaks)
    with np.errstate(over="ignore", divide="ignore"):
        low = np.flatnonzero(~(peaks / np.maximum(predicted, np.finfo(np.float64).tiny) < 1e9))
    if low.size:  # a prediction near 0 under a measured peak: no useful margin covers it
        i = int(low[0])
        raise ValueError(
            f"the fit predicts {float(predicted[i]):g} at measurement {i}, whose peak is {float(peaks[i]):g}: "
            "no margin makes that an upper bound; fit a lower degree, or measure more sizes"
        )
    pred = np.maximum(predicted, np.finfo(np.float64).tiny)
    dof = n - n_params
    stat = 0.0
    if dof >= 1:
        s = math.sqrt(float(np.sum(((peaks - pred) / peaks) ** 2)) / dof)
        stat = _t_quantile(confidence, dof) * s * math.sqrt(1 + n_params / n)
    else:
        logger.warning(
            "memory model fitted with %d points for %d coefficients: no residual margin",
            n,
            n_params,
        )
    margin = max(stat, float(np.max(peaks / pred - 1.0)), 0.0)
    # round *up* to 1e-9 (a byte per GB) so exact fits read 0.0 and the bound still covers them
    return 0.0 if margin < 1e-12 else math.ceil(margin * 1e9) / 1e9


def _tidy(value: float) -> float:
    """12 significant digits: exact data gives exact-looking coefficients (1000.0, not 999.9999999)."""
    return float(f"{value:.12g}")


def _points(
    name: str, values: ArrayLike, n: int | None = None, *, positive: bool = False
) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if n is not None and len(arr) != n:
        raise ValueError(f"{name} has {len(arr)} values, expected {n} (one per measurement)")
    bad = np.flatnonzero(~np.isfinite(arr) | ((arr <= 0) if positive else (arr < 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{name} must be finite and {'> 0' if positive else '>= 0'}; {name}[{i}] = {float(arr[i])!r}"
        )
    return arr


class _FittedModel:
    """Shared plain-data plumbing of the fitted models."""

    name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        fields["samples"] = [list(s) for s in fields["samples"]]
        return {"kind": self.name, "version": MODEL_VERSION, **fields}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_dict` as JSON; read it back with :func:`load_memory_model`."""
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=1)

    def plot(self, path: str | os.PathLike[str], *, title: str | None = None) -> None:
        """Draw measured against predicted peaks (mean and upper bound) into an image file.

        Needs matplotlib (the ``plot`` extra).

        Raises:
            ImportError: if matplotlib is not installed.
            ValueError: if the model holds no samples.
        """
        measured, mean, upper = self._fit_table()
        if len(measured) == 0:
            raise ValueError("this model holds no samples to plot")
        try:
            from matplotlib.figure import Figure
        except ImportError as exc:
            raise ImportError("model.plot needs matplotlib: pip install 'fitbatch[plot]'") from exc
        fig = Figure(figsize=(5, 5))
        ax = fig.add_subplot()
        top = float(max(measured.max(), upper.max())) * 1.05
        ax.plot([0, top], [0, top], color="grey", lw=1, label="exact")
        ax.scatter(measured, mean, s=12, label="mean prediction")
        ax.scatter(measured, upper, s=12, marker="^", label=f"upper bound (+{self.margin:.1%})")  # type: ignore[attr-defined]
        ax.set(
            xlabel="measured peak (bytes)",
            ylabel="predicted peak (bytes)",
            title=title or self.name,
        )
        ax.legend()
        fig.savefig(path, dpi=100, bbox_inches="tight")

    def _fit_table(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        raise NotImplementedError


def _check_dict(data: dict[str, Any], cls: type) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError(f"expected a dict from to_dict(), got {type(data).__name__}")
    if data.get("kind") != cls.name:  # type: ignore[attr-defined]
        raise ValueError(f"expected kind {cls.name!r}, got {data.get('kind')!r}")  # type: ignore[attr-defined]
    if data.get("version") != MODEL_VERSION:
        raise ValueError(
            f"unsupported memory model version {data.get('version')!r}; expected {MODEL_VERSION}"
        )
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names - {"kind", "version"}
    if unknown:
        raise ValueError(
            f"unknown keys {sorted(unknown)} for {cls.__name__}; expected {sorted(names)}"
        )
    return {k: v for k, v in data.items() if k in names}
