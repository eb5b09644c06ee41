"""fitbatch under launchers and trainers: accelerate, the Hugging Face ``Trainer``, and the rest.

* ``accelerator.prepare(DataLoader(ds, batch_sampler=sampler, ...))`` works as it is: a fitbatch
  sampler recognises accelerate's ``BatchSamplerShard`` and hands it the global step layout,
  so each rank still runs exactly fitbatch's batches (``_sharding`` says how, and which
  configurations are refused at the first batch).
* :mod:`fitbatch.integrations.accelerate` — ``prepare(accelerator, loader)``: the same batches,
  plus fitbatch's own cursor registered for ``accelerator.save_state``/``load_state`` (exact
  mid-epoch resume, in O(1), on any world size) and ``set_epoch`` that reaches the sampler.
* :mod:`fitbatch.integrations.verl` — ``get_seqlen_balanced_partitions`` and
  ``rearrange_micro_batches`` with verl's signatures: one import changed, and each micro-batch
  is under ``max_token_len`` (``docs/rl.md``).
* :mod:`fitbatch.integrations.transformers` — ``FitbatchTrainer`` / ``FitbatchTrainerMixin``:
  a ``transformers.Trainer`` (or TRL's ``SFTTrainer``) that trains on a fitbatch sampler's
  batches, built from the rows it prepared (``BudgetSampling``), with every collated batch
  checked against the budget, epochs of varying length, token-normalised gradient accumulation
  and exact ``resume_from_checkpoint``.

Lightning, torchdata's ``StatefulDataLoader`` and plain loops need no adapter:
``docs/integrations.md`` shows each. Nothing here is imported by ``import fitbatch``, and each
module imports its framework only when used (the ``integrations`` extra installs them all).

>>> import fitbatch.integrations
>>> sorted(fitbatch.integrations.MODULES)
['accelerate', 'transformers', 'verl']
"""

from __future__ import annotations

#: the framework adapters, each ``fitbatch.integrations.<name>``
MODULES = ("accelerate", "transformers", "verl")

__all__ = ["MODULES"]
