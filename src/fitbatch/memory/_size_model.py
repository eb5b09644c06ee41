"""The size memory model: a 1-D polynomial of one sample's size, and its ``torch.nn.Module`` form.

A :class:`SizeMemoryModel` (the seed tool's ``PolynomialRegression``) is fitted
(:func:`fit_size_model`) on inputs mapped to [-1, 1] so that degree 6 is as accurate as
degree 1; a batch costs ``count * p(padded length)``. :func:`_polynomial_regression_class`
builds the ``PolynomialRegression`` module class on first use, so that importing needs no torch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fitbatch._validate import fraction
from fitbatch.costs import CostModel, FloatArray, _reduce_length
from fitbatch.memory._fit import _check_dict, _FittedModel, _margin, _points

if TYPE_CHECKING:
    import torch



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
    superadditive: ClassVar[bool] = True  # count * predict(longest) >= the sum of predictions

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


# ------------------------------------------------------------------------------ torch glue


_POLYNOMIAL_REGRESSION_DOC = """The seed tool's module: a polynomial of a sample's size, coefficients in buffers.

    ``forward(x)`` evaluates the mean polynomial (as the seed did); ``fit(x, y)`` fits it
    with :func:`fit_size_model`; :meth:`to_cost_model` returns the
    :class:`SizeMemoryModel` to plan with. ``state_dict()`` holds ``coef``, ``domain``,
    ``margin`` and ``confidence``, so ``torch.save``/``load_state_dict`` round-trip it.

    Args:
        degree: the polynomial degree, 0 to 12.

    Raises:
        ValueError: for a degree outside 0 to 12, or (``load_model``) a model of another degree.

    >>> import torch
    >>> from fitbatch.memory import PolynomialRegression
    >>> module = PolynomialRegression(degree=1)
    >>> module.fit(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([3.0, 5.0, 7.0, 9.0]))
    >>> module(torch.tensor([10.0]))
    tensor([21.], dtype=torch.float64)
    >>> sorted(module.state_dict())
    ['coef', 'confidence', 'domain', 'margin']
    >>> module.to_cost_model().predict([10]).round(6).tolist()
    [21.0]
    """

# The class is built on first use (it subclasses torch.nn.Module), so doctest cannot find its
# docstring by walking the module: run it from here.
__test__ = {"PolynomialRegression": _POLYNOMIAL_REGRESSION_DOC}


_MODULE_CLASS: list[type] = []


def _polynomial_regression_class() -> Any:
    """Build (once) the ``torch.nn.Module`` class; deferred so that importing needs no torch."""
    if _MODULE_CLASS:
        return _MODULE_CLASS[0]
    import torch

    class PolynomialRegression(torch.nn.Module):
        __doc__ = _POLYNOMIAL_REGRESSION_DOC

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
