"""``PolynomialRegression``: the memory model of bionemo-size-aware-batching's pre-release.

The released 1.0.0 has no ``memory_model`` module (it was removed before the release); this
one is kept for code written against the pre-release. It is
:class:`fitbatch.memory.PolynomialRegression` (an ``nn.Module`` whose coefficients are buffers,
so in its ``state_dict``) with the pre-release's argument checks on ``fit``, and
``to_cost_model()`` turns it into a cost model to plan with.

>>> import torch
>>> from fitbatch.compat.bionemo import PolynomialRegression
>>> model = PolynomialRegression(1)
>>> model.fit(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 5.0, 7.0]))
>>> model(torch.tensor([4.0])).round().tolist()
[9.0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["PolynomialRegression"]


def _fit_checked(base: Any) -> Callable[[Any, torch.Tensor, torch.Tensor], None]:
    import torch

    def fit(self: Any, x: torch.Tensor, y: torch.Tensor) -> None:
        """Fit to points ``(x, y)`` (1-D floating-point tensors of one length)."""
        for name, t in (("x", x), ("y", y)):
            if not isinstance(t, torch.Tensor) or t.ndim != 1:
                raise TypeError(f"{name} must be a 1D tensor, got {type(t).__name__} of shape {getattr(t, 'shape', None)}")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x and y must have the same number of samples, got {x.shape[0]} and {y.shape[0]}")
        for name, t in (("x", x), ("y", y)):
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating point tensor, got dtype {t.dtype}")
        base.fit(self, x, y)

    return fit


if TYPE_CHECKING:
    PolynomialRegression: Any
else:

    def __getattr__(name: str) -> Any:
        # an nn.Module costs importing torch: paid on first use of the class only
        if name != "PolynomialRegression":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from fitbatch import memory

        base = memory.PolynomialRegression
        attrs = {"__module__": __name__, "__qualname__": name, "__doc__": base.__doc__, "fit": _fit_checked(base)}
        cls = type(name, (base,), attrs)
        globals()[name] = cls
        return cls
