"""Memory models: cost models whose coefficients are least-squares fits of measured peaks.

Two shapes of model, both :class:`~fitbatch.costs.CostModel` so the planner can budget in bytes:

* :class:`BatchMemoryModel` — ``peak ≈ fixed + count * (linear + per_token * L + quadratic * L**2)``
  over (batch count, padded length L): a :class:`~fitbatch.costs.PaddedPolynomial`, fitted
  (:func:`fit_batch_model`) from peaks of whole training steps.
* :class:`SizeMemoryModel` — a 1-D polynomial of one sample's size (the seed tool's
  ``PolynomialRegression``), fitted (:func:`fit_size_model`) on inputs mapped to [-1, 1] so that
  degree 6 is as accurate as degree 1. A batch costs ``count * p(padded length)``.

Both fit *relative* errors (memory spans orders of magnitude, and a 5 % error is what matters),
and both evaluate to an **upper prediction bound**, not the mean: the mean times ``1 + margin``
where the margin is the one-sided Student-t prediction bound of the relative residuals at
``confidence``, and never less than the largest under-prediction seen while fitting. Models
are plain data: ``to_dict``/``save``/:func:`load_memory_model`; the size model also converts to
and from a ``torch.nn.Module`` whose buffers hold its coefficients.

>>> import numpy as np
>>> counts = np.array([1, 2, 4, 8, 1, 2, 4, 1, 2])
>>> lengths = np.array([64, 64, 64, 64, 256, 256, 256, 1024, 1024])
>>> peaks = 1000 + counts * (50 + 3.0 * lengths + 0.01 * lengths**2)
>>> model = fit_batch_model(counts, lengths, peaks)
>>> [round(v, 6) for v in (model.mean.fixed, model.mean.per_token, model.mean.quadratic)]
[1000.0, 3.0, 0.01]
>>> float(model.evaluate(np.array([2]), np.array([100]), np.array([150]))[0])
1900.0
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import statistics
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fitbatch._validate import fraction
from fitbatch.costs import CostModel, FloatArray, PaddedPolynomial, _reduce_length

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

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


# -------------------------------------------------------------------------- batch model


@dataclasses.dataclass(frozen=True)
class BatchMemoryModel(_FittedModel, PaddedPolynomial):
    """Fitted ``fixed + count * (linear + per_token * L + quadratic * L**2)``, as an upper bound.

    The four coefficients are the upper bound's (the fitted mean times ``1 + margin``), so the
    model is a :class:`~fitbatch.costs.PaddedPolynomial` that plans in bytes with the closed-form
    ``max_count``. Build it with :func:`fit_batch_model`.

    Attributes:
        margin: relative safety margin over the mean fit.
        confidence: the one-sided confidence of the prediction bound.
        samples: the ``(count, length, peak)`` measurements it was fitted on.

    >>> m = fit_batch_model([1, 2, 4, 1, 2], [8, 8, 8, 16, 16], [110, 120, 140, 118, 136])
    >>> m.fixed, m.margin
    (100.0, 0.0)
    >>> m.predict([3], [16]).tolist()
    [154.0]
    """

    margin: float = 0.0
    confidence: float = 0.99
    samples: tuple[tuple[float, float, float], ...] = ()
    name: ClassVar[str] = "batch_memory"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not math.isfinite(self.margin) or self.margin < 0:
            raise ValueError(f"margin must be a non-negative finite number, got {self.margin!r}")
        object.__setattr__(self, "samples", tuple(tuple(float(v) for v in s) for s in self.samples))

    @property
    def mean(self) -> PaddedPolynomial:
        """The mean fit, without the margin."""
        k = 1.0 + self.margin
        return PaddedPolynomial(
            self.fixed / k, self.linear / k, self.per_token / k, self.quadratic / k
        )

    def predict(self, counts: ArrayLike, lengths: ArrayLike, *, upper: bool = True) -> FloatArray:
        """Predicted peak bytes of batches of ``counts`` samples padded to ``lengths``."""
        c = np.asarray(counts, dtype=np.float64)
        length = np.asarray(lengths, dtype=np.float64)
        model: PaddedPolynomial = self if upper else self.mean
        return model.fixed + c * model.per_sample(length)

    def refit(self, counts: ArrayLike, lengths: ArrayLike, peaks: ArrayLike) -> BatchMemoryModel:
        """A new model fitted on this model's samples plus the given ones.

        Feed it peaks measured during training, or a batch that ran out of memory with the
        capacity as its peak (a lower bound of its true peak): the new upper bound is at least
        every sample, so the planner will not build that batch again under that budget.
        """
        c, length = np.atleast_1d(counts), np.atleast_1d(lengths)
        old = np.asarray(self.samples, dtype=np.float64).reshape(-1, 3)
        return fit_batch_model(
            np.concatenate([old[:, 0], np.asarray(c, dtype=np.float64)]),
            np.concatenate([old[:, 1], np.asarray(length, dtype=np.float64)]),
            np.concatenate([old[:, 2], np.atleast_1d(np.asarray(peaks, dtype=np.float64))]),
            confidence=self.confidence,
        )

    def _fit_table(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        s = np.asarray(self.samples, dtype=np.float64).reshape(-1, 3)
        return s[:, 2], self.predict(s[:, 0], s[:, 1], upper=False), self.predict(s[:, 0], s[:, 1])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchMemoryModel:
        """Inverse of :meth:`to_dict`."""
        fields = _check_dict(data, cls)
        fields["samples"] = tuple(tuple(s) for s in fields.get("samples", ()))
        if fields.get("weights") is not None:
            fields["weights"] = tuple(fields["weights"])
        return cls(**fields)


def fit_batch_model(
    counts: ArrayLike, lengths: ArrayLike, peaks: ArrayLike, *, confidence: float = 0.99
) -> BatchMemoryModel:
    """Fit ``peak ≈ fixed + count * (linear + per_token * L + quadratic * L**2)`` by least squares.

    Coefficients are non-negative (memory never shrinks with a bigger batch) and minimise the
    squared relative error.

    Args:
        counts: samples per measured batch.
        lengths: padded length L of each measured batch.
        peaks: peak bytes measured for each batch (> 0).
        confidence: one-sided confidence of the upper prediction bound, in (0.5, 1).

    Returns:
        A :class:`BatchMemoryModel` evaluating to the upper bound.

    Raises:
        ValueError: on mismatched lengths, fewer than 4 measurements, or invalid values.

    >>> m = fit_batch_model([1, 2, 1, 2, 4], [10, 10, 20, 20, 20], [7, 9, 9, 13, 21])
    >>> m.mean.fixed, m.mean.per_token
    (5.0, 0.2)
    """
    y = _points("peaks", peaks, positive=True)
    c = _points("counts", counts, len(y), positive=True)
    length = _points("lengths", lengths, len(y))
    confidence = fraction("confidence", confidence, low=0.5, high=1.0)
    if confidence >= 1.0 or confidence <= 0.5:
        raise ValueError(f"confidence must be strictly between 0.5 and 1, got {confidence!r}")
    if len(y) < 4:
        raise ValueError(
            f"fit_batch_model needs at least 4 measurements (5+ for a margin), got {len(y)}"
        )
    design = np.column_stack([np.ones_like(c), c, c * length, c * length**2])
    coef = _relative_nnls(design, y)
    margin = _margin(y, design @ coef, int(np.count_nonzero(coef)), confidence)
    fixed, linear, per_token, quadratic = (_tidy(v * (1.0 + margin)) for v in coef)
    return BatchMemoryModel(
        fixed=fixed,
        linear=linear,
        per_token=per_token,
        quadratic=quadratic,
        margin=margin,
        confidence=confidence,
        samples=tuple(zip(c.tolist(), length.tolist(), y.tolist(), strict=True)),
    )


# --------------------------------------------------------------------------- size model


@dataclasses.dataclass(frozen=True)
class SizeMemoryModel(_FittedModel, CostModel):
    """Fitted polynomial of one sample's size, on inputs mapped from ``domain`` to [-1, 1].

    ``predict(size)`` is the polynomial made non-decreasing (its exact running maximum over the
    fitted domain, clamped at 0; below the domain the value at its start; above it a quadratic
    continuation with non-negative slope and curvature) times ``1 + margin``. As a cost model a
    batch costs ``count * predict(padded length)``, which bounds the seed tool's sum of
    per-sample predictions. Build it with :func:`fit_size_model`.

    Attributes:
        coef: mean coefficients in the mapped variable, lowest degree first.
        domain: the (min, max) size the fit saw; mapped to (-1, 1).
        margin: relative safety margin over the mean.
        confidence: the one-sided confidence of the prediction bound.
        samples: the ``(size, peak)`` measurements it was fitted on.

    >>> sizes = np.arange(10, 200, 10)
    >>> m = fit_size_model(sizes, 500 + 2 * sizes + 0.05 * sizes**2, degree=2)
    >>> m.predict([100], upper=False).round(6).tolist()
    [1200.0]
    >>> m.evaluate(np.array([3]), np.array([100]), np.array([250])).round(6).tolist()
    [3600.0]
    """

    coef: tuple[float, ...] = (0.0,)
    domain: tuple[float, float] = (0.0, 1.0)
    margin: float = 0.0
    confidence: float = 0.99
    samples: tuple[tuple[float, float], ...] = ()
    name: ClassVar[str] = "size_memory"

    def __post_init__(self) -> None:
        coef = tuple(float(v) for v in self.coef)
        lo, hi = (float(v) for v in self.domain)
        if not coef or not all(math.isfinite(v) for v in coef):
            raise ValueError(f"coef must be a non-empty tuple of finite numbers, got {self.coef!r}")
        if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
            raise ValueError(f"domain must be (min, max) with min < max, got {self.domain!r}")
        if not math.isfinite(self.margin) or self.margin < 0:
            raise ValueError(f"margin must be a non-negative finite number, got {self.margin!r}")
        object.__setattr__(self, "coef", coef)
        object.__setattr__(self, "domain", (lo, hi))
        object.__setattr__(self, "samples", tuple(tuple(float(v) for v in s) for s in self.samples))
        # the running maximum of a polynomial over [lo, x] is reached at lo, at x, or at an
        # interior critical point <= x: keep those points and their cumulative maximum
        pp = np.polynomial.polynomial
        roots = pp.polyroots(pp.polyder(coef)) if len(coef) > 2 else np.array([])
        roots = np.sort(roots[np.abs(np.imag(roots)) < 1e-9].real)
        roots = roots[(roots > -1) & (roots < 1)]
        points = np.concatenate([[lo], lo + (roots + 1) * (hi - lo) / 2])
        running = np.maximum.accumulate(self.raw(points))
        top = max(float(running[-1]), float(self.raw(hi)), 0.0)
        poly = np.polynomial.Polynomial(coef, domain=[lo, hi], window=[-1, 1])
        d1 = float(poly.deriv(1)(hi)) if len(coef) > 1 else 0.0
        d2 = float(poly.deriv(2)(hi)) if len(coef) > 2 else 0.0
        object.__setattr__(
            self, "_envelope", (points, running, top, max(d1, 0.0), max(d2 / 2, 0.0))
        )

    @property
    def degree(self) -> int:
        return len(self.coef) - 1

    def raw(self, sizes: ArrayLike) -> FloatArray:
        """The fitted mean polynomial itself (no envelope, no margin), as the seed evaluates it."""
        x = np.asarray(sizes, dtype=np.float64)
        lo, hi = self.domain
        return np.asarray(
            np.polynomial.polynomial.polyval((2 * x - lo - hi) / (hi - lo), self.coef),
            dtype=np.float64,
        )

    def predict(self, sizes: ArrayLike, *, upper: bool = True) -> FloatArray:
        """Predicted peak bytes of one sample of each size (non-decreasing in size)."""
        x = np.asarray(sizes, dtype=np.float64)
        points, running, top, slope, curve = self._envelope  # type: ignore[attr-defined]
        lo, hi = self.domain
        inside = np.clip(x, lo, hi)
        before = running[np.searchsorted(points, inside, side="right") - 1]
        out = np.maximum(np.maximum(self.raw(inside), before), 0.0)
        d = np.maximum(x - hi, 0.0)
        out = np.where(x > hi, top + d * (slope + curve * d), out)
        return out * (1.0 + self.margin) if upper else out

    def evaluate(
        self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]
    ) -> FloatArray:
        return np.asarray(count, dtype=np.float64) * self.predict(_reduce_length(max_size, None))

    def refit(self, sizes: ArrayLike, peaks: ArrayLike) -> SizeMemoryModel:
        """A new model of the same degree fitted on this model's samples plus the given ones."""
        old = np.asarray(self.samples, dtype=np.float64).reshape(-1, 2)
        return fit_size_model(
            np.concatenate([old[:, 0], np.atleast_1d(np.asarray(sizes, dtype=np.float64))]),
            np.concatenate([old[:, 1], np.atleast_1d(np.asarray(peaks, dtype=np.float64))]),
            degree=self.degree,
            confidence=self.confidence,
        )

    def to_module(self) -> torch.nn.Module:
        """A :class:`PolynomialRegression` module whose buffers hold this model (needs torch)."""
        module = _polynomial_regression_class()(self.degree)
        module.load_model(self)
        return module  # type: ignore[no-any-return]

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> SizeMemoryModel:
        """Rebuild from a :class:`PolynomialRegression` (or its ``state_dict`` loaded into one)."""
        state = module.state_dict()
        missing = {"coef", "domain", "margin", "confidence"} - set(state)
        if missing:
            raise ValueError(
                f"module {type(module).__name__} has no buffers {sorted(missing)}; expected a PolynomialRegression"
            )
        return cls(
            coef=tuple(state["coef"].tolist()),
            domain=tuple(state["domain"].tolist()),  # type: ignore[arg-type]
            margin=float(state["margin"]),
            confidence=float(state["confidence"]),
        )

    def _fit_table(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        s = np.asarray(self.samples, dtype=np.float64).reshape(-1, 2)
        return s[:, 1], self.predict(s[:, 0], upper=False), self.predict(s[:, 0])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SizeMemoryModel:
        """Inverse of :meth:`to_dict`."""
        fields = _check_dict(data, cls)
        fields["coef"] = tuple(fields.get("coef", (0.0,)))
        fields["domain"] = tuple(fields.get("domain", (0.0, 1.0)))
        fields["samples"] = tuple(tuple(s) for s in fields.get("samples", ()))
        return cls(**fields)


def fit_size_model(
    sizes: ArrayLike, peaks: ArrayLike, *, degree: int = 2, confidence: float = 0.99
) -> SizeMemoryModel:
    """Fit a polynomial of one sample's size to measured per-sample peaks.

    Sizes are mapped to [-1, 1] before fitting (numpy's ``Polynomial.fit``), so a degree-6
    fit over sizes in the thousands stays accurate where raw powers (``size**6`` ~ 1e22) lose
    every digit. The squared relative error is minimised.

    Args:
        sizes: size of each measured sample.
        peaks: peak bytes of each (> 0).
        degree: polynomial degree, 0 to 12.
        confidence: one-sided confidence of the upper prediction bound, in (0.5, 1).

    Returns:
        A :class:`SizeMemoryModel`.

    Raises:
        ValueError: on mismatched inputs, fewer than ``degree + 1`` measurements or fewer than
            two distinct sizes.

    >>> m = fit_size_model([1, 2, 3, 4, 5, 6], [3, 5, 7, 9, 11, 13], degree=1)
    >>> m.predict([10]).round(6).tolist()
    [21.0]
    """
    y = _points("peaks", peaks, positive=True)
    x = _points("sizes", sizes, len(y))
    if isinstance(degree, bool) or not isinstance(degree, int) or not 0 <= degree <= 12:
        raise ValueError(f"degree must be an int in [0, 12], got {degree!r}")
    confidence = fraction("confidence", confidence, low=0.5, high=1.0)
    if confidence >= 1.0 or confidence <= 0.5:
        raise ValueError(f"confidence must be strictly between 0.5 and 1, got {confidence!r}")
    if len(y) < degree + 1:
        raise ValueError(
            f"a degree-{degree} fit needs at least {degree + 1} measurements, got {len(y)}"
        )
    if len(np.unique(x)) < 2:
        raise ValueError(
            f"fit_size_model needs at least two distinct sizes, got only {np.unique(x).tolist()}"
        )
    poly = np.polynomial.Polynomial.fit(x, y, degree, w=1.0 / y)
    coef = np.zeros(degree + 1)
    coef[: len(poly.coef)] = poly.coef
    lo, hi = (float(v) for v in poly.domain)
    model = SizeMemoryModel(coef=tuple(coef.tolist()), domain=(lo, hi), confidence=confidence)
    margin = _margin(y, model.predict(x, upper=False), degree + 1, confidence)
    return dataclasses.replace(
        model, margin=margin, samples=tuple(zip(x.tolist(), y.tolist(), strict=True))
    )


# ------------------------------------------------------------------- loading and torch glue


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


_MODELS: dict[str, Any] = {
    BatchMemoryModel.name: BatchMemoryModel,
    SizeMemoryModel.name: SizeMemoryModel,
}


def load_memory_model(
    source: str | os.PathLike[str] | dict[str, Any],
) -> BatchMemoryModel | SizeMemoryModel:
    """Load a model saved with ``model.save(path)`` (or given as its ``to_dict()``).

    >>> m = fit_size_model([1, 2, 3], [2, 4, 6], degree=1)
    >>> load_memory_model(m.to_dict()) == m
    True
    """
    if isinstance(source, dict):
        data = source
    else:
        with open(source, encoding="utf-8") as fh:
            data = json.load(fh)
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in _MODELS:
        raise ValueError(f"unknown memory model kind {kind!r}; expected one of {tuple(_MODELS)}")
    return _MODELS[kind].from_dict(data)  # type: ignore[no-any-return]


_MODULE_CLASS: list[type] = []


def _polynomial_regression_class() -> Any:
    """Build (once) the ``torch.nn.Module`` class; deferred so that importing needs no torch."""
    if _MODULE_CLASS:
        return _MODULE_CLASS[0]
    import torch

    class PolynomialRegression(torch.nn.Module):
        """The seed tool's module: a polynomial of a sample's size, coefficients in buffers.

        ``forward(x)`` evaluates the mean polynomial (as the seed did); ``fit(x, y)`` fits it
        with :func:`fit_size_model`; :meth:`to_cost_model` returns the
        :class:`SizeMemoryModel` to plan with. ``state_dict()`` holds ``coef``, ``domain``,
        ``margin`` and ``confidence``, so ``torch.save``/``load_state_dict`` round-trip it.
        """

        coef: torch.Tensor
        domain: torch.Tensor
        margin: torch.Tensor
        confidence: torch.Tensor

        def __init__(self, degree: int) -> None:
            super().__init__()
            if isinstance(degree, bool) or not isinstance(degree, int) or not 0 <= degree <= 12:
                raise ValueError(f"degree must be an int in [0, 12], got {degree!r}")
            self.degree = degree
            self.register_buffer("coef", torch.zeros(degree + 1, dtype=torch.float64))
            self.register_buffer("domain", torch.tensor([0.0, 1.0], dtype=torch.float64))
            self.register_buffer("margin", torch.tensor(0.0, dtype=torch.float64))
            self.register_buffer("confidence", torch.tensor(0.99, dtype=torch.float64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            lo, hi = self.domain[0], self.domain[1]
            t = (2 * x.to(torch.float64) - lo - hi) / (hi - lo)
            out = torch.zeros_like(t)
            for c in self.coef.flip(0):  # Horner
                out = out * t + c
            return out

        def fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
            self.load_model(
                fit_size_model(
                    x.detach().cpu().numpy(), y.detach().cpu().numpy(), degree=self.degree
                )
            )

        def load_model(self, model: SizeMemoryModel) -> None:
            if model.degree != self.degree:
                raise ValueError(
                    f"model has degree {model.degree}, this module degree {self.degree}"
                )
            with torch.no_grad():
                self.coef.copy_(torch.tensor(model.coef, dtype=torch.float64))
                self.domain.copy_(torch.tensor(model.domain, dtype=torch.float64))
                self.margin.fill_(model.margin)
                self.confidence.fill_(model.confidence)

        def to_cost_model(self) -> SizeMemoryModel:
            return SizeMemoryModel.from_module(self)

    _MODULE_CLASS.append(PolynomialRegression)
    return PolynomialRegression


def __getattr__(name: str) -> Any:
    if name == "PolynomialRegression":
        return _polynomial_regression_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
