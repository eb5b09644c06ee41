"""One rank of a real DDP run (gloo, CPU) over a real length set; started by tests/test_distributed.py.

    python dist_train.py --init file:///tmp/x/store --world 2 --rank 0 --out /tmp/x --phase full

Phases:

* ``full``: one uninterrupted epoch. Rank 0 then replays the same steps in one process (every
  step's batches of all ranks as one batch, mean token loss) and saves those parameters too.
* ``stop``: a ``DataLoader`` with 2 workers (it prefetches ahead of the loop); after
  ``--stop-after`` steps rank 0 saves model, optimizer and ``sampler.state_dict(step=k)``.
* ``resume``: loads that checkpoint (on any world size) and runs the rest of the epoch.

Each rank writes ``{phase}-rank{r}.json`` (its batches, the step totals it checked, what the
sampler read from ``torch.distributed``) and ``{phase}-rank{r}.npy`` (its final parameters).
Every sample index i is a sequence of ``lengths[i]`` tokens that step by 7 from a start of its own.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

VOCAB = 32


def tokens(i: int, length: int):
    import torch

    return (i * 2654435761 + 7 * torch.arange(length)) % VOCAB


def make_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)).double()


def token_loss_sum(model, batch):
    """Sum of next-token cross-entropies over the real (unpadded) positions of a padded batch."""
    import torch.nn.functional as F

    x, mask = batch.values, batch.mask
    loss = F.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:], reduction="none")
    return (loss * mask[:, 1:]).sum()


def flat_params(model) -> np.ndarray:
    return np.concatenate([q.detach().numpy().ravel() for q in model.parameters()])


def replay_single_process(sampler, lengths: np.ndarray) -> np.ndarray:
    """The same epoch in one process: step k = the batches of all ranks at step k, one mean loss."""
    import torch

    import fitbatch

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    steps = sampler.steps()
    for k in range(steps.n_steps):
        idx = np.concatenate([steps.plan[int(b)] for b in steps.grid[k]])
        batch = fitbatch.pad_collate([tokens(int(i), int(lengths[i])) for i in idx])
        n_targets = int(batch.mask[:, 1:].sum())
        opt.zero_grad()
        (token_loss_sum(model, batch) / n_targets).backward()
        opt.step()
    return flat_params(model)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--init", required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--phase", choices=("full", "stop", "resume"), required=True)
    p.add_argument("--lengths", type=Path, required=True)
    p.add_argument("--budget", type=float, default=16384)
    p.add_argument("--stop-after", type=int, default=0)
    p.add_argument("--checkpoint", type=Path)
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset

    import fitbatch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init, world_size=args.world, rank=args.rank)
    world, rank = dist.get_world_size(), dist.get_rank()
    lengths = np.load(args.lengths)

    class Sequences(Dataset):
        def __len__(self) -> int:
            return len(lengths)

        def __getitem__(self, i: int):
            return {"index": i, "tokens": tokens(i, int(lengths[i]))}

    # num_replicas and rank left out on purpose: read from torch.distributed
    sampler = fitbatch.BudgetBatchSampler(lengths, args.budget, cost="padded", seed=3)
    loader = DataLoader(
        Sequences(), batch_sampler=sampler, collate_fn=fitbatch.pad_collate,
        num_workers=2 if args.phase == "stop" else 0,
    )
    net = make_model()
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    if args.phase == "resume":
        ckpt = torch.load(args.checkpoint, weights_only=False)
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sampler.load_state_dict(ckpt["sampler"])
    first = sampler.state_dict()["step"]
    step_samples, step_units, _ = sampler.step_totals()
    batches: list[list[int]] = []
    mismatches = 0
    for k, sample in enumerate(loader, start=first):
        batch = sample["tokens"]
        batches.append(sample["index"].tolist())  # what the DataLoader really delivered
        # the sampler's per-step totals, checked against what the ranks really got
        got = torch.tensor([float(len(batch.lengths)), float(batch.lengths.sum())], dtype=torch.float64)
        dist.all_reduce(got)
        mismatches += int(got[0] != step_samples[k] or got[1] != step_units[k])
        loss = token_loss_sum(model, batch)
        opt.zero_grad()
        (loss * world / (step_units[k] - step_samples[k])).backward()  # DDP averages over ranks
        opt.step()
        if args.phase == "stop" and k + 1 == args.stop_after:
            if rank == 0:
                state = {"model": net.state_dict(), "optimizer": opt.state_dict(),
                         "sampler": sampler.state_dict(step=k + 1)}
                torch.save(state, args.checkpoint)
            break
    gathered: list = [None] * world
    dist.all_gather_object(gathered, batches)
    seen = [i for rank_batches in gathered for b in rank_batches for i in b]
    record = {
        "world": sampler.num_replicas,
        "rank": sampler.rank,
        "first": first,
        "steps": len(batches),
        "n_steps": len(step_samples),  # steps of the epoch, also those run before a resume
        "batches": batches,
        "gathered_seen": len(seen),
        "gathered_unique": len(set(seen)),
        "mismatches": mismatches,
        "prefetched_position": sampler.state_dict()["step"],
        "straggler_ratio": sampler.plan().stats().straggler_ratio,
        "pid": os.getpid(),
    }
    np.save(args.out / f"{args.phase}-rank{rank}.npy", flat_params(net))
    if args.phase == "full" and rank == 0:
        np.save(args.out / "full-single.npy", replay_single_process(sampler, lengths))
    (args.out / f"{args.phase}-rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
