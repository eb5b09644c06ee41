"""One rank of the gloo test of ``GradientAccumulator(normalize="loss_tokens")`` (tests/test_loss_tokens.py).

Usage: python loss_tokens_worker.py RANK WORLD INIT_FILE OUT_FILE

Each rank accumulates the micro-batches of a ``ScheduledBatchSampler`` built with
``loss_sizes=`` (the tokens whose label is not -100) into optimizer steps, twice: under
``DistributedDataParallel`` and with the plain model (the accumulator all-reduces itself). The
learning rate is 0, so every step's gradient is taken at the same parameters; it saves, per
step, this rank's samples, the step's loss units and the gradient.

Importing this module has no side effects; the test imports it for the data, the model and the
loss.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch

VOCAB, DIM = 19, 5
N_SAMPLES = 40
MICRO = 3
SCHEDULE = [10, 14, 8]


def make_data() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Token sequences and their labels: the next token, with a random share masked to -100."""
    gen = torch.Generator().manual_seed(11)
    lengths = torch.randint(1, 10, (N_SAMPLES,), generator=gen)
    items, labels = [], []
    for n in lengths.tolist():
        x = torch.randint(0, VOCAB, (n,), generator=gen)
        y = (x + 1) % VOCAB
        masked = torch.rand(n, generator=gen) < 0.4  # prompt tokens, padding: no loss
        items.append(x)
        labels.append(torch.where(masked, torch.full_like(y, -100), y))
    return items, labels


def sizes() -> list[int]:
    return [len(x) for x in make_data()[0]]


def loss_sizes() -> list[int]:
    return [int((y != -100).sum()) for y in make_data()[1]]


def schedule():
    from fitbatch.schedule import BatchSizeSchedule

    return BatchSizeSchedule.from_list(SCHEDULE, on_exhausted="cycle")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, DIM), torch.nn.Tanh(), torch.nn.Linear(DIM, VOCAB)
    )


def loss_sum(model: torch.nn.Module, batch: list[int]) -> torch.Tensor:
    """The SUM of the per-token losses of the batch's tokens that carry loss."""
    items, labels = make_data()
    total = torch.zeros(())
    for i in batch:
        total = total + torch.nn.functional.cross_entropy(
            model(items[i]), labels[i], ignore_index=-100, reduction="sum"
        )
    return total


def run(world: int, rank: int, ddp: bool) -> list[dict]:
    from fitbatch.schedule import GradientAccumulator, ScheduledBatchSampler

    net = make_model()
    model = torch.nn.parallel.DistributedDataParallel(net) if ddp else net
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    acc = GradientAccumulator(model, opt, lr_rule="none", normalize="loss_tokens")
    sampler = ScheduledBatchSampler(
        sizes(),
        schedule(),
        micro_batch_size=MICRO,
        num_replicas=world,
        rank=rank,
        seed=5,
        rounding="uneven",
        loss_sizes=loss_sizes(),
    )
    steps: list[dict] = []
    mine: list[int] = []
    for batch, info in sampler.with_info():
        mine += batch
        if acc.backward(loss_sum(model, batch), info):
            grads = [p.grad.clone() for p in net.parameters()]
            steps.append(
                {
                    "step": info.step,
                    "samples": mine,
                    "loss_units": info.step_loss_units,
                    "grads": grads,
                }
            )
            mine = []
    return steps


def main(rank: int, world: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        torch.save({"ddp": run(world, rank, True), "plain": run(world, rank, False)}, out_file)
        dist.barrier()  # no rank tears the group down while another is still in a collective
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
