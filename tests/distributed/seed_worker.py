"""One rank that builds samplers with ``seed=None`` under gloo; started by tests/test_distributed.py.

    python seed_worker.py --init file:///tmp/x/store --world 2 --rank 0 --out /tmp/x

Each rank writes ``seed-rank{r}.json``: the seed its samplers took and the batches each yields.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--init", required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    import torch.distributed as dist

    import fitbatch

    dist.init_process_group("gloo", init_method=args.init, world_size=args.world, rank=args.rank,
                            timeout=timedelta(seconds=60))
    sizes = np.random.default_rng(0).integers(1, 500, 400)
    out = {}
    for name, make in (
        ("budget", lambda: fitbatch.BudgetBatchSampler(sizes, 2048, seed=None)),
        ("windowed", lambda: fitbatch.BudgetBatchSampler(sizes, 2048, window=100, seed=None)),
        ("scheduled", lambda: fitbatch.schedule.ScheduledBatchSampler(sizes, 36, micro_batch_size=4, seed=None)),
    ):
        sampler = make()
        seed = sampler.seed if hasattr(sampler, "seed") else sampler.options.seed
        out[name] = {"seed": int(seed), "batches": [[int(i) for i in b] for b in sampler]}
    (args.out / f"seed-rank{args.rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
