"""One process of a real ``accelerate`` run (gloo, CPU); started by tests/test_integrations.py.

    torchrun --standalone --nproc-per-node 2 accelerate_worker.py --out /tmp/x --phase naive

``Accelerator(cpu=True)`` initialises gloo from torchrun's env:// variables. The data are the
first 3,000 real function lengths of ``tests/data``; sample ``i`` is ``lengths[i]`` tokens
worth ``i + 1`` (so a padded batch's first column names its samples). Phases:

* ``naive``: the issue's code, ``accelerator.prepare(DataLoader(ds, batch_sampler=sampler,
  collate_fn=fitbatch.pad_collate))``: two epochs, the sampler's own plan beside them, and
  ``accelerator.skip_first_batches(loader, 5)`` of the second.
* ``full``: first, a sampler over halved sizes, whose first collated batch ``prepare``'s budget
  check refuses; then ``fitbatch.integrations.accelerate.prepare`` (2 DataLoader workers) and a small
  DDP model, two epochs, normalised by ``step_totals``; ``save_state`` after step
  ``--stop-step`` of epoch 1, then on to the end.
* ``resume``: the same objects, ``load_state`` of that checkpoint, on to the end (any world).
* ``compat``: a sampler without state or world, bionemo's ``SizeAwareBatchSampler`` over a
  ``DistributedSampler``: the plain ``accelerator.prepare`` error, then
  ``fitbatch.integrations.accelerate.prepare_loader`` for two epochs, beside the batches the
  same sampler yields without accelerate.

``--window N`` plans the epochs in windows of N samples (``BudgetBatchSampler(window=N)``).
``--accum K`` accumulates gradients over K batches (``Accelerator(gradient_accumulation_steps=K)``,
``with acc.accumulate(model)``); each process also logs accelerate's step counter and whether it
synchronised gradients at each batch.

Each process writes ``{phase}-w{world}-rank{r}.json``: its batches (``[epoch, step, ids]``), what it
checked, and its final parameters.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

LENGTHS = Path(__file__).resolve().parents[1] / "data" / "cpython_stdlib_functions.npy"
N, BUDGET, VOCAB, EPOCHS = 3000, 4096, 16, 2


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--phase", choices=("naive", "full", "resume", "compat"), required=True)
    p.add_argument("--stop-step", type=int, default=7)
    p.add_argument("--window", type=int, default=0, help="plan in windows of this many samples (0: one plan)")
    p.add_argument("--accum", type=int, default=1, help="gradient_accumulation_steps")
    args = p.parse_args()

    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, Dataset

    import fitbatch
    from fitbatch.integrations import accelerate as fb_accelerate

    torch.set_num_threads(1)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=args.accum)
    lengths = np.load(LENGTHS)[:N]

    class Samples(Dataset):
        def __len__(self) -> int:
            return N

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.full((int(lengths[i]),), i + 1)

    def ids(batch) -> list[int]:
        return (batch.values[:, 0] - 1).tolist()

    if args.phase == "compat":
        compat(acc, Samples(), lengths, ids, args.out)
        return
    # built after Accelerator(): it reads the world from torch.distributed
    sampler = fitbatch.BudgetBatchSampler(lengths, BUDGET, cost="padded", seed=0, window=args.window or "auto")
    out: dict = {"rank": acc.process_index, "world": acc.num_processes,
                 "sampler_world": [sampler.num_replicas, sampler.rank], "kind": type(sampler).__name__, "window": sampler.window}
    if args.phase == "naive":
        loader = acc.prepare(DataLoader(Samples(), batch_sampler=sampler, collate_fn=fitbatch.pad_collate))
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)  # accelerate's loader does not reach a batch sampler
            out[f"len{epoch}"] = len(loader)
            out[f"batches{epoch}"] = [ids(b) for b in loader]
            out[f"plan{epoch}"] = sampler.plan().to_lists()
            out[f"step_samples{epoch}"] = sampler.step_totals()[0].tolist()
        out["skip5"] = [ids(b) for b in acc.skip_first_batches(loader, 5)]
    else:
        if args.phase == "full":  # sizes that are not these rows' (halved): caught at the first collated batch
            wrong = fitbatch.BudgetBatchSampler(lengths // 2 + 1, BUDGET, cost="padded", seed=0, window=args.window or "auto")
            unchecked = DataLoader(Samples(), batch_sampler=wrong, collate_fn=fitbatch.pad_collate)
            try:
                next(iter(fb_accelerate.prepare(acc, unchecked, register=False)))
                out["mismatch"] = None
            except ValueError as exc:
                out["mismatch"] = str(exc)
        loader = fb_accelerate.prepare(
            acc, DataLoader(Samples(), batch_sampler=sampler, collate_fn=fitbatch.pad_collate, num_workers=2)
        )
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Embedding(VOCAB + 1, 8), torch.nn.Linear(8, VOCAB + 1)).double()
        model, optimizer = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05))
        if args.phase == "resume":
            acc.load_state(str(args.out / "ckpt"))
            out["resumed_at"] = [loader.epoch, loader.step]
            out["acc_step"] = acc.step
        log = []
        for epoch in range(loader.epoch, EPOCHS):
            loader.set_epoch(epoch)
            samples, units, _ = loader.step_totals()
            targets = units - samples  # next-token targets of each step, all ranks
            for batch in loader:
                k = loader.step - 1
                with acc.accumulate(model):
                    x = batch.values % (VOCAB + 1)
                    token_loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:], reduction="none")
                    loss_sum = (token_loss * batch.mask[:, 1:]).sum()
                    acc.backward(loss_sum * acc.num_processes / float(targets[k]))  # DDP averages over ranks
                    optimizer.step()
                    optimizer.zero_grad()
                log.append([epoch, k, ids(batch), acc.step, acc.sync_gradients])
                if args.phase == "full" and epoch == 1 and loader.step == args.stop_step:
                    acc.save_state(str(args.out / "ckpt"))
        out["log"] = log
        out["end"] = [loader.epoch, loader.step]
        out["params"] = torch.cat([q.detach().flatten() for q in net.parameters()]).tolist()
    (args.out / f"{args.phase}-w{acc.num_processes}-rank{acc.process_index}.json").write_text(json.dumps(out))
    acc.wait_for_everyone()
    acc.end_training()


def compat(acc, ds, lengths, ids, out_dir: Path) -> None:
    """The ``compat`` phase: each process batches its own share of the samples."""
    from torch.utils.data import DataLoader, DistributedSampler

    import fitbatch
    from fitbatch.compat.bionemo import SizeAwareBatchSampler
    from fitbatch.integrations import accelerate as fb_accelerate

    def sampler(epoch: int = 0):
        share = DistributedSampler(ds, num_replicas=acc.num_processes, rank=acc.process_index, seed=0)
        share.set_epoch(epoch)
        return share, SizeAwareBatchSampler(share, lambda i: int(lengths[i]), BUDGET)

    out: dict = {"rank": acc.process_index, "world": acc.num_processes}
    plain = acc.prepare(DataLoader(ds, batch_sampler=sampler()[1], collate_fn=fitbatch.pad_collate))
    try:
        next(iter(plain))
        out["plain_error"] = None
    except ValueError as exc:
        out["plain_error"] = str(exc)
    share, batches = sampler()
    loader = fb_accelerate.prepare_loader(acc, DataLoader(ds, batch_sampler=batches, collate_fn=fitbatch.pad_collate))
    for epoch in range(EPOCHS):
        share.set_epoch(epoch)
        out[f"len{epoch}"] = len(loader)
        out[f"batches{epoch}"] = [ids(b) for b in loader]
        out[f"own{epoch}"] = [[int(i) for i in b] for b in sampler(epoch)[1]]  # without accelerate
    (out_dir / f"compat-w{acc.num_processes}-rank{acc.process_index}.json").write_text(json.dumps(out))
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
