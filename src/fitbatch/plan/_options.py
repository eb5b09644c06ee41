"""``PlanOptions``: every planning option, validated once (``plan_batches`` and the samplers).

>>> opts = PlanOptions.build("1KiB", cost="sum", strategy="sorted")
>>> opts.budget, opts.strategy, opts.effective_shuffle
(1024.0, Sorted(descending=False), False)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from fitbatch._rng import resolve_seed
from fitbatch._validate import choice, fraction, parse_budget, positive_int
from fitbatch.costs import CostModel, resolve_cost, resolve_limits
from fitbatch.plan._rules import OVERSIZED
from fitbatch.strategies import Strategy, resolve_strategy

if TYPE_CHECKING:
    from fitbatch._rng import SeedLike


def check_model(model: CostModel, max_shapes: int | None) -> None:
    """Refuse ``max_shapes`` with a cost model that ignores the padded length (sum costs)."""
    if max_shapes is not None and not model.uses_max:
        raise ValueError(
            f"max_shapes={max_shapes} needs a padded cost model (cost='padded', 'polynomial' or one "
            f"that grows with the longest sample); {model!r} ignores the padded length, so a batch's "
            "shape would be (1, total) over packed samples; pass max_shapes=None with this cost"
        )


class PlanKeywords(TypedDict, total=False):
    """The planning options as keyword arguments: ``**options`` of ``plan_batches`` and the samplers.

    Each key has the meaning and the default of the :class:`PlanOptions` attribute of that name;
    type checkers check the keywords (``Unpack[PlanKeywords]``), :meth:`PlanOptions.build`
    checks the values.

    >>> sorted(PlanKeywords.__annotations__)
    ['batch_size_multiple', 'drop_last', 'max_batch_size', 'max_shapes', 'oversized', 'saturation', 'seed', 'shuffle']
    """

    max_batch_size: int | None
    batch_size_multiple: int
    shuffle: bool | None
    seed: SeedLike
    oversized: str
    drop_last: bool
    saturation: float
    max_shapes: int | None


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """Every planning option, validated once. ``plan_batches`` and the samplers build one.

    Attributes:
        budget: the most cost one batch may have (number, or a string such as ``"70GiB"``).
            Several limits: a mapping column name -> budget, with sizes of the same named
            columns; ``build`` turns it into a :class:`~fitbatch.costs.Limits` cost (each batch's
            largest fill) and a budget of 1.
        cost: cost model (``"padded"``, ``"sum"``, ``"polynomial"``, a ``CostModel`` or function);
            with a budget mapping, one for every column or a mapping column name -> cost.
        strategy: ``"sequential"``, ``"sorted"``, ``"pooled"``, ``"buckets"``, ``"packed"`` or a
            ``Strategy`` instance with its own settings.
        max_batch_size: at most this many samples per batch (``None``: no limit).
        batch_size_multiple: batches of at least this many samples are cut to a multiple of it.
        shuffle: randomise (``None``: the strategy's default; sequential and sorted keep order).
        seed: int or ``SeedSequence``; ``None`` draws entropy once and keeps it.
        oversized: a sample whose own cost exceeds the budget: ``"error"`` (default),
            ``"single"`` (a batch of its own) or ``"skip"`` (left out, counted).
        drop_last: drop a batch that closed because its segment ran out of samples when its fill
            is below ``saturation`` (counted in the stats).
        saturation: see ``drop_last`` (aistore's rule, default 0.8).
        max_shapes: give every batch one of at most this many ``(rows, length)`` shapes, the
            same every epoch and rank (for ``torch.compile`` and CUDA graphs; see
            ``docs/shapes.md``); ``None`` (default): no bound. Needs 1-D sizes and a padded cost.

    >>> import fitbatch
    >>> opts = fitbatch.plan.PlanOptions.build("2KiB", cost="sum", strategy="sorted", max_batch_size=8)
    >>> opts.budget, opts.cost, opts.strategy, opts.max_batch_size, opts.effective_shuffle
    (2048.0, SumCost(weights=None), Sorted(descending=False), 8, False)
    >>> fitbatch.plan.PlanOptions.build(2048, oversized="drop")
    Traceback (most recent call last):
        ...
    ValueError: unknown oversized 'drop'; expected one of ('error', 'single', 'skip')
    """

    budget: float
    cost: CostModel
    strategy: Strategy
    max_batch_size: int | None = None
    batch_size_multiple: int = 1
    shuffle: bool | None = None
    seed: int = 0
    oversized: str = "error"
    drop_last: bool = False
    saturation: float = 0.8
    max_shapes: int | None = None

    @classmethod
    def build(
        cls,
        budget: float | str | Mapping[str, float | str],
        *,
        cost: str | CostModel | Any = "padded",
        strategy: str | Strategy = "pooled",
        max_batch_size: int | None = None,
        batch_size_multiple: int = 1,
        shuffle: bool | None = None,
        seed: SeedLike = 0,
        oversized: str = "error",
        drop_last: bool = False,
        saturation: float = 0.8,
        max_shapes: int | None = None,
    ) -> PlanOptions:
        """Validate and coerce every option (raises ``ValueError``/``TypeError`` naming it)."""
        if shuffle is not None and not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be True, False or None, got {shuffle!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be a bool, got {drop_last!r}")
        if isinstance(budget, Mapping) or isinstance(cost, Mapping):  # several limits: fills against 1
            cost, budget = resolve_limits(budget, cost), 1.0
        model = resolve_cost(cost)
        shapes = positive_int("max_shapes", max_shapes, allow_none=True)
        check_model(model, shapes)
        return cls(
            budget=parse_budget(budget),
            cost=model,
            strategy=resolve_strategy(strategy),
            max_batch_size=positive_int("max_batch_size", max_batch_size, allow_none=True),
            batch_size_multiple=positive_int("batch_size_multiple", batch_size_multiple) or 1,
            shuffle=shuffle,
            seed=resolve_seed(seed),
            oversized=choice("oversized", oversized, OVERSIZED),
            drop_last=drop_last,
            saturation=fraction("saturation", saturation),
            max_shapes=shapes,
        )

    @property
    def effective_shuffle(self) -> bool:
        return self.strategy.default_shuffle if self.shuffle is None else self.shuffle

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description (stored in sampler state to detect a changed configuration)."""
        out: dict[str, Any] = {
            "budget": self.budget,
            "cost": self.cost.to_dict(),
            "strategy": {"kind": self.strategy.name, **dataclasses.asdict(self.strategy)},  # type: ignore[call-overload]
            "max_batch_size": self.max_batch_size,
            "batch_size_multiple": self.batch_size_multiple,
            "shuffle": self.effective_shuffle,
            "seed": self.seed,
            "oversized": self.oversized,
            "drop_last": self.drop_last,
            "saturation": self.saturation,
        }
        if self.max_shapes is not None:  # absent when unset: states saved before it still match
            out["max_shapes"] = self.max_shapes
        return out
