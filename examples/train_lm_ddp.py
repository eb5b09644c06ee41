"""The LM of ``train_lm.py`` under ``torchrun``: DistributedDataParallel on CPU (gloo).

    torchrun --nproc-per-node 2 examples/train_lm_ddp.py            # all modes, about a minute
    torchrun --nproc-per-node 2 examples/train_lm_ddp.py --mode packed --tokens 100000

Every rank builds the same ``BudgetBatchSampler``; fitbatch reads the rank and world size from
``torch.distributed``, plans the same global epoch from ``(seed, epoch)`` with no
communication, and gives every rank the same number of cost-balanced steps. The loss of a
step is normalised by the step's predicted tokens over *all* ranks, which
``sampler.step_totals()`` knows in advance (no all-reduce); the fixed baseline
(``DistributedSampler`` + a fixed batch size) has to all-reduce its counts. Rank 0 prints
the table; the run also checks that the replicas' weights agree at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _lm_data as data  # noqa: E402
import _lm_model as lm  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=(*data.MODES, "all"), default="all")
    p.add_argument("--files", type=int, default=100)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--budget", type=int, default=1024, help="tokens per batch per rank")
    p.add_argument("--tokens", type=int, default=30_000, help="real tokens per mode, all ranks together")
    p.add_argument("--model-size", choices=sorted(lm.MODEL_SIZES), default="tiny")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lr-rule", choices=lm.LR_RULES, default="sqrt")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    corpus = data.load_corpus(files=args.files or None, vocab_size=args.vocab, max_len=args.max_len, seed=args.seed)
    lengths = corpus.train_lengths
    base = data.make_sampler("fixed", lengths, args.budget, seed=args.seed, num_replicas=world, rank=rank)
    base_tps = float(lengths.sum()) / len(base)
    rows = []
    for mode in data.MODES if args.mode == "all" else (args.mode,):
        torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts them)
        net = lm.TinyLM(lm.LMConfig.named(args.model_size, vocab=args.vocab, max_len=args.max_len))
        model = DistributedDataParallel(net) if dist.is_initialized() else net
        # rank and world size could be left out: fitbatch reads them from torch.distributed
        sampler = data.make_sampler(mode, lengths, args.budget, seed=args.seed, num_replicas=world, rank=rank)
        lr = lm.mode_lr(args.lr, float(lengths.sum()) / len(sampler), base_tps, args.lr_rule)
        res = lm.train_until(
            model, data.iterate_batches(mode, sampler, corpus.train, world=world),
            tokens=args.tokens, lr=lr, world=world,
        )
        flat = torch.cat([q.detach().flatten() for q in net.parameters()])
        if dist.is_initialized():  # replicas must agree after the same steps
            spread = flat.clone()
            dist.all_reduce(spread, op=dist.ReduceOp.MAX)
            if not torch.equal(spread, flat):
                raise RuntimeError(f"rank {rank}: weights differ from other ranks after {mode}")
            counts = torch.tensor([res.real_tokens, res.slots], dtype=torch.float64)
            dist.all_reduce(counts)
            res.real_tokens, res.slots = int(counts[0]), int(counts[1])
            seconds = torch.tensor([res.seconds])
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            res.seconds = float(seconds)
        loss = lm.evaluate(net, corpus.heldout)
        rows.append((mode, res, loss))
    if rank == 0:
        print(f"{world} rank(s), budget {args.budget} tokens per rank, {args.tokens} real tokens per mode; "
              "replica weights identical after every mode\n")
        print("| mode | steps per rank | real tokens/s (all ranks) | padded fraction | held-out loss |")
        print("|---|---:|---:|---:|---:|")
        for mode, res, loss in rows:
            print(f"| {mode} | {res.steps} | {res.real_tokens / res.seconds:.0f} | {res.padded_fraction:.3f} | {loss:.3f} |")
    if dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another is still in a collective
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
