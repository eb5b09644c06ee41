"""Train a small model following a batch-size trace (the PyTorch-XLA emulator's trace.csv), on CPU.

    python examples/variable_batch_size.py                        # one process
    torchrun --nproc-per-node 3 examples/variable_batch_size.py   # 3 gloo ranks, same steps

Every step s consumes exactly the trace's global batch size (``step,batchsize`` rows) over all
ranks, as equal numbers of micro-batches per rank; gradients are accumulated and normalised by
the step's real tokens, and the learning rate follows the linear rule ``lr x size / 256`` for
that step only, on top of a cosine schedule. The run checkpoints mid-epoch and resumes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from fitbatch import pad_collate
from fitbatch.schedule import BatchSizeSchedule, GradientAccumulator, ScheduledBatchSampler

VOCAB, DIM = 64, 32


def make_dataset(n: int) -> list[torch.Tensor]:
    """Token sequences of 4..64 tokens; the task is predicting (token + 1) mod VOCAB."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 65, (n,), generator=gen)
    return [torch.randint(0, VOCAB, (int(k),), generator=gen) for k in lengths]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(Path(__file__).with_name("trace.csv")))
    parser.add_argument("--samples", type=int, default=1200)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    args = parser.parse_args()

    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(0)
    dataset = make_dataset(args.samples)
    sizes = [len(x) for x in dataset]  # real tokens: the loss normaliser and the LR rule's unit
    net = torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Tanh(), torch.nn.Linear(DIM, VOCAB))
    model = torch.nn.parallel.DistributedDataParallel(net) if dist.is_initialized() else net
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)

    schedule = BatchSizeSchedule.from_csv(args.trace, on_exhausted="hold_last")
    # 100 (the trace's last size) is not a multiple of 16 x ranks: "uneven" keeps it exact
    sampler = ScheduledBatchSampler(
        sizes, schedule, micro_batch_size=args.micro_batch_size, rounding="uneven", seed=0
    )
    total_steps = sum(sampler.num_steps(e) for e in range(args.epochs))
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    # the seed's LinearRuleOptimizer(optimizer, ref_batchsize=256), as one line:
    acc = GradientAccumulator(model, optimizer, lr_rule="linear", reference=256, normalize="samples")
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate)

    checkpoint = None
    epoch = 0
    while epoch < args.epochs:
        sampler.set_epoch(epoch)
        infos = sampler.infos()  # before iterating: the iteration takes the resume cursor
        done = 0
        for (tokens, lengths, mask), info in zip(loader, infos, strict=True):
            logits = model(tokens)
            per_token = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), (tokens + 1) % VOCAB, reduction="none"
            )
            # normalize="samples": pass the SUM over samples of each sample's mean token loss
            loss_sum = ((per_token * mask).sum(dim=1) / lengths).sum()
            done += 1
            if not acc.backward(loss_sum, info):
                continue
            cosine.step()
            if rank == 0 and info.step % 4 == 0:
                print(
                    f"epoch {epoch} step {info.step:3d}: {info.step_samples:4d} samples "
                    f"({info.n_micro} x {info.world} micro-batches), lr {acc.last_lrs[0]:.4f}, "
                    f"loss {loss_sum.item() / max(info.samples, 1):.3f}"
                )
            if checkpoint is None and epoch == 1 and done > len(infos) // 2:
                checkpoint = json.dumps({"sampler": sampler.state_dict(micro=done), "acc": acc.state_dict()})
                if rank == 0:
                    print(f"checkpoint after step {info.step}; resuming from it")
                state = json.loads(checkpoint)
                sampler.load_state_dict(state["sampler"])  # a fresh run would rebuild and load these
                acc.load_state_dict(state["acc"])
                break
        else:
            epoch += 1
    if rank == 0:
        print(f"done: {acc.steps} optimizer steps over {args.epochs} epochs")
    if dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another is still in a collective
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
