"""One process of a real TRL ``SFTTrainer`` run with fitbatch batches (gloo, CPU); started by tests/test_trl.py.

    torchrun --standalone --nproc-per-node 2 sft_worker.py --out /tmp/x --phase full

What a TRL user writes from docs/integrations.md: ``class Trainer(FitbatchTrainerMixin,
SFTTrainer)`` with ``batch_sampler=BudgetSampling(BUDGET)`` over a ``"text"`` dataset (TRL
tokenises it and appends EOS), ``shuffle_dataset=True`` and ``pad_to_multiple_of=8``, a tiny
random-initialised Llama and an in-memory tokenizer (``tiny_lm``), two epochs,
``gradient_accumulation_steps=2``. Phases:

* ``full``: a checkpoint every ``--save-steps``; first, a sampler over the raw texts' token
  counts (no EOS, the order before TRL's shuffle) is refused at construction;
* ``resume``: the same run resumed from ``checkpoint-<--resume-step>``.

Each process writes ``{phase}-rank{r}.json``: every micro-batch (``[global_step, epoch, rows,
shape, num_items_in_batch]``, rows as their real token ids), the prepared rows, each epoch's
step totals, what was refused, and its final parameters.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

N, BUDGET, MULTIPLE = 96, 256, 8


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--phase", choices=("full", "resume"), required=True)
    p.add_argument("--save-steps", type=int, default=5)
    p.add_argument("--resume-step", type=int, default=5)
    args = p.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tiny_lm
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    import fitbatch
    from fitbatch.integrations.transformers import BudgetSampling, FitbatchTrainerMixin

    torch.set_num_threads(1)
    tok = tiny_lm.tokenizer()
    texts = tiny_lm.texts(N)
    config = SFTConfig(
        output_dir=str(args.out / "run"), use_cpu=True, ddp_backend="gloo", num_train_epochs=2,
        gradient_accumulation_steps=2, learning_rate=3e-3, save_strategy="steps", save_steps=args.save_steps,
        logging_steps=1, report_to="none", seed=0, disable_tqdm=True, shuffle_dataset=True,
        pad_to_multiple_of=MULTIPLE,
    )
    log: list = []

    class Trainer(FitbatchTrainerMixin, SFTTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            real = inputs["attention_mask"].bool()
            rows = [ids[m].tolist() for ids, m in zip(inputs["input_ids"], real)]
            items = None if num_items_in_batch is None else int(num_items_in_batch)
            log.append([self.state.global_step, self.batch_sampler.epoch, rows, list(inputs["input_ids"].shape), items])
            return super().training_step(model, inputs, num_items_in_batch)

    refused = ""
    if args.phase == "full":  # the sizes a user measures from the raw texts: no EOS, TRL's shuffle unseen
        raw = fitbatch.BudgetBatchSampler([len(tok(t)["input_ids"]) for t in texts], BUDGET, seed=0,
                                          num_replicas=config.world_size, rank=config.process_index)
        try:
            Trainer(model=tiny_lm.model(len(tok)), args=config, train_dataset=Dataset.from_dict({"text": texts}),
                    processing_class=tok, batch_sampler=raw)
        except ValueError as exc:
            refused = str(exc)
    model = tiny_lm.model(len(tok))
    trainer = Trainer(model=model, args=config, train_dataset=Dataset.from_dict({"text": texts}),
                      processing_class=tok, batch_sampler=BudgetSampling(BUDGET))
    sampler = trainer.batch_sampler
    totals = {e: [t.tolist() for t in sampler.step_totals(e)] for e in range(2)}
    resume = str(args.out / "run" / f"checkpoint-{args.resume_step}") if args.phase == "resume" else None
    trainer.train(resume_from_checkpoint=resume)
    out = {"rank": config.process_index, "world": config.world_size, "log": log, "totals": totals,
           "prepared": [list(r) for r in trainer.train_dataset["input_ids"]], "refused": refused, "eos": tok.eos_token_id,
           "global_step": trainer.state.global_step,
           "num_tokens": [x["num_tokens"] for x in trainer.state.log_history if "num_tokens" in x],
           "params": torch.cat([q.detach().flatten() for q in model.parameters()]).tolist()}
    (args.out / f"{args.phase}-rank{config.process_index}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
