"""A Hugging Face ``transformers.Trainer`` that trains on a fitbatch sampler's batches.

>>> from fitbatch.integrations.transformers import BudgetSampling, FitbatchTrainer
>>> args = TrainingArguments("out", gradient_accumulation_steps=4, num_train_epochs=2)  # doctest: +SKIP
>>> trainer = FitbatchTrainer(model, args, train_dataset=ds, data_collator=collator,
...                           batch_sampler=BudgetSampling(8192, cost="padded"))  # doctest: +SKIP
>>> trainer.train()  # or trainer.train(resume_from_checkpoint=True)  # doctest: +SKIP

``class Trainer(FitbatchTrainerMixin, SFTTrainer)`` does the same for TRL (``docs/integrations.md``).

What changes against a plain ``Trainer``:

* **The sizes are those of the rows trained.** ``BudgetSampling`` (or any ``factory(trainer)``)
  builds the sampler once the trainer's ``__init__`` has prepared ``train_dataset``; a ready
  sampler is checked against those rows (count, lengths with the pad multiple) and the
  trainer's world at construction. Every collated batch is measured against the budget
  (``check_budget=True``).

* **The batches.** The training loader is ``DataLoader(train_dataset, batch_sampler=sampler,
  collate_fn=data_collator)``, prepared by accelerate with its shard made a pass-through
  (:func:`fitbatch.integrations.accelerate.prepare_loader`): each rank runs exactly the
  sampler's batches, every sample once per epoch, the same number of steps on every rank.
  ``per_device_train_batch_size``, ``train_sampling_strategy="group_by_length"`` and
  ``dataloader_drop_last`` do not apply (the sampler groups by size itself).
* **Epochs of their own length.** A budget plan has a different number of batches each epoch;
  the Trainer assumes one. Here each epoch runs its own count (``sampler.n_steps(epoch)``),
  ``max_steps`` is the sum over the epochs, and a ``global_step`` maps back to (epoch, batches
  done) through those counts.
* **Loss normalisation.** Unchanged, and exact: with ``average_tokens_across_devices=True``
  (the default) and a model that takes loss kwargs (all causal LMs), the Trainer divides each
  micro-batch's token-summed loss by ``num_items_in_batch``, the loss tokens of the whole
  optimizer step over all ranks, so accumulation over budget batches of any size is a
  per-token mean. (For a causal LM it equals ``units - samples`` of the step's rows of
  ``sampler.step_totals()``.)
* **Resume.** ``train(resume_from_checkpoint=...)`` continues at the exact batch: the Trainer
  replays the epoch's index lists up to it (``skip_first_batches``; no sample is loaded). Each
  checkpoint also holds ``fitbatch_sampler.json``, the sampler's state there, and a resume
  refuses a checkpoint whose sampler had other options, samples or world size.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import logging
import math
import os
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from fitbatch._state import EPOCH_KEY, NUM_REPLICAS_KEY
from fitbatch.integrations._train_sizes import (
    BudgetSampling,
    causal_loss_sizes,
    cheap_to_measure,
    collated_lengths,
    pad_multiple,
    token_lengths,
)
from fitbatch.integrations.accelerate import prepare_loader, state_at
from fitbatch.sampler._protocol import PlanSampler

logger = logging.getLogger(__name__)

#: the file in each checkpoint folder that holds the sampler's state there
SAMPLER_FILE = "fitbatch_sampler.json"
#: the versions tested (pyproject.toml's integrations extra; .ci/run tests both ends)
SUPPORTED = "transformers>=5.23, trl>=1.16"


def _refuse_options(args: Any) -> None:
    """Trainer and TRL options that would break the sampler's guarantees, refused with the way out."""
    if getattr(args, "packing", False):
        raise ValueError(
            "packing=True packs the rows with TRL's own packer, so the sampler's sizes would not be those of the "
            "rows trained; use packing=False with fitbatch's packed plan: batch_sampler=BudgetSampling(budget, "
            "cost='sum', strategy='packed') and padding_free=True (or a padding-free collator)"
        )
    if args.ignore_data_skip:
        raise ValueError(
            "ignore_data_skip=True would rerun the resumed epoch from its first batch (samples twice, others never); "
            "leave it False: the resume replays index lists only, no sample is loaded"
        )


def _built(factory: Any, trainer: Any) -> Any:
    sampler = factory(trainer)
    if not isinstance(sampler, PlanSampler) or not hasattr(sampler, "load_state_dict"):
        raise TypeError(f"batch_sampler factory {factory!r} returned {type(sampler).__name__}, not a fitbatch sampler with state")
    return sampler


def _check_world(sampler: Any, args: Any) -> None:
    if (sampler.num_replicas, sampler.rank) != (args.world_size, args.process_index):
        raise ValueError(
            f"batch_sampler was built for rank {sampler.rank} of {sampler.num_replicas}, but this Trainer runs "
            f"args.process_index={args.process_index} of args.world_size={args.world_size}: build it with "
            "num_replicas=args.world_size, rank=args.process_index, or pass batch_sampler=BudgetSampling(budget, ...)"
        )


def _offenders(rows: Any, needed: Any, sizes: Any, limit: int = 5) -> str:
    shown = ", ".join(f"row {int(i)} ({int(needed[i])} tokens, size {float(sizes[i]):g})" for i in rows[:limit])
    return shown + (f" and {len(rows) - limit} more" if len(rows) > limit else "")


def check_sizes(sampler: Any, dataset: Any, multiple: int = 1) -> None:
    """Check a ready sampler's sizes against the rows the trainer trains on (after its preparation).

    Each size must be at least its row's ``input_ids`` length, rounded up to the collator's pad
    ``multiple`` (for budget samplers; a ``ScheduledBatchSampler`` is checked for its number of
    rows only). Only a ``datasets.Dataset`` (read as Arrow) or a list of rows is measured (never
    a dataset that would load its samples); rows without ``input_ids``, or sizes of several
    columns, are not checked (the collated-batch check still is).

    Raises:
        ValueError: another number of rows, or rows longer than their sizes (the message names
            the first few, the likely cause and the fix).

    >>> import fitbatch
    >>> sampler = fitbatch.BudgetBatchSampler([3, 2], 8, num_replicas=1, rank=0)
    >>> check_sizes(sampler, [{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5, 6]}])
    Traceback (most recent call last):
    ...
    ValueError: 1 train_dataset row is longer than its size in the batch sampler: row 0 (4 tokens, size 3); ...
    """
    sizes = sampler._sizes.values
    if hasattr(dataset, "__len__") and len(dataset) != len(sizes):
        raise ValueError(
            f"train_dataset has {len(dataset)} rows but the batch sampler was built over {len(sizes)} sizes "
            "(the trainer prepared the dataset: filtered or packed rows?): pass batch_sampler=BudgetSampling(budget, ...), "
            "which builds the sampler from the prepared rows, or build it over trainer.train_dataset"
        )
    # budget samplers only (a ScheduledBatchSampler's sizes may be counts); never load every sample
    if np.ndim(sizes) != 1 or getattr(sampler, "options", None) is None or not cheap_to_measure(dataset):
        return
    try:
        needed = collated_lengths(token_lengths(dataset), multiple)
    except ValueError:
        logger.info("the train_dataset has no input_ids: the batch sampler's sizes are not checked against it")
        return
    short = np.flatnonzero(sizes < needed)
    if short.size:
        padded = f" (lengths rounded up to the collator's pad_to_multiple_of={multiple})" if multiple > 1 else ""
        raise ValueError(
            f"{short.size} train_dataset row{'s are' if short.size > 1 else ' is'} longer than "
            f"{'their sizes' if short.size > 1 else 'its size'} in the batch sampler{padded}: "
            f"{_offenders(short, needed, sizes)}; the sizes were taken before the trainer prepared the "
            "rows (an appended EOS token, truncation, shuffle_dataset=True, filtering) or without the pad multiple: "
            "pass batch_sampler=BudgetSampling(budget, ...), which measures the prepared rows"
        )


class FitbatchTrainerMixin:
    """The ``Trainer`` methods that make it train on fitbatch batches (see the module docstring).

    Put it before ``Trainer`` (or a subclass such as TRL's ``SFTTrainer``) in the bases:
    ``class MyTrainer(FitbatchTrainerMixin, SFTTrainer)``. :class:`FitbatchTrainer` is
    ``FitbatchTrainerMixin`` + ``transformers.Trainer``.

    Args:
        *args: the ``Trainer``'s positional arguments.
        **kwargs: the ``Trainer``'s keyword arguments.
        batch_sampler: :class:`BudgetSampling` (the sampler's options: it is built from the
            train dataset as the trainer prepared it -- tokenised, EOS appended, truncated,
            filtered, shuffled -- with the collator's pad multiple), any ``factory(trainer)``
            returning a sampler, or a ready fitbatch sampler with state (``BudgetBatchSampler``,
            ``ScheduledBatchSampler``) built over the *prepared* rows for this run's processes
            (``num_replicas=args.world_size, rank=args.process_index``), checked at construction.
        check_budget: measure every collated training batch against the sampler's budget and
            raise at the first one over it (:func:`fitbatch.collate.check_budget`).

    Raises:
        TypeError: ``batch_sampler`` is none of these.
        ValueError: a ready sampler built for another world size or rank than the Trainer's, or
            over other rows (their number, or rows longer than their sizes); TRL's
            ``packing=True``; ``ignore_data_skip=True``.

    >>> FitbatchTrainerMixin(batch_sampler=[[0, 1], [2]])
    Traceback (most recent call last):
    ...
    TypeError: batch_sampler must be a fitbatch sampler with state (e.g. fitbatch.BudgetBatchSampler) or BudgetSampling(budget, ...) (built from the prepared train_dataset), got list
    """

    args: Any
    state: Any
    accelerator: Any
    train_dataset: Any
    data_collator: Any

    def __init__(self, *args: Any, batch_sampler: Any, check_budget: bool = True, **kwargs: Any) -> None:
        ready = isinstance(batch_sampler, PlanSampler)
        if (ready and not hasattr(batch_sampler, "load_state_dict")) or not (ready or callable(batch_sampler)):
            raise TypeError(
                "batch_sampler must be a fitbatch sampler with state (e.g. fitbatch.BudgetBatchSampler) or "
                "BudgetSampling(budget, ...) (built from the prepared train_dataset), "
                f"got {type(batch_sampler).__name__}"
            )
        hooks = ("set_initial_training_values", "_init_training_state", "_run_epoch", "_save_checkpoint")
        base = super()
        missing = [name for name in hooks if not hasattr(base, name)]
        if missing:
            raise RuntimeError(
                f"{type(self).__name__} overrides Trainer methods this transformers lacks ({', '.join(missing)}); "
                f"install the integrations extra ({SUPPORTED})"
            )
        self.batch_sampler: Any = None  # built below, once the train_dataset is prepared
        self.check_budget = check_budget
        super().__init__(*args, **kwargs)
        _refuse_options(self.args)
        self.batch_sampler = batch_sampler if ready else _built(batch_sampler, self)
        _check_world(self.batch_sampler, self.args)
        if self.train_dataset is not None:
            check_sizes(self.batch_sampler, self.train_dataset, pad_multiple(self.data_collator, self.args))
        if self.args.train_sampling_strategy not in ("random", "sequential"):
            logger.info("train_sampling_strategy=%r is not used: the fitbatch sampler groups by size", self.args.train_sampling_strategy)
        logger.info("per_device_train_batch_size=%s is not used (the Trainer still logs it): batches are the "
                    "fitbatch sampler's, under its budget", self.args.per_device_train_batch_size)

    # ------------------------------------------------------------------ the loader

    def get_train_dataloader(self) -> Any:
        """``DataLoader(train_dataset, batch_sampler=sampler, collate_fn=data_collator)``, prepared."""
        import torch.utils.data
        from transformers.trainer_utils import seed_worker
        from transformers.utils import is_datasets_available

        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        dataset, collator = self.train_dataset, self.data_collator
        check_sizes(self.batch_sampler, dataset, pad_multiple(collator, self.args))
        if is_datasets_available() and isinstance(dataset, importlib.import_module("datasets").Dataset):
            dataset = self._remove_unused_columns(dataset, description="Training")  # type: ignore[attr-defined]
        else:
            collator = self._get_collator_with_removed_columns(collator, description="Training")  # type: ignore[attr-defined]
        workers = self.args.dataloader_num_workers
        params: dict[str, Any] = {
            "batch_sampler": self.batch_sampler,
            "collate_fn": collator,
            "num_workers": workers,
            "pin_memory": self.args.dataloader_pin_memory,
            "persistent_workers": self.args.dataloader_persistent_workers,
            "worker_init_fn": partial(seed_worker, num_workers=workers, rank=self.args.process_index),
        }
        if workers > 0:
            params["prefetch_factor"] = self.args.dataloader_prefetch_factor
            params["multiprocessing_context"] = self.args.dataloader_multiprocessing_context
        loader = torch.utils.data.DataLoader(dataset, **params)
        return prepare_loader(self.accelerator, loader, check_budget=self.check_budget)

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        """The base class's; under TRL, its ``num_tokens`` metric recounted for a 4-D attention mask.

        TRL adds ``attention_mask.sum()`` to ``num_tokens``: for the additive ``(1, 1, T, T)`` mask
        of ``make_varlen_collate(causal_mask=True)`` that is a sum of ``0`` and ``-inf`` entries. The
        tokens are then counted as for TRL's own padding-free rows, ``input_ids.numel()``.
        """
        mask = inputs.get("attention_mask") if hasattr(inputs, "get") else None
        recount = getattr(mask, "ndim", 2) == 4 and model.training and hasattr(self, "_total_train_tokens")
        before = getattr(self, "_total_train_tokens", 0)
        out = super().compute_loss(model, inputs, *args, **kwargs)  # type: ignore[misc]
        if recount:
            import torch

            local = torch.tensor(inputs["input_ids"].numel(), device=inputs["input_ids"].device)
            total = before + int(self.accelerator.gather_for_metrics(local).sum().item())
            self._total_train_tokens = total
            metrics = getattr(self, "_metrics", {}).get("train")
            if metrics is not None and "num_tokens" in metrics:
                metrics["num_tokens"] = [total]
        return out

    # ------------------------------------------------------------------ epochs of their own length

    def _epoch_batches(self, epoch: int) -> int:
        return int(self.batch_sampler.n_steps(epoch))

    def _epoch_updates(self, epoch: int) -> int:
        return max(math.ceil(self._epoch_batches(epoch) / self.args.gradient_accumulation_steps), 1)

    def _position(self, global_step: int, epochs: int) -> tuple[int, int]:
        """(epoch, batches done in it) after ``global_step`` optimizer steps."""
        epoch = 0
        while epoch < epochs and global_step >= self._epoch_updates(epoch):
            global_step -= self._epoch_updates(epoch)
            epoch += 1
        return epoch, global_step * self.args.gradient_accumulation_steps

    def set_initial_training_values(self, args: Any, dataloader: Any) -> tuple[Any, ...]:
        values = list(super().set_initial_training_values(args, dataloader))  # type: ignore[misc]
        if args.max_steps > 0:
            max_steps, epochs, total = args.max_steps, 0, 0
            while total < max_steps:
                total += self._epoch_updates(epochs)
                epochs += 1
        else:
            whole = int(args.num_train_epochs)
            part = args.num_train_epochs - whole
            max_steps = sum(self._epoch_updates(e) for e in range(whole))
            max_steps += math.ceil(part * self._epoch_updates(whole)) if part > 0 else 0
            epochs = math.ceil(args.num_train_epochs)
        # (num_train_epochs, updates per epoch, examples, samples, total batch, batches per epoch, max_steps)
        values[0], values[1], values[5], values[6] = epochs, self._epoch_updates(0), self._epoch_batches(0), max_steps
        return tuple(values)

    def _init_training_state(
        self, max_steps: int, num_update_steps_per_epoch: int, num_train_epochs: int,
        resume_from_checkpoint: str | None, trial: Any,
    ) -> tuple[int, int]:
        super()._init_training_state(  # type: ignore[misc]
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        epoch, done = self._position(self.state.global_step, num_train_epochs)
        if resume_from_checkpoint is not None:
            self._check_saved_sampler(resume_from_checkpoint, epoch, done)
        return epoch, 0 if self.args.ignore_data_skip else done

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        run = super()._run_epoch  # type: ignore[misc]
        bound = inspect.signature(run).bind(*args, **kwargs)
        epoch = bound.arguments["epoch"]
        # accelerate's set_epoch does not reach a batch sampler, nor does the Trainer's once
        # skip_first_batches has wrapped it (the epoch a resume continues)
        self.batch_sampler.set_epoch(epoch)
        bound.arguments["steps_in_epoch"] = self._epoch_batches(epoch)
        bound.arguments["num_update_steps_per_epoch"] = self._epoch_updates(epoch)
        return run(*bound.args, **bound.kwargs)

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)  # type: ignore[misc]
        if not self.args.should_save:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")  # type: ignore[attr-defined]
        epoch, done = self._position(self.state.global_step, self.state.num_train_epochs)
        if epoch != self.batch_sampler.epoch:  # the epoch's last step: saved as its end
            epoch, done = self.batch_sampler.epoch, self._epoch_batches(self.batch_sampler.epoch)
        state = state_at(self.batch_sampler, done)
        state[EPOCH_KEY] = epoch
        with open(os.path.join(folder, SAMPLER_FILE), "w") as f:
            json.dump(state, f)

    def _check_saved_sampler(self, checkpoint: str, epoch: int, done: int) -> None:
        path = os.path.join(checkpoint, SAMPLER_FILE)
        if not os.path.isfile(path):
            logger.warning("%s has no %s: the sampler's options are not checked", checkpoint, SAMPLER_FILE)
            return
        with open(path) as f:
            saved = json.load(f)
        if saved.get(NUM_REPLICAS_KEY) != self.batch_sampler.num_replicas:
            raise ValueError(
                f"{checkpoint} was saved on {saved.get(NUM_REPLICAS_KEY)} processes, this run has "
                f"{self.batch_sampler.num_replicas}: the Trainer's global_step maps to batches only on the same "
                "world size (fitbatch.integrations.accelerate.prepare resumes on any)"
            )
        copy.copy(self.batch_sampler).load_state_dict(saved)  # the same samples and options, or ValueError
        at = (saved[EPOCH_KEY], saved[self.batch_sampler.CURSOR_KEY])
        if at[1] >= self._epoch_batches(at[0]):
            at = (saved[EPOCH_KEY] + 1, 0)
        if at != (epoch, done):
            raise ValueError(
                f"{checkpoint}: the sampler stood at epoch {at[0]}, batch {at[1]}, but the Trainer's global_step "
                f"{self.state.global_step} maps to epoch {epoch}, batch {done}; resume with the same "
                "gradient_accumulation_steps and sampler"
            )


if TYPE_CHECKING:
    from transformers import Trainer

    class FitbatchTrainer(FitbatchTrainerMixin, Trainer):  # built on first use by __getattr__
        pass


def __getattr__(name: str) -> Any:
    # transformers is imported on first use of the class, not with fitbatch
    if name == "FitbatchTrainer":
        from transformers import Trainer

        cls = type(
            "FitbatchTrainer",
            (FitbatchTrainerMixin, Trainer),
            {"__doc__": "``transformers.Trainer`` with :class:`FitbatchTrainerMixin` (see the module docstring).",
             "__module__": __name__},
        )
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SAMPLER_FILE",
    "SUPPORTED",
    "BudgetSampling",
    "FitbatchTrainer",
    "FitbatchTrainerMixin",
    "causal_loss_sizes",
    "check_sizes",
    "pad_multiple",
    "token_lengths",
]
