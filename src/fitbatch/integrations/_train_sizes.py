"""Sizes from what is trained: a trainer's *prepared* train dataset, measured as the collator pads it.

A ``transformers.Trainer`` subclass may change the rows it was given before it trains on them:
TRL's ``SFTTrainer`` tokenises text, appends EOS, truncates to ``max_length``, drops rows left
without a loss and shuffles (``shuffle_dataset=True``). Sizes taken from the dataset the user
passed then describe other rows, and the plan overruns its budget silently. Here the sizes are
read from the dataset the trainer holds after its ``__init__`` (``trainer.train_dataset``):

* :func:`token_lengths` -- each row's ``input_ids`` length (an Arrow column read without a
  Python loop for a ``datasets.Dataset``, in its current order);
* :func:`causal_loss_sizes` -- each row's loss tokens as the ``Trainer`` counts them for
  ``num_items_in_batch`` (shifted labels: ``labels[1:] != -100``);
* :func:`pad_multiple` -- the multiple the collator pads to (``pad_to_multiple_of``);
* :class:`BudgetSampling` -- the sampler options a trainer builds its sampler from, once the
  dataset is prepared: lengths rounded up to the pad multiple, the trainer's world, rank and seed.

>>> import numpy as np
>>> rows = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}]
>>> token_lengths(rows), causal_loss_sizes(rows)
(array([3, 2]), array([2, 1]))
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

logger = logging.getLogger(__name__)

#: the label of positions without a loss (transformers' ignore index)
IGNORE_INDEX = -100


def _arrow_column(dataset: Any, column: str) -> Any:
    """The column as a ``pyarrow`` ChunkedArray when ``dataset`` is a ``datasets.Dataset``, else ``None``."""
    if type(dataset).__module__.split(".")[0] != "datasets" or not hasattr(dataset, "with_format"):
        return None
    if column not in dataset.column_names:
        raise ValueError(f"the train dataset has no {column!r} column (columns: {dataset.column_names}); "
                         "sizes are measured from the tokenised rows the trainer trains on")
    return dataset.with_format("arrow")[column]


def _rows(dataset: Any, column: str) -> list[Any]:
    try:
        return [row[column] for row in dataset]
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"every train dataset row must have {column!r} (the tokenised sequence) to be measured") from exc


def cheap_to_measure(dataset: Any) -> bool:
    """Whether rows can be measured without loading samples: a ``datasets.Dataset`` (Arrow) or a list/tuple.

    >>> cheap_to_measure([{"input_ids": [1]}]), cheap_to_measure(range(3))
    (True, False)
    """
    return isinstance(dataset, (list, tuple)) or (
        type(dataset).__module__.split(".")[0] == "datasets" and hasattr(dataset, "with_format"))


def token_lengths(dataset: Any, column: str = "input_ids") -> NDArray[np.int64]:
    """Each row's ``column`` length, in the dataset's current order.

    Args:
        dataset: a ``datasets.Dataset`` (read as Arrow) or any sized iterable of mapping rows.
        column: the tokenised field.

    Raises:
        ValueError: a row (or the dataset) has no ``column``.

    >>> token_lengths([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}])
    array([3, 1])
    """
    arrow = _arrow_column(dataset, column)
    if arrow is not None:
        import pyarrow.compute as pc

        return np.asarray(pc.list_value_length(arrow).to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.fromiter((len(v) for v in _rows(dataset, column)), dtype=np.int64)


def causal_loss_sizes(dataset: Any) -> NDArray[np.int64]:
    """Each row's loss tokens as the ``Trainer`` counts them: ``labels[1:] != -100`` (a causal LM shifts).

    The ``Trainer`` counts ``num_items_in_batch`` over ``labels[..., 1:]`` of each collated batch;
    per row that is every label but the first (a padding-free collator writes ``-100`` there
    itself). Without a ``labels`` column the labels are the ``input_ids``: ``length - 1``. Pass
    the result as a sampler's ``loss_sizes=`` so that ``step_totals().loss_units`` equal the
    Trainer's counts.

    >>> causal_loss_sizes([{"input_ids": [1, 2, 3], "labels": [1, -100, 3]}, {"input_ids": [4]}])
    array([1, 0])
    """
    if _arrow_column(dataset, "input_ids") is not None:
        if "labels" not in dataset.column_names:
            return np.maximum(token_lengths(dataset) - 1, 0)
        import pyarrow.compute as pc

        arrow = _arrow_column(dataset, "labels")
        lengths = np.asarray(pc.list_value_length(arrow).to_numpy(zero_copy_only=False), dtype=np.int64)
        values = np.asarray(pc.list_flatten(arrow).to_numpy(zero_copy_only=False))
        return _shifted_counts(values != IGNORE_INDEX, lengths)
    try:
        rows = [np.asarray(row["labels"] if "labels" in row else row["input_ids"]).reshape(-1) for row in dataset]
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError("every train dataset row must have 'input_ids' (and optionally 'labels') to be measured") from exc
    lengths = np.fromiter((r.size for r in rows), dtype=np.int64, count=len(rows))
    flat = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    return _shifted_counts(flat != IGNORE_INDEX, lengths)


def _shifted_counts(mask: NDArray[np.bool_], lengths: NDArray[np.int64]) -> NDArray[np.int64]:
    """Per row: ``True`` in ``mask`` but the row's first position."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    running = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
    first = np.zeros(len(lengths), dtype=np.int64)
    has = lengths > 0
    first[has] = mask[starts[has]]
    return running[ends] - running[starts] - first


def pad_multiple(collator: Any, args: Any = None) -> int:
    """The multiple a collator pads each batch's length to: its ``pad_to_multiple_of``, else the
    trainer arguments' (TRL's ``SFTConfig``), else 1.

    >>> class Collator:
    ...     pad_to_multiple_of = 64
    >>> pad_multiple(Collator()), pad_multiple(None)
    (64, 1)
    """
    for owner in (collator, args):
        value = getattr(owner, "pad_to_multiple_of", None)
        if value:
            return int(value)
    return 1


def collated_lengths(lengths: NDArray[np.int64], multiple: int) -> NDArray[np.int64]:
    """Lengths rounded up to ``multiple``: a padded batch's length is its longest row's, rounded up.

    >>> collated_lengths(np.array([1, 64, 65]), 64)
    array([ 64,  64, 128])
    """
    return -(-lengths // multiple) * multiple


class BudgetSampling:
    """Sampler options a trainer builds its sampler from, after it has prepared the train dataset.

    Pass it as the trainer's ``batch_sampler=`` instead of a ready sampler. The trainer calls it
    with itself once its ``__init__`` is done, and it returns a ``fitbatch.BudgetBatchSampler``
    over ``trainer.train_dataset`` as it stands then:

    * sizes: each row's ``input_ids`` length (:func:`token_lengths`), rounded up to the
      collator's pad multiple (:func:`pad_multiple`; exact for a padded cost, an upper bound for
      a padding-free row padded to a multiple);
    * ``loss_sizes``: ``True`` (default) counts them as the ``Trainer`` does
      (:func:`causal_loss_sizes`), ``False`` none, or a function of the dataset;
    * ``num_replicas=args.world_size``, ``rank=args.process_index``, ``seed=args.seed`` unless
      ``seed`` is given.

    Any callable ``factory(trainer) -> sampler`` may stand in its place.

    Args:
        budget: the sampler's budget.
        cost: as ``BudgetBatchSampler``'s.
        strategy: as ``BudgetBatchSampler``'s.
        seed: as ``BudgetBatchSampler``'s (the trainer's ``args.seed`` when ``None``).
        loss_sizes: see above.
        **options: other ``BudgetBatchSampler`` keywords (``max_batch_size``, ``shuffle``, ...).

    >>> spec = BudgetSampling(64, cost="sum", strategy="packed")
    >>> spec
    BudgetSampling(64, cost='sum', strategy='packed', seed=None, loss_sizes=True)
    >>> from types import SimpleNamespace
    >>> trainer = SimpleNamespace(train_dataset=[{"input_ids": [1] * n} for n in (30, 20, 10, 40)],
    ...                           data_collator=None,
    ...                           args=SimpleNamespace(world_size=1, process_index=0, seed=0))
    >>> sorted(len(b) for b in spec(trainer))
    [2, 2]
    """

    def __init__(self, budget: Any, *, cost: Any = "padded", strategy: Any = "pooled", seed: Any = None,
                 loss_sizes: bool | Callable[[Any], Any] = True, **options: Any) -> None:
        if "num_replicas" in options or "rank" in options:
            raise TypeError("num_replicas and rank are the trainer's (args.world_size, args.process_index); drop them")
        if "sizes" in options:
            raise TypeError("the sizes are measured from the trainer's prepared train_dataset; drop sizes=")
        self.budget, self.cost, self.strategy, self.seed = budget, cost, strategy, seed
        self.loss_sizes, self.options = loss_sizes, options

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return (f"BudgetSampling({self.budget!r}, cost={self.cost!r}, strategy={self.strategy!r}, "
                f"seed={self.seed!r}, loss_sizes={self.loss_sizes!r}{extra})")

    def __call__(self, trainer: Any) -> Any:
        from fitbatch.sampler import BudgetBatchSampler

        dataset, args = trainer.train_dataset, trainer.args
        sizes = collated_lengths(token_lengths(dataset), pad_multiple(trainer.data_collator, args))
        loss: Any = None
        if self.loss_sizes is True:
            loss = causal_loss_sizes(dataset)
        elif callable(self.loss_sizes):
            loss = self.loss_sizes(dataset)
        seed = args.seed if self.seed is None else self.seed
        return BudgetBatchSampler(sizes, self.budget, cost=self.cost, strategy=self.strategy, seed=seed,
                                  loss_sizes=loss, num_replicas=args.world_size, rank=args.process_index,
                                  **self.options)


__all__ = ["BudgetSampling", "causal_loss_sizes", "cheap_to_measure", "collated_lengths", "pad_multiple", "token_lengths"]
