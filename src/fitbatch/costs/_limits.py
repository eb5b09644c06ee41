"""Several limits at once: one budget per named size column, one composite cost model.

A multimodal batch must respect text tokens *and* image tokens (or images, or samples)
together. Sizes then come as a mapping of named columns (``{"tokens": t, "images": k}``, see
:func:`fitbatch.as_sizes`), the budget as a mapping of the same names, and the cost as one model
for every column or a mapping of models. :func:`resolve_limits` turns them into one
:class:`Limits` model whose cost is the largest *fill* of a batch,
``max_j cost_j(count, max[:, j], sum[:, j]) / budget_j``, planned against a budget of 1: it is
non-decreasing in every argument, so every kernel and strategy plans it unchanged, and a batch
fits exactly when it fits every limit.

>>> import numpy as np
>>> limits = resolve_limits({"tokens": 100, "images": 4}, {"images": "sum"})
>>> limits                                  # columns in name order, as the sizes' columns
Limits(images=4 sum, tokens=100 padded)
>>> count, mx, sm = np.array([3.0]), np.array([[1.0, 30.0]]), np.array([[3.0, 60.0]])
>>> limits.column_costs(count, mx, sm), limits.evaluate(count, mx, sm)
(array([[ 3., 90.]]), array([0.9]))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fitbatch._validate import parse_budget
from fitbatch.costs._models import CostModel, FloatArray, resolve_cost

#: the cost of a column that the cost mapping leaves out: plan_batches' default cost
DEFAULT_COLUMN_COST = "padded"


@dataclasses.dataclass(frozen=True)
class Limits(CostModel):
    """Several budgets at once: a batch's cost is its largest fill over the named columns.

    Sizes are ``(N, D)``, column ``j`` holding the sizes named ``names[j]``, columns sorted by
    name (as :func:`fitbatch.as_sizes` sorts a mapping's columns, so that any limits and any sizes
    of the same names line up; the names are sorted here too); column ``j`` costs
    ``costs[j]`` (a 1-D cost model) and may cost at most ``budgets[j]``. The cost of a batch is
    ``max_j costs[j](count, max[:, j], sum[:, j]) / budgets[j]``, planned against a budget of 1
    (a budget ``b`` allows every limit to be filled to ``b``). Build one with
    :func:`resolve_limits` (what ``plan_batches`` does with a budget mapping).

    Attributes:
        names: the column names, sorted.
        budgets: each column's budget, in its own units.
        costs: each column's cost model.

    Raises:
        ValueError: names, budgets and costs of different lengths, repeated or empty names, a
            budget that is not positive and finite.
        TypeError: a name that is not a string, a cost that is not a :class:`CostModel`.

    >>> import numpy as np
    >>> from fitbatch.costs import PaddedCost, SumCost
    >>> limits = Limits(("tokens", "images"), (100.0, 4.0), (PaddedCost(), SumCost()))
    >>> limits.names
    ('images', 'tokens')
    >>> limits.sample_cost(np.array([[1.0, 50.0], [4.0, 10.0], [0.0, 120.0]]))
    array([0.5, 1. , 1.2])
    >>> limits.to_dict()["budgets"]
    [4.0, 100.0]
    """

    names: tuple[str, ...]
    budgets: tuple[float, ...]
    costs: tuple[CostModel, ...]
    name: ClassVar[str] = "limits"
    monotone: ClassVar[bool] = True  # a max of fills of models resolve_cost accepted

    def __post_init__(self) -> None:
        names, budgets, costs = tuple(self.names), tuple(self.budgets), tuple(self.costs)
        if not names or not len(names) == len(budgets) == len(costs):
            raise ValueError(
                f"Limits needs one budget and one cost per column, got {len(names)} names, "
                f"{len(budgets)} budgets and {len(costs)} costs"
            )
        for n in names:
            if not isinstance(n, str) or not n:
                raise TypeError(f"Limits column names must be non-empty strings, got {n!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"Limits column names must differ, got {names!r}")
        for c in costs:
            if not isinstance(c, CostModel) or isinstance(c, Limits):
                raise TypeError(
                    f"each column's cost must be a 1-D CostModel (resolve_cost), got {c!r}"
                )
        at = sorted(range(len(names)), key=names.__getitem__)
        object.__setattr__(self, "names", tuple(names[j] for j in at))
        object.__setattr__(
            self, "budgets", tuple(parse_budget(budgets[j], f"budget[{names[j]!r}]") for j in at)
        )
        object.__setattr__(self, "costs", tuple(costs[j] for j in at))

    def column_costs(
        self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]
    ) -> FloatArray:
        """Each column's cost in its own units: shape ``(k, D)`` for ``k`` batches."""
        mx, sm = self._columns(max_size), self._columns(sum_size)
        cnt = np.asarray(count, dtype=np.float64)
        out = np.empty(mx.shape, dtype=np.float64)
        for j, model in enumerate(self.costs):
            out[..., j] = model.evaluate(cnt, mx[..., j], sm[..., j])
        return out

    def evaluate(
        self, count: NDArray[Any], max_size: NDArray[Any], sum_size: NDArray[Any]
    ) -> FloatArray:
        return self._fill(self.column_costs(count, max_size, sum_size))

    def sample_cost(self, sizes: NDArray[Any]) -> FloatArray:
        values = self._columns(sizes)
        return self._largest(
            m.sample_cost(values[:, j]) / b
            for j, (m, b) in enumerate(zip(self.costs, self.budgets))
        )

    def order_cost(self, sizes: NDArray[Any]) -> FloatArray:
        """The largest fill alone over the columns whose cost uses the padded length (all
        columns when none does): sorted by it, batches pad little, and sum columns (images)
        pad nothing whatever the order.

        >>> limits = resolve_limits({"tokens": 100, "images": 4}, {"images": "sum"})
        >>> limits.order_cost(np.array([[4.0, 10.0], [0.0, 50.0]]))   # tokens only
        array([0.1, 0.5])
        """
        values = self._columns(sizes)
        padded = [j for j, m in enumerate(self.costs) if m.uses_max] or range(len(self.names))
        return self._largest(
            self.costs[j].sample_cost(values[:, j]) / self.budgets[j] for j in padded
        )

    def _fill(self, column_costs: FloatArray) -> FloatArray:
        return self._largest(column_costs[..., j] / b for j, b in enumerate(self.budgets))

    @staticmethod
    def _largest(fills: Any) -> FloatArray:
        """The element-wise max of fresh fill arrays, column by column (a max over a short last
        axis is many times slower in numpy)."""
        out: FloatArray | None = None
        for fill in fills:
            out = fill if out is None else np.maximum(out, fill, out=out)
        return np.zeros(0) if out is None else out  # None: no column, which Limits refuses

    def _columns(self, values: NDArray[Any]) -> FloatArray:
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim < 2 or arr.shape[-1] != len(self.names):
            raise ValueError(
                f"{self!r} plans sizes of {len(self.names)} named columns {self.names}, got shape "
                f"{arr.shape}; pass sizes as a mapping of these names"
            )
        return arr

    def check_columns(self, columns: tuple[str, ...] | None) -> Limits:
        """These limits, when ``columns`` (the sizes' column names) are their names.

        Raises:
            ValueError: sizes without names, or names other than these (both are listed).
        """
        if columns is None:
            raise ValueError(
                f"budget names the columns {list(self.names)} but the sizes have no column names; pass "
                "sizes as a mapping of the same names, e.g. {'tokens': lengths, 'images': counts}"
            )
        if tuple(sorted(columns)) != self.names:
            raise ValueError(
                f"budget names the columns {list(self.names)} but the sizes name {sorted(columns)}; "
                "give one budget per size column, with the same names"
            )
        return self

    def describe(self, row: NDArray[Any]) -> str:
        """The limits one sample exceeds alone: ``"tokens 120 > 100"`` (every column when none)."""
        costs = self.column_costs(np.ones(1), row[None, :], row[None, :])[0]
        over = [j for j in range(len(self.names)) if costs[j] > self.budgets[j]] or range(
            len(self.names)
        )
        return ", ".join(f"{self.names[j]} {costs[j]:g} > {self.budgets[j]:g}" for j in over)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.name,
            "names": list(self.names),
            "budgets": list(self.budgets),
            "costs": [c.to_dict() for c in self.costs],
        }

    def __repr__(self) -> str:
        parts = (f"{n}={b:g} {c.name}" for n, b, c in zip(self.names, self.budgets, self.costs))
        return f"Limits({', '.join(parts)})"


def resolve_limits(
    budget: Mapping[str, float | str] | Any,
    cost: str | CostModel | Callable[..., Any] | Mapping[str, Any] = DEFAULT_COLUMN_COST,
) -> Limits:
    """One :class:`Limits` from a budget mapping and a cost (one for every column, or a mapping).

    Args:
        budget: column name -> budget (a number or a string such as ``"2GiB"``).
        cost: one cost for every column (a name, a :class:`CostModel` or a function), or a
            mapping column name -> cost; a column the mapping leaves out costs
            ``"padded"`` (:data:`DEFAULT_COLUMN_COST`, ``plan_batches``' default).

    Returns:
        The limits, columns sorted by name.

    Raises:
        TypeError: a budget that is not a mapping with string keys.
        ValueError: a cost mapping naming a column the budget does not (both are listed), an
            empty budget mapping, a bad budget or cost.

    >>> resolve_limits({"tokens": "16KiB", "images": 16}, cost={"images": "sum"})
    Limits(images=16 sum, tokens=16384 padded)
    >>> resolve_limits({"tokens": 100}, cost={"tokens": "sum", "frames": "sum"})
    Traceback (most recent call last):
    ...
    ValueError: cost names columns ['frames', 'tokens'] but budget names ['tokens']; name only columns that have a budget
    """
    if not isinstance(budget, Mapping):
        columns = sorted(map(str, cost)) if isinstance(cost, Mapping) else []
        raise TypeError(
            f"cost is a mapping of columns {columns}, so budget must be a mapping of the same names "
            f"(one budget per column), got {budget!r}"
        )
    names = tuple(budget)
    if not names:
        raise ValueError("budget is an empty mapping; give one budget per size column")
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"budget mapping keys must be column names (str), got {n!r}")
    if isinstance(cost, Mapping):
        unknown = set(cost) - set(names)
        if unknown:
            raise ValueError(
                f"cost names columns {sorted(map(str, cost))} but budget names {sorted(names)}; "
                "name only columns that have a budget"
            )
        models = tuple(resolve_cost(cost.get(n, DEFAULT_COLUMN_COST)) for n in names)
    else:
        model = resolve_cost(cost)
        models = (model,) * len(names)
    return Limits(names, tuple(parse_budget(budget[n], f"budget[{n!r}]") for n in names), models)


# ------------------------------------------------------------------ plans of several limits


def one_budget(where: str, budget: Any, cost: Any) -> Any:
    """``budget``, or a ``TypeError`` when ``budget`` and ``cost`` ask for several limits,
    which ``where`` (a planner of one budget: streams) does not plan.

    >>> one_budget("batch_stream", {"tokens": 100, "images": 4}, "padded")
    Traceback (most recent call last):
    ...
    TypeError: batch_stream plans one budget, not several limits (budget={'tokens': 100, 'images': 4}); plan sizes of named columns with plan_batches or BudgetBatchSampler, or stream with one budget
    """
    if isinstance(budget, Mapping) or isinstance(cost, (Mapping, Limits)):
        shown = f"budget={budget!r}" if isinstance(budget, Mapping) else f"cost={cost!r}"
        raise TypeError(
            f"{where} plans one budget, not several limits ({shown}); plan sizes of named columns "
            "with plan_batches or BudgetBatchSampler, or stream with one budget"
        )
    return budget


def _named_columns(columns: tuple[str, ...]) -> str:
    example = ", ".join(f"{c!r}: ..." for c in columns)
    return (
        f"sizes are named columns {list(columns)}: pass budget as a mapping of the same "
        f"names (one limit per column), e.g. budget={{{example}}}"
    )


def check_limits(columns: tuple[str, ...] | None, cost: CostModel) -> CostModel:
    """``cost``, or a clear ``ValueError`` when it and the sizes' ``columns`` disagree.

    >>> check_limits(None, resolve_cost("sum"))
    SumCost(weights=None)
    >>> check_limits(("images", "tokens"), resolve_cost("sum"))
    Traceback (most recent call last):
    ...
    ValueError: sizes are named columns ['images', 'tokens']: pass budget as a mapping of the same names (one limit per column), e.g. budget={'images': ..., 'tokens': ...}
    """
    if isinstance(cost, Limits):
        return cost.check_columns(columns)
    if columns is not None:
        raise ValueError(_named_columns(columns))
    return cost


def check_budget_shape(columns: tuple[str, ...] | None, *, budget: Any = None, cost: CostModel | None = None) -> None:
    """The one rule that ``plan_batches``, ``set_budget`` and ``set_cost`` share: sizes of named
    ``columns`` take a budget mapping of those names (and a :class:`Limits` cost), 1-D sizes
    (``columns`` ``None``) one number and a cost of one column.

    A sampler over several limits plans against fills (a budget of 1): a plain number given to
    its ``set_budget`` would become the allowed *fill*, so it is refused as ``plan_batches``
    refuses it.

    >>> check_budget_shape(None, budget=8192)
    >>> check_budget_shape(("images", "tokens"), budget=8192)
    Traceback (most recent call last):
    ...
    ValueError: sizes are named columns ['images', 'tokens']: pass budget as a mapping of the same names (one limit per column), e.g. budget={'images': ..., 'tokens': ...}
    """
    if budget is not None:
        if columns is not None and not isinstance(budget, Mapping):
            raise ValueError(_named_columns(columns))
        if columns is None and isinstance(budget, Mapping):
            raise ValueError(
                f"budget is a mapping of columns {sorted(map(str, budget))} but the sizes have no column "
                "names; pass one budget (a number or a string such as '2GiB'), or sizes as a mapping of "
                "the same names"
            )
    if cost is not None:
        check_limits(columns, cost)


def limit_columns(cost: CostModel) -> tuple[str, ...] | None:
    """The size columns a cost in force plans (a :class:`Limits`' names), ``None`` for one column."""
    return cost.names if isinstance(cost, Limits) else None


def describer(model: CostModel, values: FloatArray) -> Callable[[int], str] | None:
    """What sample ``k`` exceeds alone, for the oversized error of several limits; else ``None``."""
    return (lambda k: model.describe(values[k])) if isinstance(model, Limits) else None


def column_costs(limits: Any, order: NDArray[np.int64], offsets: NDArray[np.int64]) -> FloatArray:
    """Each batch's cost per column, ``(k, D)``, of a plan whose limits are ``limits``.

    Raises:
        ValueError: ``limits`` is ``None`` (a plan of one budget).
    """
    if limits is None:
        raise ValueError(
            "limit_costs needs a plan of several limits (sizes of named columns with a budget "
            "mapping) made by plan_batches or a sampler; use costs for a plan of one budget"
        )
    model, values = limits
    x = values[order]
    counts = np.diff(offsets)
    if not counts.size:
        return np.zeros((0, len(model.names)))
    heads = offsets[:-1]
    out: FloatArray = model.column_costs(
        counts.astype(np.float64),
        np.maximum.reduceat(x, heads, axis=0),
        np.add.reduceat(x, heads, axis=0),
    )
    return out


def limit_index(limits: Any, name: str) -> int:
    """The column of limit ``name`` (``ValueError`` naming the plan's limits when unknown)."""
    names = () if limits is None else limits[0].names
    if limits is not None and name not in names:
        raise ValueError(f"unknown limit {name!r}; the plan's limits are {list(names)}")
    return names.index(name) if limits is not None else 0


def limit_fills(
    model: Limits, costs_of: Callable[[str], FloatArray]
) -> tuple[dict[str, float], dict[str, float]]:
    """(mean, min) batch fill of each limit: ``costs_of(name)`` / its budget."""
    fills = {n: costs_of(n) / b for n, b in zip(model.names, model.budgets)}
    mean = {n: float(f.mean()) if f.size else 0.0 for n, f in fills.items()}
    return mean, {n: float(f.min()) if f.size else 0.0 for n, f in fills.items()}
