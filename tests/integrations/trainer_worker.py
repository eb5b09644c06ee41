"""One process of a real ``transformers.Trainer`` run (gloo, CPU); started by tests/test_integrations.py.

    torchrun --standalone --nproc-per-node 2 trainer_worker.py --out /tmp/x --phase full

A tiny random-initialised ``LlamaForCausalLM`` (from a config, no download) trains with
:class:`fitbatch.integrations.transformers.FitbatchTrainer` on 240 token sequences of 8-96
tokens, two epochs, ``gradient_accumulation_steps=2``. Phases:

* ``full``: padded budget batches (a ``pad`` collator), a checkpoint every ``--save-steps``;
* ``resume``: the same run with ``resume_from_checkpoint`` at ``checkpoint-<--resume-step>``;
* ``packed``: packed batches (``cost="sum"``, ``strategy="packed"``) with transformers'
  ``DataCollatorWithFlattening``, one epoch.

A mismatched sampler is tried first (``mismatch`` in the output): in ``full``, sizes one short
per row (refused when the trainer is built); in ``packed``, the padded collator under the sum
plan (refused at the first collated batch).

Each process writes ``{phase}-rank{r}.json``: every micro-batch it trained (``[global_step,
epoch, sample ids, num_items_in_batch]``), each epoch's ``step_totals``, and its final
parameters.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

N, VOCAB, BUDGET = 240, 64, 600


def sequences() -> list[list[int]]:
    lengths = np.random.default_rng(0).integers(8, 97, N)
    return [[int((7 * i + 3 * t) % (VOCAB - 1) + 1) for t in range(n)] for i, n in enumerate(lengths)]


def pad(features: list[dict]) -> dict:
    """Padded causal-LM batch: input_ids, attention_mask, labels (-100 on padding), sample_ids."""
    import torch

    width = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, f in enumerate(features):
        ids[row, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[row, : len(f["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels,
            "sample_ids": torch.tensor([f["sample_id"] for f in features])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--phase", choices=("full", "resume", "packed"), required=True)
    p.add_argument("--save-steps", type=int, default=13)
    p.add_argument("--resume-step", type=int, default=13)
    p.add_argument("--window", type=int, default=0, help="plan in windows of this many samples (0: one plan)")
    args = p.parse_args()

    import torch
    from transformers import (
        DataCollatorWithFlattening,
        LlamaConfig,
        LlamaForCausalLM,
        TrainingArguments,
    )

    import fitbatch
    from fitbatch.integrations.transformers import FitbatchTrainer

    torch.set_num_threads(1)
    packed = args.phase == "packed"
    targs = TrainingArguments(
        output_dir=str(args.out / "run"), use_cpu=True, ddp_backend="gloo", num_train_epochs=1 if packed else 2,
        gradient_accumulation_steps=2, learning_rate=3e-3, save_strategy="steps", save_steps=args.save_steps,
        logging_steps=1, report_to="none", seed=0, disable_tqdm=True, remove_unused_columns=False,
    )
    seqs = sequences()
    dataset = [{"input_ids": s, "sample_id": i} for i, s in enumerate(seqs)]
    lengths = [len(s) for s in seqs]
    if packed:
        flatten = DataCollatorWithFlattening()

        def collate(features: list[dict]) -> dict:
            batch = flatten([{"input_ids": f["input_ids"]} for f in features])
            batch["sample_ids"] = torch.tensor([f["sample_id"] for f in features])
            return batch

        options = {"cost": "sum", "strategy": "packed"}
    else:
        # shuffled in-order planning: epochs 0 and 1 have 19 and 20 batches per rank (one
        # count would lose a batch of epoch 1; 19 leaves a last step of one micro-batch)
        collate, options = pad, {"cost": "padded", "strategy": "sequential", "shuffle": True}
    sampler = fitbatch.BudgetBatchSampler(
        lengths, BUDGET, seed=0, num_replicas=targs.world_size, rank=targs.process_index,
        window=args.window or "auto", **options,
    )
    totals = {e: [t.tolist() for t in sampler.step_totals(e)] for e in range(2)}
    log: list = []

    class Logged(FitbatchTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            ids = inputs.pop("sample_ids").tolist()
            items = None if num_items_in_batch is None else int(num_items_in_batch)
            log.append([self.state.global_step, self.batch_sampler.epoch, ids, items])
            return super().training_step(model, inputs, num_items_in_batch)

    mismatch = ""
    if args.phase == "full":  # sizes one short per row: refused when the trainer is built
        short = fitbatch.BudgetBatchSampler([n - 1 for n in lengths], BUDGET, seed=0, num_replicas=targs.world_size,
                                            rank=targs.process_index, **options)
        try:
            FitbatchTrainer(model=torch.nn.Linear(1, 1), args=targs, train_dataset=dataset, data_collator=collate,
                            batch_sampler=short)
        except ValueError as exc:
            mismatch = str(exc)
    elif packed:  # the padded collator under the packed sum plan: refused at the first collated batch
        again = fitbatch.BudgetBatchSampler(lengths, BUDGET, seed=0, num_replicas=targs.world_size,
                                            rank=targs.process_index, window=args.window or "auto", **options)
        wrong = FitbatchTrainer(model=torch.nn.Linear(1, 1), args=targs, train_dataset=dataset, data_collator=pad,
                                batch_sampler=again)
        try:
            next(iter(wrong.get_train_dataloader()))
        except ValueError as exc:
            mismatch = str(exc)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024)
    model = LlamaForCausalLM(config)
    trainer = Logged(model=model, args=targs, train_dataset=dataset, data_collator=collate, batch_sampler=sampler)
    resume = str(args.out / "run" / f"checkpoint-{args.resume_step}") if args.phase == "resume" else None
    trainer.train(resume_from_checkpoint=resume)
    out = {"rank": targs.process_index, "world": targs.world_size, "log": log, "totals": totals,
           "lengths": lengths, "mismatch": mismatch, "global_step": trainer.state.global_step,
           "params": torch.cat([q.detach().flatten() for q in model.parameters()]).tolist()}
    (args.out / f"{args.phase}-rank{targs.process_index}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
