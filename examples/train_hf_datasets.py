"""fitbatch with a Hugging Face ``datasets.Dataset``: budget batches from a length column.

    python examples/train_hf_datasets.py                  # padded budget batches, under a minute
    python examples/train_hf_datasets.py --mode packed

The standard library's tokenised functions (no download) become an in-memory
``datasets.Dataset`` with an ``input_ids`` column; a batched ``map`` adds the ``length``
column, which is all the sampler needs:

    sampler = fitbatch.BudgetBatchSampler(ds["length"], budget, cost="padded", strategy="pooled")
    loader = DataLoader(ds.with_format("numpy"), batch_sampler=sampler, collate_fn=...)

``datasets`` reads rows by index, so a batch sampler works unchanged (a streaming
``IterableDataset`` has no indices: plan over a buffer with ``fitbatch.streaming`` instead).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import datasets
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _lm_data as data  # noqa: E402
import _lm_model as lm  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    args = lm.short_run_parser(__doc__.splitlines()[0]).parse_args(argv)

    import fitbatch

    datasets.disable_progress_bars()
    corpus = data.load_corpus(files=args.files or None, vocab_size=args.vocab, max_len=args.max_len, seed=args.seed)
    ds = datasets.Dataset.from_dict({"input_ids": [s.tolist() for s in corpus.train]})
    ds = ds.map(lambda b: {"length": [len(x) for x in b["input_ids"]]}, batched=True)

    cost, strategy = ("padded", "pooled") if args.mode == "padded" else ("sum", "packed")
    sampler = fitbatch.BudgetBatchSampler(ds["length"], args.budget, cost=cost, strategy=strategy, seed=args.seed)
    pack = lm.collate_padded if args.mode == "padded" else lm.collate_packed

    def collate(rows: list[dict[str, Any]]) -> lm.LMBatch:
        return pack([row["input_ids"] for row in rows])

    loader = DataLoader(ds.with_format("numpy"), batch_sampler=sampler, collate_fn=collate)

    def batches() -> Any:  # endless epochs; per-batch loss normaliser = its predicted tokens
        for epoch in range(1_000_000):
            sampler.set_epoch(epoch)
            for batch in loader:
                yield batch, batch.real_tokens, int((batch.targets != -100).sum())

    torch.manual_seed(args.seed)
    model = lm.TinyLM(lm.LMConfig.named(args.model_size, vocab=args.vocab, max_len=args.max_len))
    res = lm.train_until(model, batches(), tokens=args.tokens, lr=args.lr)
    loss = lm.evaluate(model, corpus.heldout)
    print(f"{args.mode}: {len(ds)} rows, {len(sampler)} batches per epoch; {res.steps} steps, "
          f"{res.real_tokens} real tokens, {res.real_tokens / res.seconds:.0f} tokens/s, "
          f"padded fraction {res.padded_fraction:.3f}, held-out loss {loss:.3f}")


if __name__ == "__main__":
    main()
