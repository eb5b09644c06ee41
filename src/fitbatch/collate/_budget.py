"""A budget check on what is collated: the batch the model sees, measured against the plan's budget.

A sampler plans batches from the sizes it was given; nothing else ties those sizes to the rows
the collate function receives. When they drift apart -- sizes measured before a trainer appended
an EOS token, truncated, filtered or shuffled the rows, a collator that pads to a multiple, a
padded collator under a ``cost="sum"`` plan -- batches overrun the budget silently, and on an
accelerator that is an out-of-memory error. :class:`BudgetCheckedCollate` wraps a collate
function, measures each batch it returns (its shape, not its values: cheap), and raises at the
first batch over the budget with the likely causes.

What is measured, for the token tensor (``input_ids`` of a dict, a :class:`PaddedBatch`'s
``values``, or the first array of a tuple):

* padded rows, shape ``(R, T, ...)``: ``R`` rows of ``T`` tokens, the cost model evaluated at
  ``(count=R, max=T, sum=R*T)`` -- a padded batch holds ``R*T`` tokens whatever the plan;
* a padding-free row, shape ``(1, T)`` with ``cu_seq_lens_q`` or ``position_ids`` (fitbatch's
  :func:`make_varlen_collate`, transformers' ``DataCollatorWithFlattening``, TRL's
  ``padding_free``): ``T`` real tokens for the padded and sum costs; other cost models are
  evaluated at (sequences, longest, ``T``) from the boundaries.

>>> import numpy as np
>>> check = check_budget(lambda rows: np.zeros((len(rows), max(rows)), int), 12)
>>> check([3, 4, 4]).shape
(3, 4)
>>> check([3, 5, 4])
Traceback (most recent call last):
...
ValueError: collated batch 2 costs 15 (3 rows x 5 tokens, cost 'padded'), over the budget 12 (1.25x). Likely causes: ...
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from fitbatch._validate import parse_budget
from fitbatch.collate._pad import PaddedBatch
from fitbatch.costs import CostModel, Limits, PaddedCost, SumCost, resolve_cost

logger = logging.getLogger(__name__)

#: keys of a dict batch that mark one padding-free row of several sequences
VARLEN_KEYS = ("cu_seq_lens_q", "cu_seqlens", "position_ids")
#: pad multiples named in the error when the padded length is one of theirs
PAD_MULTIPLES = (128, 64, 32, 16, 8)
#: a batch may exceed the budget by this relative amount (floating budgets)
TOLERANCE = 1e-9


class Measured(NamedTuple):
    """What a collated batch holds: sequences, the longest, tokens, and whether it is one padding-free row."""

    sequences: int
    longest: int
    tokens: int
    varlen: bool


def _shape(x: Any) -> tuple[int, ...] | None:
    shape = getattr(x, "shape", None)
    return None if shape is None or len(shape) == 0 else tuple(int(d) for d in shape)


def _tokens_of(batch: Any, key: str) -> Any:
    """The token tensor of a collated batch, or ``None`` when there is none to measure."""
    if isinstance(batch, PaddedBatch):
        return batch.values
    if isinstance(batch, Mapping):
        if key in batch:
            value = batch[key]
            return value.values if isinstance(value, PaddedBatch) else value
        return next((v.values for v in batch.values() if isinstance(v, PaddedBatch)), None)
    if isinstance(batch, (tuple, list)):
        for item in batch:
            if isinstance(item, PaddedBatch):
                return item.values
            if _shape(item) is not None:
                return item
        return None
    return batch if _shape(batch) is not None else None


def _segments(batch: Mapping[str, Any], tokens: int) -> np.ndarray:
    """The sequence lengths of one padding-free row, from its boundaries or restarting positions."""
    for key in VARLEN_KEYS[:2]:
        if key in batch:
            return np.diff(np.asarray(batch[key]).reshape(-1).astype(np.int64))
    positions = np.asarray(batch["position_ids"]).reshape(-1)
    starts = np.flatnonzero(positions == 0)
    if starts.size == 0 or starts[0] != 0:
        starts = np.concatenate([[0], starts])
    return np.diff(np.append(starts, tokens))


def measure_collated(batch: Any, key: str = "input_ids") -> Measured | None:
    """Measure a collated batch by its shape (see the module docstring); ``None``: nothing to measure.

    >>> import numpy as np
    >>> measure_collated({"input_ids": np.zeros((3, 7))})
    Measured(sequences=3, longest=7, tokens=21, varlen=False)
    >>> measure_collated({"input_ids": np.zeros((1, 9)), "position_ids": np.array([[0, 1, 2, 0, 1, 0, 1, 2, 3]])})
    Measured(sequences=3, longest=4, tokens=9, varlen=True)
    """
    shape = _shape(_tokens_of(batch, key))
    if shape is None:
        return None
    rows, width = (1, shape[0]) if len(shape) == 1 else shape[:2]
    if rows == 1 and isinstance(batch, Mapping) and any(k in batch for k in VARLEN_KEYS):
        lengths = _segments(batch, width)
        return Measured(int(lengths.size), int(lengths.max(initial=0)), width, True)
    return Measured(rows, width, rows * width, False)


def batch_cost(model: CostModel, measured: Measured) -> float:
    """The cost of a measured batch under ``model`` (a padding-free row: its tokens, for padded and sum costs).

    >>> batch_cost(SumCost(), Measured(sequences=3, longest=7, tokens=21, varlen=False))
    21.0
    """
    count, longest = measured.sequences, measured.longest
    if measured.varlen and isinstance(model, (PaddedCost, SumCost)):
        count, longest = 1, measured.tokens
    value = model.evaluate(np.array([count]), np.array([float(longest)]), np.array([float(measured.tokens)]))
    return float(value[0])


def _causes(model: CostModel, m: Measured) -> list[str]:
    causes = []
    if isinstance(model, SumCost) and not m.varlen and m.sequences > 1:
        causes.append(
            f"a padded collator under a sum plan: cost='sum' budgets real tokens, but the collator pads "
            f"every row to the longest ({m.sequences} x {m.longest} = {m.tokens} tokens); use a padding-free "
            "collator (fitbatch.collate.make_varlen_collate, transformers' DataCollatorWithFlattening, TRL's "
            "padding_free=True) or plan with cost='padded'"
        )
    multiple = next((k for k in PAD_MULTIPLES if m.longest % k == 0), None)
    if multiple is not None:
        causes.append(
            f"a collator that pads to a multiple (the length {m.longest} is one of {multiple}: pad_to_multiple_of, "
            "which TRL sets on some devices): plan over the sizes rounded up to it (the trainer integrations "
            "of fitbatch.integrations do so when they build the sampler) or drop the option"
        )
    causes.append(
        "the sampler's sizes are not the lengths of these rows (measured before the dataset was prepared: an "
        "appended EOS token, truncation, filtered or shuffled rows, another column): measure the sizes from "
        "the dataset the loader reads (fitbatch.integrations.transformers.BudgetSampling builds the sampler "
        "from a trainer's prepared train_dataset)"
    )
    return causes


class BudgetCheckedCollate:
    """A collate function that raises at the first collated batch over the budget.

    Build it with :func:`check_budget`. Picklable when the wrapped function is (``DataLoader``
    workers); the batch count in the error is per process (per worker with workers).

    >>> import numpy as np
    >>> from fitbatch import pad_collate
    >>> checked = check_budget(pad_collate, 16, cost="padded")
    >>> isinstance(checked, BudgetCheckedCollate), checked.budget
    (True, 16.0)
    >>> _ = checked([np.ones(7), np.ones(8)])  # 2 rows x 8 = 16: within the budget

    Attributes:
        collate_fn: the wrapped function.
        budget: the most one batch may cost.
        cost: the cost model batches are measured with.
        single: a batch of one sequence may exceed the budget (a sampler with
            ``oversized="single"``).
        key: the token field of a dict batch.
    """

    def __init__(self, collate_fn: Callable[[Any], Any], budget: float, cost: CostModel, *,
                 single: bool = False, key: str = "input_ids") -> None:
        self.collate_fn, self.budget, self.cost, self.single, self.key = collate_fn, budget, cost, single, key
        self.batches = 0
        self._unmeasured = False

    def __call__(self, samples: Any) -> Any:
        batch = self.collate_fn(samples)
        self.batches += 1
        measured = measure_collated(batch, self.key)
        if measured is None:
            if not self._unmeasured:
                self._unmeasured = True
                logger.info("budget check: a collated %s has no token tensor to measure; not checked", type(batch).__name__)
            return batch
        self.check(measured)
        return batch

    def check(self, measured: Measured) -> float:
        """The cost of a measured batch; ``ValueError`` (with the likely causes) when it is over the budget."""
        value = batch_cost(self.cost, measured)
        if value <= self.budget * (1 + TOLERANCE) or (self.single and measured.sequences == 1):
            return value
        what = (f"one padding-free row of {measured.sequences} sequences, {measured.tokens} tokens" if measured.varlen
                else f"{measured.sequences} rows x {measured.longest} tokens")
        name = getattr(self.cost, "name", type(self.cost).__name__)
        raise ValueError(
            f"collated batch {self.batches} costs {value:g} ({what}, cost {name!r}), over the budget "
            f"{self.budget:g} ({value / self.budget:.2f}x). Likely causes: "
            + "; ".join(f"({i}) {c}" for i, c in enumerate(_causes(self.cost, measured), 1))
        )

    def __repr__(self) -> str:
        return f"BudgetCheckedCollate({self.collate_fn!r}, budget={self.budget:g}, cost={self.cost!r})"


def check_budget(collate_fn: Callable[[Any], Any], budget: Any, *, cost: Any = None,
                 key: str = "input_ids") -> BudgetCheckedCollate:
    """Wrap ``collate_fn`` so that every batch it returns is measured against the budget.

    Args:
        collate_fn: the loader's collate function.
        budget: a number or string (``"16K"``), or a fitbatch sampler (``BudgetBatchSampler``,
            ``WindowedBatchSampler``), whose budget, cost model and ``oversized`` rule are used.
        cost: the cost model with a number budget (default ``"padded"``); not with a sampler.
        key: the token field of a dict batch.

    Returns:
        a :class:`BudgetCheckedCollate`; it raises ``ValueError`` at the first batch over the
        budget, naming the likely causes.

    Raises:
        ValueError: ``cost`` given with a sampler, or a sampler whose budget cannot be measured
            on a token tensor (several size columns).

    >>> import fitbatch
    >>> sampler = fitbatch.BudgetBatchSampler([5, 7, 3, 9], 16, cost="sum", num_replicas=1, rank=0)
    >>> check = check_budget(fitbatch.pad_collate, sampler)
    >>> check([np.ones(7), np.ones(9)])
    Traceback (most recent call last):
    ...
    ValueError: collated batch 1 costs 18 (2 rows x 9 tokens, cost 'sum'), over the budget 16 (1.12x). Likely causes: (1) a padded collator under a sum plan: ...
    """
    options = getattr(budget, "options", None)
    if options is None:
        model = resolve_cost("padded" if cost is None else cost)
        return BudgetCheckedCollate(collate_fn, parse_budget(budget), model, key=key)
    if cost is not None:
        raise ValueError(f"cost={cost!r} with a sampler: the sampler's cost model ({options.cost!r}) is used; drop cost=")
    if not measurable(budget):
        raise ValueError(
            f"{type(budget).__name__} plans over {options.cost!r}: a collated token tensor cannot be measured "
            "against it; check such batches yourself"
        )
    return BudgetCheckedCollate(collate_fn, float(options.budget), options.cost,
                                single=options.oversized == "single", key=key)


def measurable(sampler: Any) -> bool:
    """Whether :func:`check_budget` can measure a sampler's batches: one size per sample, a plain cost model.

    >>> import fitbatch
    >>> measurable(fitbatch.BudgetBatchSampler([1, 2], 4, num_replicas=1, rank=0)), measurable([[0, 1]])
    (True, False)
    """
    options = getattr(sampler, "options", None)
    sizes = getattr(getattr(sampler, "_sizes", None), "values", None)
    if options is None or sizes is None or np.ndim(sizes) != 1:
        return False
    model = options.cost
    return isinstance(model, CostModel) and not isinstance(model, Limits) and getattr(model, "weights", None) is None


__all__ = ["BudgetCheckedCollate", "Measured", "batch_cost", "check_budget", "measurable", "measure_collated"]
