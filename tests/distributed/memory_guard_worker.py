"""One rank of the 2-process gloo test of OOMGuard (run by tests/test_memory_guard.py).

Usage: python memory_guard_worker.py RANK WORLD INIT_FILE OUT_FILE

Importing this module has no side effects; the test also imports it for the shared model, data
and the unsplit reference.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch

VOCAB, DIM, PAD = 40, 8, -100
THRESHOLD = 60  # padded tokens a micro-batch may hold before the test double "runs out of memory"


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, DIM), torch.nn.Tanh(), torch.nn.Linear(DIM, VOCAB)
    )


def make_batches(rank: int, steps: int = 2) -> list[list[torch.Tensor]]:
    """Rank 1's batches are long enough to exceed THRESHOLD whole, rank 0's are not."""
    gen = torch.Generator().manual_seed(100 + rank)
    batches = []
    for _ in range(steps):
        n = 3 if rank == 0 else 6
        lengths = torch.randint(3, 6 if rank == 0 else 20, (n,), generator=gen)
        batches.append([torch.randint(0, VOCAB, (int(L),), generator=gen) for L in lengths])
    return batches


def collate(items: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(x) for x in items)
    inputs = torch.zeros(len(items), longest, dtype=torch.long)
    targets = torch.full((len(items), longest), PAD, dtype=torch.long)
    for i, x in enumerate(items):
        inputs[i, : len(x)] = x
        targets[i, : len(x)] = (x + 1) % VOCAB
    return inputs, targets


def token_mean_loss(model: torch.nn.Module, items: list[torch.Tensor]) -> torch.Tensor:
    inputs, targets = collate(items)
    logits = model(inputs)
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=PAD
    )


def reference_params(steps: int = 2, world: int = 2, lr: float = 0.1) -> dict[str, torch.Tensor]:
    """Unsplit data-parallel SGD: average of each rank's whole-batch gradient."""
    model = make_model()
    batches = [make_batches(r, steps) for r in range(world)]
    for step in range(steps):
        grads = []
        for r in range(world):
            model.zero_grad(set_to_none=True)
            token_mean_loss(model, batches[r][step]).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= lr * sum(g[i] for g in grads) / world
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class BudgetSampler:
    def __init__(self, budget: float) -> None:
        self.budget = budget

    def set_budget(self, budget: float) -> None:
        self.budget = budget


def main(rank: int, world: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from fitbatch.costs import PaddedCost
    from fitbatch.memory.guard import OOMGuard

    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        net = make_model()
        ddp = DistributedDataParallel(net, broadcast_buffers=False)
        sampler = BudgetSampler(200.0)
        guard = OOMGuard(
            ddp,
            torch.optim.SGD(ddp.parameters(), lr=0.1),
            sampler=sampler,
            size_fn=len,
            cost=PaddedCost(),
        )

        def loss_fn(items: list[torch.Tensor]) -> torch.Tensor:
            if rank == 1 and len(items) * max(len(x) for x in items) > THRESHOLD:
                raise torch.OutOfMemoryError("test double: micro-batch over the threshold")
            return token_mean_loss(ddp, items)

        for batch in make_batches(rank):
            guard.step(batch, loss_fn)
        torch.save(
            {
                "params": net.state_dict(),
                "budget": sampler.budget,
                "parts": [e.parts for e in guard.events],
                "ooms": guard.ooms,
            },
            out_file,
        )
        dist.barrier()  # no rank tears the group down while another is still in a collective
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
    # done (its file written, the group destroyed): leave without the interpreter's teardown, where
    # DDP's and gloo's native threads meet C++ static destructors and, about 1 run in 6 on the
    # 2-core VM, abort with "terminate called without an active exception" (torch, not fitbatch)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
