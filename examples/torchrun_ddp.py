"""DistributedDataParallel with fitbatch under torchrun: equal, cost-balanced steps on every rank.

    torchrun --nproc_per_node=2 examples/torchrun_ddp.py
    torchrun --nproc_per_node=2 examples/torchrun_ddp.py --checkpoint /tmp/ckpt.pt --stop-after 50
    torchrun --nproc_per_node=3 examples/torchrun_ddp.py --checkpoint /tmp/ckpt.pt   # resume on 3

A bigram language model trains for one epoch, on CPU with the gloo backend, over the real
lengths of the 58,754 functions of the CPython standard library (``tests/data``), each a
deterministic token sequence of its length. Every rank builds the same sampler; it reads the rank
and world size from ``torch.distributed``, plans the same global epoch from ``(seed, epoch)``
with no communication and yields the same number of cost-balanced batches on every rank.

The loss of a step is the token-sum over this rank's batch divided by the step's target tokens
over *all* ranks (known in advance from ``sampler.step_totals()``), times the world size because
DDP averages gradients: the update equals the one of a single batch holding the whole step.

With ``--checkpoint``, the model, optimizer and sampler state are saved every ``--save-every``
steps (``sampler.state_dict(step=...)`` with the loop's own count, as a DataLoader with workers
prefetches ahead of the loop) and loaded at start: the run continues with exactly the batches an
uninterrupted run would have seen, on the same world size or, re-planned, on another one.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import fitbatch

LENGTHS = Path(__file__).resolve().parents[1] / "tests" / "data" / "cpython_stdlib_functions.npy"


class Sequences(Dataset):
    """Sample ``i``: ``lengths[i]`` tokens that step by 7 (mod vocab) from a start of its own."""

    def __init__(self, lengths: np.ndarray, vocab: int) -> None:
        self.lengths, self.vocab = lengths, vocab

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        start = (i * 2654435761) % self.vocab
        return (start + 7 * torch.arange(int(self.lengths[i]))) % self.vocab


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=Path, default=LENGTHS, help=".npy of per-sample lengths")
    p.add_argument("--budget", type=int, default=16384, help="padded tokens per batch per rank")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--checkpoint", type=Path, help="save to / resume from this file")
    p.add_argument("--save-every", type=int, default=25)
    p.add_argument("--stop-after", type=int, help="stop after this step (to try a resume)")
    args = p.parse_args()

    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.set_num_threads(1)

    lengths = np.load(args.lengths)
    # No num_replicas/rank: read from torch.distributed. Same seed on every rank.
    # loss_sizes: the tokens of each sequence that carry loss (its next-token targets, L - 1)
    sampler = fitbatch.BudgetBatchSampler(lengths, args.budget, cost="padded", seed=0, loss_sizes=np.maximum(lengths - 1, 0))
    loader = DataLoader(
        Sequences(lengths, args.vocab), batch_sampler=sampler, collate_fn=fitbatch.pad_collate,
        num_workers=args.workers,
    )
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Embedding(args.vocab, 32), torch.nn.Linear(32, args.vocab))
    model = DistributedDataParallel(net) if dist.is_initialized() else net
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    if args.checkpoint and args.checkpoint.exists():
        ckpt = torch.load(args.checkpoint, weights_only=False)
        net.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        sampler.load_state_dict(ckpt["sampler"])  # any world size: the rest is re-planned
    first = sampler.state_dict()["step"]  # where this run starts in the epoch's steps
    targets = sampler.step_totals().loss_units  # next-token targets per step, all ranks together

    t0, total, done = time.perf_counter(), 0.0, first
    for k, batch in enumerate(loader, start=first):
        x, mask = batch.values, batch.mask
        logits = model(x[:, :-1])
        token_loss = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        loss_sum = (token_loss * mask[:, 1:]).sum()
        optimizer.zero_grad()
        (loss_sum * world / targets[k]).backward()  # DDP averages gradients over ranks
        optimizer.step()
        total += loss_sum.item()
        done = k + 1
        if args.checkpoint and (done % args.save_every == 0 or done == args.stop_after) and rank == 0:
            state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                     "sampler": sampler.state_dict(step=done)}
            torch.save(state, args.checkpoint)
        if done == args.stop_after:
            break

    flat = torch.cat([q.detach().flatten() for q in net.parameters()])
    stats = torch.tensor([total, float(targets[first:done].sum())], dtype=torch.float64)
    agree = True
    if dist.is_initialized():
        dist.all_reduce(stats)
        stats[1] /= world  # every rank added the global target count
        high = flat.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        agree = torch.equal(high, flat)
        ok = torch.tensor([int(agree)])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        agree = bool(ok)
    if rank == 0:
        print(f"world {world}: steps {first}..{done} of {len(targets)} per rank, "
              f"{time.perf_counter() - t0:.1f} s, mean token loss {float(stats[0] / stats[1]):.3f}")
        print(f"rank 0 plan: {sampler.plan().stats().summary()}")
        print(f"replica weights identical: {agree}")
    if dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another is still in a collective
        dist.destroy_process_group()
    if not agree:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
