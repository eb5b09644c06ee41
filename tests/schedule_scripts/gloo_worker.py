"""One rank of the gloo tests of fitbatch.schedule (run by tests/test_schedule.py).

Usage: python gloo_worker.py RANK WORLD INIT_FILE OUT_FILE TRACE_FILE NORMALIZE

Each rank trains a tiny token model for two epochs following TRACE_FILE under DDP, twice: once
straight through, once stopped mid-epoch 0, checkpointed, rebuilt from scratch and resumed. It
saves, per step, its micro-batches, the learning rate and the step totals, the gradient of the
first step and the final parameters of both runs.

Importing this module has no side effects; the test imports it for the data, the model and the
single-process reference.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch

VOCAB, DIM = 23, 6
N_SAMPLES = 60
MICRO = 4
LR, REFERENCE, DECAY = 0.05, 24.0, 0.9
EPOCHS = 2
STOP_AT = 3  # the interrupted run checkpoints after this many steps of epoch 0


def make_data() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    lengths = torch.randint(1, 9, (N_SAMPLES,), generator=gen)
    return [torch.randint(0, VOCAB, (int(n),), generator=gen) for n in lengths]


def sizes() -> list[int]:
    return [len(x) for x in make_data()]


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Tanh(), torch.nn.Linear(DIM, VOCAB))


def loss_sum(model: torch.nn.Module, items: list[torch.Tensor], normalize: str) -> torch.Tensor:
    """Sum of per-token losses ("tokens"), or of per-sample mean losses ("samples")."""
    total = torch.zeros(())
    for x in items:
        logits = model(x)
        per_token = torch.nn.functional.cross_entropy(logits, (x + 1) % VOCAB, reduction="sum")
        total = total + (per_token if normalize == "tokens" else per_token / len(x))
    return total


def make_run(world: int, rank: int, trace: str, normalize: str, ddp: bool):
    from fitbatch.schedule import BatchSizeSchedule, GradientAccumulator, ScheduledBatchSampler

    net = make_model()
    model = torch.nn.parallel.DistributedDataParallel(net) if ddp else net
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    outer = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: DECAY**s)
    schedule = BatchSizeSchedule.from_csv(trace, on_exhausted="cycle")
    sampler = ScheduledBatchSampler(
        sizes(), schedule, micro_batch_size=MICRO, num_replicas=world, rank=rank, seed=3, rounding="uneven"
    )
    acc = GradientAccumulator(model, opt, lr_rule="linear", reference=REFERENCE, normalize=normalize)
    return net, model, opt, outer, sampler, acc


def train(world, rank, trace, normalize, ddp=True, stop=None, state=None, log=None):
    """Train; with ``stop``, return the checkpoint after that many steps of epoch 0."""
    data = make_data()
    net, model, opt, outer, sampler, acc = make_run(world, rank, trace, normalize, ddp)
    first_epoch = 0
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        outer.load_state_dict(state["outer"])
        sampler.load_state_dict(json.loads(state["sampler"]))
        acc.load_state_dict(json.loads(state["acc"]))
        first_epoch = sampler.epoch
    for epoch in range(first_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for batch, info in sampler.with_info():
            stepped = acc.backward(loss_sum(model, [data[i] for i in batch], normalize), info)
            if log is not None:
                log["micro"].append({"step": info.step, "epoch": epoch, "batch": batch, "n_micro": info.n_micro})
            if not stepped:
                continue
            if log is not None:
                log["steps"].append(
                    {"step": info.step, "lrs": acc.last_lrs, "samples": info.step_samples,
                     "units": info.step_units, "scheduled": info.scheduled}
                )
                if info.step == 0:
                    log["grad0"] = [p.grad.clone() for p in net.parameters()]
            outer.step()
            if stop is not None and epoch == 0 and acc.steps == stop:
                return {
                    "model": {k: v.clone() for k, v in net.state_dict().items()},
                    "optimizer": opt.state_dict(),
                    "outer": outer.state_dict(),
                    "sampler": json.dumps(sampler.state_dict()),
                    "acc": json.dumps(acc.state_dict()),
                }
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def main(rank: int, world: int, init_file: str, out_file: str, trace: str, normalize: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        log: dict = {"micro": [], "steps": []}
        straight = train(world, rank, trace, normalize, log=log)
        checkpoint = train(world, rank, trace, normalize, stop=STOP_AT)
        resumed = train(world, rank, trace, normalize, state=checkpoint)
        torch.save({"log": log, "straight": straight, "resumed": resumed}, out_file)
        dist.barrier()  # no rank tears the group down while another is still in a collective
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6])
