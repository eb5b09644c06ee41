"""Train a small causal transformer LM on the standard library's tokens: fixed vs fitbatch batches.

    python examples/train_lm.py                      # all three modes, about a minute on 2 CPU cores
    python examples/train_lm.py --mode packed --tokens 200000 --model-size small

Samples are the functions of the running Python's standard library, tokenised (no download;
see ``_lm_data.py``). Every mode trains the same model from the same initialisation on the
same number of real tokens under the same per-step memory budget (``--budget`` tokens):

* ``fixed``: the largest fixed batch size that never exceeds the budget (``budget // longest``),
  shuffled, padded to each batch's longest sample;
* ``padded``: ``fitbatch.BudgetBatchSampler(cost="padded", strategy="pooled")`` +
  padding to the batch's longest (batch size x longest <= budget);
* ``packed``: ``fitbatch.BudgetBatchSampler(cost="sum", strategy="packed")``; the batch is
  one row of concatenated samples with block-diagonal causal attention (no token attends to
  another sample) and positions restarting per sample.

It prints real (unpadded) tokens per second, the padded fraction and the held-out loss per
predicted token after the same number of real tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _lm_data as data  # noqa: E402
import _lm_model as lm  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=(*data.MODES, "all"), default="all")
    p.add_argument("--files", type=int, default=150, help="standard-library files to tokenise (0: all)")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--max-len", type=int, default=256, help="longer samples are truncated")
    p.add_argument("--budget", type=int, default=2048, help="tokens per batch (padded or summed)")
    p.add_argument("--tokens", type=int, default=30_000, help="real tokens to train on per mode")
    p.add_argument("--model-size", choices=sorted(lm.MODEL_SIZES), default="tiny")
    p.add_argument("--lr", type=float, default=3e-3, help="the fixed baseline's learning rate")
    p.add_argument("--lr-rule", choices=lm.LR_RULES, default="sqrt")
    p.add_argument("--attention", choices=lm.ATTENTIONS, default="auto", help="packed-mode attention")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    corpus = data.load_corpus(files=args.files or None, vocab_size=args.vocab, max_len=args.max_len, seed=args.seed)
    lengths = corpus.train_lengths
    print(
        f"{len(corpus.train)} train / {len(corpus.heldout)} held-out functions, {int(lengths.sum())} tokens "
        f"(median {int(sorted(lengths)[len(lengths) // 2])}, max {int(lengths.max())}), "
        f"tokenised in {time.perf_counter() - t0:.1f} s; fixed batch size {data.fixed_batch_size(lengths, args.budget)}"
    )
    modes = data.MODES if args.mode == "all" else (args.mode,)
    base_tps = float(lengths.sum()) / len(data.make_sampler("fixed", lengths, args.budget, seed=args.seed))
    rows = []
    for mode in modes:
        torch.manual_seed(args.seed)
        model = lm.TinyLM(lm.LMConfig.named(args.model_size, vocab=args.vocab, max_len=args.max_len))
        sampler = data.make_sampler(mode, lengths, args.budget, seed=args.seed)
        lr = lm.mode_lr(args.lr, float(lengths.sum()) / len(sampler), base_tps, args.lr_rule)
        res = lm.train_until(
            model, data.iterate_batches(mode, sampler, corpus.train),
            tokens=args.tokens, lr=lr, attention=args.attention,
        )
        loss = lm.evaluate(model, corpus.heldout)
        rows.append((mode, res, loss, lr))
        print(f"{mode}: {res.steps} steps, {res.real_tokens / res.seconds:.0f} tokens/s, held-out loss {loss:.3f}", flush=True)

    print(f"\nmodel {args.model_size} ({lm.n_params(model) / 1e6:.2f} M parameters), budget {args.budget} tokens, "
          f"{args.tokens} real tokens per mode, CPU threads {args.threads}\n")
    print("| mode | steps | lr | real tokens/s | vs fixed | padded fraction | held-out loss |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ref = rows[0][1].real_tokens / rows[0][1].seconds if rows[0][0] == "fixed" else None
    for mode, res, loss, lr in rows:
        tps = res.real_tokens / res.seconds
        ratio = f"{tps / ref:.2f}x" if ref else "-"
        print(f"| {mode} | {res.steps} | {lr:.2g} | {tps:.0f} | {ratio} | {res.padded_fraction:.3f} | {loss:.3f} |")


if __name__ == "__main__":
    main()
