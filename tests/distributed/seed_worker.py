"""One rank that builds samplers with ``seed=None`` under gloo; started by tests/test_distributed.py.

    python seed_worker.py --init file:///tmp/x/store --world 2 --rank 0 --out /tmp/x

Each rank writes ``seed-rank{r}.json``: the seed its samplers took and the batches each yields.
"""

from __future__ import annotations

import json

import numpy as np
from _gloo import join_group, worker_args


def main() -> None:
    args = worker_args()

    import torch.distributed as dist

    import fitbatch

    join_group(args)
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
