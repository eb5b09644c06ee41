"""The LM of ``train_lm.py`` with a Lightning ``Trainer`` and fitbatch's batch sampler.

    python examples/train_lightning.py                    # padded budget batches, under a minute
    python examples/train_lightning.py --mode packed

Two settings matter when a ``DataLoader`` carries a budget ``batch_sampler``:

* ``Trainer(use_distributed_sampler=False)``: otherwise Lightning replaces the sampler with
  its own ``DistributedSampler`` when running on several devices. fitbatch's sampler reads
  the rank and world size from ``torch.distributed`` itself and gives every rank the same
  number of steps;
* nothing else: Lightning calls ``set_epoch`` on the loader's ``batch_sampler`` at every epoch,
  so each epoch gets a fresh plan from ``(seed, epoch)``.

The loss is the mean over each batch's predicted tokens; training stops after ``--tokens``
real tokens (a callback), and the held-out loss is printed at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _lm_data as data  # noqa: E402
import _lm_model as lm  # noqa: E402


class LitLM(L.LightningModule):
    def __init__(self, cfg: lm.LMConfig, lr: float, tokens: int) -> None:
        super().__init__()
        self.model, self.lr, self.tokens = lm.TinyLM(cfg), lr, tokens
        self.consumed = 0

    def training_step(self, batch: lm.LMBatch, batch_idx: int) -> torch.Tensor:
        for group in self.optimizers().param_groups:  # the same token-based schedule as train_lm.py
            group["lr"] = lm.token_lr(self.lr, self.consumed, self.tokens)
        total, n = self.model(batch)
        loss = total / n.clamp(min=1)
        self.consumed += batch.real_tokens
        self.log("loss", loss, prog_bar=True, batch_size=batch.tokens.shape[0])
        self.log("real_tokens", float(self.consumed), prog_bar=True, batch_size=batch.tokens.shape[0])
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def transfer_batch_to_device(self, batch: lm.LMBatch, device: torch.device, dataloader_idx: int) -> lm.LMBatch:
        return batch.to(device)


class StopAfterTokens(L.Callback):
    def on_train_batch_end(self, trainer: L.Trainer, module: LitLM, *args: Any) -> None:
        if module.consumed >= module.tokens:
            trainer.should_stop = True


def main(argv: list[str] | None = None) -> None:
    args = lm.short_run_parser(__doc__.splitlines()[0]).parse_args(argv)

    import fitbatch

    torch.manual_seed(args.seed)
    corpus = data.load_corpus(files=args.files or None, vocab_size=args.vocab, max_len=args.max_len, seed=args.seed)
    lengths = corpus.train_lengths
    cost, strategy = ("padded", "pooled") if args.mode == "padded" else ("sum", "packed")
    sampler = fitbatch.BudgetBatchSampler(lengths, args.budget, cost=cost, strategy=strategy, seed=args.seed)
    collate = lm.collate_padded if args.mode == "padded" else lm.collate_packed
    loader = DataLoader(data.TokenDataset(corpus.train), batch_sampler=sampler, collate_fn=collate)

    module = LitLM(lm.LMConfig.named(args.model_size, vocab=args.vocab, max_len=args.max_len), args.lr, args.tokens)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=-1,
        use_distributed_sampler=False,  # keep fitbatch's batch sampler (it is rank-aware itself)
        callbacks=[StopAfterTokens()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
    )
    trainer.fit(module, loader)
    loss = lm.evaluate(module.model, corpus.heldout)
    print(f"{args.mode}: {trainer.global_step} steps, {module.consumed} real tokens, "
          f"{len(sampler)} batches per epoch; held-out loss {loss:.3f}")


if __name__ == "__main__":
    main()
