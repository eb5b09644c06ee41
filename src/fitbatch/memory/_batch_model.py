"""The batch memory model: ``peak ≈ fixed + count * (linear + per_token * L + quadratic * L**2)``.

A :class:`BatchMemoryModel` is a :class:`~fitbatch.costs.PaddedPolynomial` over (batch count,
padded length L) whose coefficients are the upper prediction bound of a non-negative
least-squares fit (:func:`fit_batch_model`) of peaks measured for whole training steps.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from fitbatch._validate import fraction
from fitbatch.costs import FloatArray, PaddedPolynomial
from fitbatch.memory._fit import _check_dict, _FittedModel, _margin, _points, _relative_nnls, _tidy


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
