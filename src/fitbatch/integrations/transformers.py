"""A Hugging Face ``transformers.Trainer`` that trains on a fitbatch sampler's batches.

>>> from fitbatch.integrations.transformers import FitbatchTrainer
>>> args = TrainingArguments("out", gradient_accumulation_steps=4, num_train_epochs=2)  # doctest: +SKIP
>>> sampler = fitbatch.BudgetBatchSampler(lengths, 8192, cost="padded", seed=args.seed,
...                                       num_replicas=args.world_size, rank=args.process_index)  # doctest: +SKIP
>>> trainer = FitbatchTrainer(model, args, train_dataset=ds, data_collator=collator,
...                           batch_sampler=sampler)  # doctest: +SKIP
>>> trainer.train()  # or trainer.train(resume_from_checkpoint=True)  # doctest: +SKIP

What changes against a plain ``Trainer``:

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

from fitbatch._state import EPOCH_KEY, NUM_REPLICAS_KEY
from fitbatch.integrations.accelerate import prepare_loader, state_at
from fitbatch.sampler._protocol import PlanSampler

logger = logging.getLogger(__name__)

#: the file in each checkpoint folder that holds the sampler's state there
SAMPLER_FILE = "fitbatch_sampler.json"


class FitbatchTrainerMixin:
    """The ``Trainer`` methods that make it train on fitbatch batches (see the module docstring).

    Put it before ``Trainer`` (or a subclass such as TRL's ``SFTTrainer``) in the bases:
    ``class MyTrainer(FitbatchTrainerMixin, SFTTrainer)``. :class:`FitbatchTrainer` is
    ``FitbatchTrainerMixin`` + ``transformers.Trainer``.

    Args:
        *args, **kwargs: the ``Trainer``'s.
        batch_sampler: a fitbatch sampler with state (``BudgetBatchSampler``,
            ``ScheduledBatchSampler``) over ``train_dataset``, built for this run's processes
            (``num_replicas=args.world_size, rank=args.process_index``).

    Raises:
        TypeError: ``batch_sampler`` is not a fitbatch sampler with state.
        ValueError: it was built for another world size or rank than the Trainer's.

    >>> FitbatchTrainerMixin(batch_sampler=[[0, 1], [2]])
    Traceback (most recent call last):
    ...
    TypeError: batch_sampler must be a fitbatch sampler with state (e.g. fitbatch.BudgetBatchSampler), got list
    """

    args: Any
    state: Any
    accelerator: Any
    train_dataset: Any
    data_collator: Any

    def __init__(self, *args: Any, batch_sampler: Any, **kwargs: Any) -> None:
        if not isinstance(batch_sampler, PlanSampler) or not hasattr(batch_sampler, "load_state_dict"):
            raise TypeError(
                "batch_sampler must be a fitbatch sampler with state (e.g. fitbatch.BudgetBatchSampler), "
                f"got {type(batch_sampler).__name__}"
            )
        hooks = ("set_initial_training_values", "_init_training_state", "_run_epoch", "_save_checkpoint")
        base = super()
        missing = [name for name in hooks if not hasattr(base, name)]
        if missing:
            raise RuntimeError(
                f"{type(self).__name__} overrides Trainer methods this transformers lacks ({', '.join(missing)}); "
                "install the integrations extra (transformers>=5.23)"
            )
        self.batch_sampler = batch_sampler
        super().__init__(*args, **kwargs)
        if self.args.train_sampling_strategy not in ("random", "sequential"):
            logger.info("train_sampling_strategy=%r is not used: the fitbatch sampler groups by size", self.args.train_sampling_strategy)

    # ------------------------------------------------------------------ the loader

    def get_train_dataloader(self) -> Any:
        """``DataLoader(train_dataset, batch_sampler=sampler, collate_fn=data_collator)``, prepared."""
        import torch.utils.data
        from transformers.trainer_utils import seed_worker
        from transformers.utils import is_datasets_available

        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        dataset, collator = self.train_dataset, self.data_collator
        n_sizes = len(self.batch_sampler._sizes)
        if hasattr(dataset, "__len__") and len(dataset) != n_sizes:
            raise ValueError(
                f"train_dataset has {len(dataset)} rows but the batch sampler was built over {n_sizes} sizes: "
                "build the sampler over the train_dataset's rows, one size each, in order"
            )
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
        return prepare_loader(self.accelerator, torch.utils.data.DataLoader(dataset, **params))

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


__all__ = ["SAMPLER_FILE", "FitbatchTrainer", "FitbatchTrainerMixin"]
