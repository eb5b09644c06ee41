"""Cost models: what one batch costs, from (count, max size, sum of sizes).

A cost model holds configuration only and evaluates whole arrays at once: the planning kernels
keep the running totals and ask the model for the cost of many candidate batches in one call.
Every model must be non-decreasing in count, in each component of the max size and in each
component of the sum; that is what makes greedy planning and budgets meaningful.

Sizes may be 1-D (one number per sample) or D-dimensional (an ``(N, D)`` array: image shapes,
encoder/decoder lengths). For D-dimensional sizes ``max_size`` and ``sum_size`` are ``(k, D)``
arrays and a model reduces them to one padded *length* per batch: the product of the
per-dimension maxima (a padded volume), or a weighted sum when ``weights`` are given.

>>> import numpy as np
>>> padded = resolve_cost("padded")
>>> padded.evaluate(np.array([4, 2]), np.array([10.0, 50.0]), np.array([30.0, 60.0]))
array([ 40., 100.])
>>> resolve_cost("sum").evaluate(np.array([4]), np.array([10.0]), np.array([30.0]))
array([30.])
"""

from __future__ import annotations

import dataclasses
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fitbatch._validate import choice

FloatArray = NDArray[np.float64]


def _reduce_length(max_size: NDArray[Any], weights: tuple[float, ...] | None, model: Any = None) -> FloatArray:
    """One padded length per batch: 1-D as is; D-dim as product, or weighted sum of maxima.

    ``model`` (whose weights these are) is named when the weights do not match the sizes.
    """
    m = np.asarray(max_size, dtype=np.float64)
    if m.ndim <= 1:
        return m
    w = _weights_for(weights, m.shape[-1], model)
    return np.prod(m, axis=-1) if w is None else m @ w


def _reduce_sum(sum_size: NDArray[Any], weights: tuple[float, ...] | None, model: Any = None) -> FloatArray:
    s = np.asarray(sum_size, dtype=np.float64)
    if s.ndim <= 1:
        return s
    w = _weights_for(weights, s.shape[-1], model)
    return s.sum(axis=-1) if w is None else s @ w


def _weights_for(weights: tuple[float, ...] | None, d: int, model: Any) -> FloatArray | None:
    """The weights as an array, or ``ValueError`` when they do not match D size dimensions."""
    if weights is None:
        return None
    if len(weights) != d:
        owner = repr(model) if model is not None else f"weights={weights!r}"
        raise ValueError(
            f"{owner} has {len(weights)} weight{'s' if len(weights) > 1 else ''} but the sizes have "
            f"D={d} dimensions (shape (N, {d})); pass one weight per dimension, or weights=None"
        )
    return np.asarray(weights, dtype=np.float64)


def _check_weights(weights: Sequence[float] | None) -> tuple[float, ...] | None:
    if weights is None:
        return None
    w = tuple(float(x) for x in weights)
    if not w or any(not np.isfinite(x) or x < 0 for x in w):
        raise ValueError(f"weights must be non-negative finite numbers, got {weights!r}")
    return w


class CostModel(ABC):
    """Base class of cost models.

    Subclasses implement :meth:`evaluate`; a model whose cost does not depend on the sum of
    sizes may also implement :meth:`max_count` (a closed form the sorted kernels use instead of
    a search). Models are immutable and compare by value: make a subclass a frozen dataclass
    of its configuration, and set the class variable ``name`` (used by :meth:`to_dict`).
    What a subclass defined outside fitbatch returns is checked on every call: one finite
    cost >= 0 per batch, else a ``ValueError`` naming the model and the batch.

    >>> import dataclasses
    >>> import numpy as np
    >>> @dataclasses.dataclass(frozen=True)
    ... class PaddedPlusOverhead(CostModel):
    ...     overhead: float = 8.0                # size units each sample costs on top
    ...     name = "padded+overhead"
    ...     def evaluate(self, count, max_size, sum_size):
    ...         return np.asarray(count, dtype=np.float64) * (max_size + self.overhead)
    >>> model = PaddedPlusOverhead()
    >>> model.evaluate(np.array([2, 3]), np.array([10.0, 4.0]), np.array([15.0, 9.0]))
    array([36., 36.])
    >>> model.sample_cost(np.array([5.0, 1.0]))
    array([13.,  9.])
    >>> model.to_dict()
    {'kind': 'padded+overhead', 'overhead': 8.0}
    >>> resolve_cost(model) is model
    True
    """

    name: ClassVar[str] = "custom"
    #: whether the cost grows with the padded (max) size; packing ignores max-only savings
    uses_max: ClassVar[bool] = True
    #: whether results are checked on every call (one finite cost >= 0 per batch, else a
    #: ``ValueError`` naming the model and the batch): true of every model written outside
    #: fitbatch and of :class:`FunctionCost`; the built-ins' results follow from validated input
    checked: ClassVar[bool] = True
    #: whether the model is non-decreasing by construction (the built-ins), so that
    #: :func:`resolve_cost` does not probe it; the subclasses of such a model inherit it
    monotone: ClassVar[bool] = False
    #: whether a batch costs at least its fixed part (an empty batch's cost) plus each sample's
    #: cost alone less that part, as the built-ins do: then ``PlanStats.lower_bound`` divides
    #: the samples' costs by the budget, else it is 1. A subclass that overrides ``evaluate``
    #: outside fitbatch is not, unless it says so in its class body
    superadditive: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "checked" not in cls.__dict__:
            cls.checked = not cls.__module__.startswith("fitbatch.")
        if "superadditive" not in cls.__dict__ and "evaluate" in cls.__dict__ and cls.checked:
            cls.superadditive = False  # a cost of its own: nothing known beyond monotone
        if cls.checked:
            for method in ("evaluate", "sample_cost"):
                own = cls.__dict__.get(method)
                if own is not None and not getattr(own, "__isabstractmethod__", False):
                    setattr(cls, method, _checking(own, method))

    @abstractmethod
    def evaluate(self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]) -> FloatArray:
        """Cost of each batch, as a float64 array shaped like ``count``."""

    def max_count(self, max_size: NDArray[Any], budget: float) -> FloatArray | None:
        """Largest (real-valued) count whose cost fits ``budget`` for batches of this max size.

        Return ``None`` when the cost depends on the sum of sizes (the kernels then search).
        """
        return None

    def sample_cost(self, sizes: NDArray[Any]) -> FloatArray:
        """Cost of each sample alone (a batch of one). The result may share memory with
        ``sizes``: treat it as read-only."""
        sizes = np.asarray(sizes, dtype=np.float64)
        return self.evaluate(np.broadcast_to(np.float64(1.0), sizes.shape[:1]), sizes, sizes)

    def order_cost(self, sizes: NDArray[Any]) -> FloatArray:
        """What the sorting strategies sort ``(N, D)`` rows by: :meth:`sample_cost` unless a
        model knows a key that groups better (:class:`~fitbatch.costs.Limits`: its padded columns)."""
        return self.sample_cost(sizes)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able description (used in state dicts and reports)."""
        fields: dict[str, Any] = dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}
        return {"kind": self.name, **fields}


# ---------------------------------------------------------------------------- checked results


def _checking(method: Callable[..., Any], kind: str) -> Callable[..., FloatArray]:
    """``method`` (a model's ``evaluate`` or ``sample_cost``) with its results checked."""
    if kind == "evaluate":

        @functools.wraps(method)
        def evaluate(self: CostModel, count: Any, max_size: Any, sum_size: Any) -> FloatArray:
            return _check_costs(self, method(self, count, max_size, sum_size), count, max_size, sum_size)

        return evaluate

    @functools.wraps(method)
    def sample_cost(self: CostModel, sizes: Any) -> FloatArray:
        count = np.ones(np.shape(sizes)[:1])
        return _check_costs(self, method(self, sizes), count, sizes, sizes, alone=True)

    return sample_cost


def _check_costs(
    model: CostModel, out: Any, count: Any, max_size: Any, sum_size: Any, *, alone: bool = False
) -> FloatArray:
    """``out`` as float64 if it holds one finite cost >= 0 per batch, else an error naming
    ``model`` and the first batch (count, max size, sum of sizes) it is wrong for.

    ``alone``: ``out`` came from ``sample_cost`` (batches of one sample each).

    >>> _check_costs(SumCost(), [3, 4], np.ones(2), np.ones(2), np.ones(2))
    array([3., 4.])
    >>> _check_costs(SumCost(), [3, float("nan")], np.ones(2), np.array([3, 4]), np.array([3, 4]))
    Traceback (most recent call last):
    ...
    ValueError: cost model SumCost(weights=None) returned NaN for a batch of (count=1, max=4, sum=4); a cost must be a finite number >= 0
    """
    method = "sample_cost" if alone else "evaluate"
    costs = _as_costs(model, out, method)
    if costs.shape != np.shape(count):
        raise ValueError(
            f"cost model {model!r} returned shape {costs.shape} from {method} for {np.size(count)} "
            f"{'samples' if alone else 'batches'}, expected shape {np.shape(count)}: one cost per "
            f"{'sample' if alone else 'batch'} (it must be vectorised over batches)"
        )
    # min and max propagate NaN: two passes tell that every cost is finite and >= 0
    if costs.size and not (costs.min() >= 0 and costs.max() < np.inf):
        bad = np.flatnonzero(~(np.isfinite(costs) & (costs >= 0)))
        i = int(bad[0])
        value = float(costs.flat[i])
        what = "NaN" if np.isnan(value) else f"{value:g}" if np.isinf(value) else f"a negative cost {value:g}"
        more = f" (and {bad.size - 1} more of the {costs.size} evaluated)" if bad.size > 1 else ""
        raise ValueError(
            f"cost model {model!r} returned {what} for a batch of "
            f"({_batch_text(count, max_size, sum_size, i)}){more}; a cost must be a finite number >= 0"
        )
    return costs


def _as_costs(model: CostModel, out: Any, method: str) -> FloatArray:
    try:
        return np.asarray(out, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cost model {model!r} returned {type(out).__name__} from {method}, not numbers: {exc}") from None


def _batch_text(count: Any, max_size: Any, sum_size: Any, i: int) -> str:
    def at(values: Any) -> str:
        arr = np.asarray(values, dtype=np.float64)
        row = arr[i] if arr.ndim and arr.shape[0] > i else arr
        return f"{float(row):.10g}" if np.ndim(row) == 0 else "[" + ", ".join(f"{v:.10g}" for v in np.ravel(row)) + "]"

    return f"count={at(count)}, max={at(max_size)}, sum={at(sum_size)}"


@dataclasses.dataclass(frozen=True)
class SumCost(CostModel):
    """Sum of sizes: packed / variable-length batches, and the seed tools' semantics.

    Args:
        weights: for ``(N, D)`` sizes, one non-negative weight per dimension: the cost is the
            weighted sum of the dimensions' sums (``None``: their plain sum).

    Raises:
        ValueError: if a weight is negative or not finite.

    >>> import numpy as np
    >>> SumCost().evaluate(np.array([2, 3]), np.array([10.0, 4.0]), np.array([15.0, 9.0]))
    array([15.,  9.])
    >>> SumCost(weights=(1.0, 0.5)).sample_cost(np.array([[4.0, 2.0], [1.0, 6.0]]))
    array([5., 4.])
    """

    weights: tuple[float, ...] | None = None
    name: ClassVar[str] = "sum"
    uses_max: ClassVar[bool] = False
    monotone: ClassVar[bool] = True
    superadditive: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", _check_weights(self.weights))

    def evaluate(self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]) -> FloatArray:
        return _reduce_sum(sum_size, self.weights, self)

    def sample_cost(self, sizes: NDArray[Any]) -> FloatArray:
        sizes = np.asarray(sizes, dtype=np.float64)
        return sizes if sizes.ndim == 1 else _reduce_sum(sizes, self.weights, self)  # read-only: no copy


@dataclasses.dataclass(frozen=True)
class PaddedCost(CostModel):
    """count x padded length: what a batch padded to its longest sample holds.

    Args:
        weights: for ``(N, D)`` sizes, the padded length is the weighted sum of the
            per-dimension maxima; ``None`` (default) takes their product, a padded volume.

    Raises:
        ValueError: if a weight is negative or not finite.

    >>> import numpy as np
    >>> PaddedCost().evaluate(np.array([2, 3]), np.array([10.0, 4.0]), np.array([15.0, 9.0]))
    array([20., 12.])
    >>> PaddedCost().max_count(np.array([10.0, 4.0]), 40.0)   # closed form: budget / length
    array([ 4., 10.])
    >>> PaddedCost().evaluate(np.array([2]), np.array([[3.0, 4.0]]), np.array([[5.0, 6.0]]))
    array([24.])
    """

    weights: tuple[float, ...] | None = None
    name: ClassVar[str] = "padded"
    monotone: ClassVar[bool] = True
    superadditive: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", _check_weights(self.weights))

    def evaluate(self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]) -> FloatArray:
        return np.asarray(count, dtype=np.float64) * _reduce_length(max_size, self.weights, self)

    def sample_cost(self, sizes: NDArray[Any]) -> FloatArray:
        sizes = np.asarray(sizes, dtype=np.float64)
        return sizes if sizes.ndim == 1 else _reduce_length(sizes, self.weights, self)  # read-only: no copy

    def max_count(self, max_size: NDArray[Any], budget: float) -> FloatArray:
        length = _reduce_length(max_size, self.weights, self)
        with np.errstate(divide="ignore", over="ignore"):  # a subnormal length: no limit (inf)
            return np.where(length > 0, budget / np.where(length > 0, length, 1.0), np.inf)


@dataclasses.dataclass(frozen=True)
class PaddedPolynomial(CostModel):
    """``fixed + count * (linear + per_token * L + quadratic * L**2)``, L the padded length.

    The shape of a transformer's training memory: a fixed part (weights, optimizer state), a
    per-sample part, activations linear in L and attention scores quadratic in L. The memory
    tools fit these coefficients from measured peaks so that budgets can be bytes.

    >>> import numpy as np
    >>> m = PaddedPolynomial(fixed=100.0, linear=1.0, per_token=2.0, quadratic=0.5)
    >>> m.evaluate(np.array([3.0]), np.array([4.0]), np.array([9.0]))
    array([151.])
    """

    fixed: float = 0.0
    linear: float = 0.0
    per_token: float = 1.0
    quadratic: float = 0.0
    weights: tuple[float, ...] | None = None
    name: ClassVar[str] = "polynomial"
    monotone: ClassVar[bool] = True
    superadditive: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for field in ("fixed", "linear", "per_token", "quadratic"):
            value = float(getattr(self, field))
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"PaddedPolynomial.{field} must be a non-negative finite number, got {value!r}")
            object.__setattr__(self, field, value)
        object.__setattr__(self, "weights", _check_weights(self.weights))

    def per_sample(self, length: NDArray[Any]) -> FloatArray:
        length = np.asarray(length, dtype=np.float64)
        return self.linear + length * (self.per_token + self.quadratic * length)

    def evaluate(self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]) -> FloatArray:
        length = _reduce_length(max_size, self.weights, self)
        return self.fixed + np.asarray(count, dtype=np.float64) * self.per_sample(length)

    def max_count(self, max_size: NDArray[Any], budget: float) -> FloatArray:
        unit = self.per_sample(_reduce_length(max_size, self.weights, self))
        room = budget - self.fixed
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # subnormal unit: inf
            out = np.where(unit > 0, room / np.where(unit > 0, unit, 1.0), np.inf)
        return np.where(room < 0, 0.0, out)


@dataclasses.dataclass(frozen=True, eq=False)
class FunctionCost(CostModel):
    """A user function ``fn(count, max_size, sum_size) -> cost`` evaluated on arrays.

    Args:
        fn: called with float64 ``count`` and the ``max_size``/``sum_size`` arrays of many
            batches at once; it must return one cost per batch (vectorised, not per batch),
            non-decreasing in each argument. Compared by identity.

    Raises:
        ValueError: from :meth:`evaluate`, if ``fn`` returns a shape other than ``count``'s, or
            a cost that is NaN, infinite or negative (the message names the batch).

    >>> import numpy as np
    >>> model = FunctionCost(lambda count, max_size, sum_size: sum_size + 2 * count)
    >>> model.evaluate(np.array([2, 3]), np.array([10.0, 4.0]), np.array([15.0, 9.0]))
    array([19., 15.])
    >>> model.to_dict()
    {'kind': 'function', 'fn': '<lambda>'}
    """

    fn: Callable[[FloatArray, FloatArray, FloatArray], Any]
    name: ClassVar[str] = "function"
    checked: ClassVar[bool] = True

    def evaluate(self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]) -> FloatArray:
        return self.fn(np.asarray(count, dtype=np.float64), max_size, sum_size)  # type: ignore[no-any-return]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.name, "fn": _fn_name(self.fn)}

    def __repr__(self) -> str:
        return f"FunctionCost({_fn_name(self.fn)})"


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


COST_NAMES = ("padded", "polynomial", "sum")


def resolve_cost(cost: str | CostModel | Callable[..., Any]) -> CostModel:
    """Coerce ``"sum"``, ``"padded"``, a :class:`CostModel` or a function into a cost model.

    User models are probed for monotonicity on a small grid so that a decreasing model fails
    here rather than producing batches over budget.

    Args:
        cost: a name (``"padded"``, ``"polynomial"``, ``"sum"``: the model with default
            settings), a :class:`CostModel` (returned as is), or a function
            ``fn(count, max_size, sum_size)`` (wrapped in a :class:`FunctionCost`).

    Returns:
        The cost model.

    Raises:
        TypeError: ``cost`` is none of these.
        ValueError: an unknown name, or a user model that decreases somewhere.

    >>> resolve_cost("padded")
    PaddedCost(weights=None)
    >>> resolve_cost(lambda count, max_size, sum_size: count * max_size).name
    'function'
    >>> resolve_cost("tokens")
    Traceback (most recent call last):
    ...
    ValueError: unknown cost 'tokens'; expected one of ('padded', 'polynomial', 'sum')
    >>> resolve_cost(lambda count, max_size, sum_size: 100 - sum_size)
    Traceback (most recent call last):
    ...
    ValueError: cost model FunctionCost(...) decreases with the sum of sizes at count=1, max=0, sum=0; cost models must be non-decreasing
    """
    if isinstance(cost, CostModel):
        model = cost
    elif isinstance(cost, str):
        name = choice("cost", cost, COST_NAMES)
        model = {"sum": SumCost, "padded": PaddedCost, "polynomial": PaddedPolynomial}[name]()
    elif callable(cost):
        model = FunctionCost(cost)
    else:
        raise TypeError(f"cost must be one of {COST_NAMES}, a CostModel or a function, got {cost!r}")
    if not type(model).monotone:
        _check_monotone(model)
    return model


def _check_monotone(model: CostModel) -> None:
    grid = np.array([0.0, 1.0, 2.0, 7.0, 100.0, 1e4])
    c, m, s = (g.ravel() for g in np.meshgrid(np.arange(1.0, 5.0), grid, grid, indexing="ij"))
    # The grid holds batches no sizes make (sum > count x max): probe without the result checks,
    # which apply to the batches planning asks about.
    raw = getattr(type(model).evaluate, "__wrapped__", None)

    def evaluate(c: FloatArray, m: FloatArray, s: FloatArray) -> FloatArray:
        return _as_costs(model, raw(model, c, m, s) if raw is not None else model.evaluate(c, m, s), "evaluate")

    base = evaluate(c, m, s)
    for name, bumped in (
        ("count", evaluate(c + 1, m, s)),
        ("max size", evaluate(c, m + 1, s)),
        ("sum of sizes", evaluate(c, m, s + 1)),
    ):
        with np.errstate(invalid="ignore"):  # inf - inf: NaN, never "decreasing"
            bad = np.flatnonzero(bumped < base - 1e-9 * np.abs(base))
        if bad.size:
            i = bad[0]
            raise ValueError(
                f"cost model {model!r} decreases with the {name} at count={c[i]:g}, "
                f"max={m[i]:g}, sum={s[i]:g}; cost models must be non-decreasing"
            )
