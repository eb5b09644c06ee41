"""One rank of fitbatch.steps.partition_local under gloo; started by tests/test_steps_collective.py.

    python steps_worker.py --init file:///tmp/x/store --world 3 --rank 0 --out /tmp/x --case uneven

Each rank builds its own sizes for the case (seeded by the rank), splits them with one
all-reduce, and writes ``steps-<case>-rank<r>.json``: its sizes, micro-batches and the totals.
"""

from __future__ import annotations

import json

import numpy as np
from _gloo import join_group, worker_args

CASES = ("uneven", "multiple", "oversized", "refused")


def local_sizes(case: str, rank: int) -> np.ndarray:
    """Very different loads: 600 rollouts, 40, and a single one (and nothing on a 4th rank)."""
    rng = np.random.default_rng(rank)
    n = (600, 40, 1, 0)[rank]
    sizes = rng.integers(50, 4000, n)
    if case == "oversized" and rank == 1:
        sizes[3] = 20_000
    if case == "refused" and rank == 2:
        sizes[0] = 20_000
    return sizes


def main() -> None:
    args = worker_args(case={"choices": CASES})

    import torch.distributed as dist

    from fitbatch.steps import partition_local

    join_group(args)
    sizes = local_sizes(args.case, args.rank)
    kw: dict = {"weights": lambda L: 24576 * L + L**2}
    if args.case == "multiple":
        kw.update(micro_multiple=4, min_micro=5)
    if args.case == "oversized":
        kw.update(oversized="single")
    record: dict = {"sizes": sizes.tolist()}
    try:
        part = partition_local(sizes, 8192, loss_sizes=sizes // 2, **kw)
    except (ValueError, RuntimeError) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    else:
        record.update(
            n_micro=part.n_micro,
            ranks=list(part.ranks),
            world=part.world,
            batches=[b.tolist() for b in part[args.rank]],
            step_samples=part.step_samples.tolist(),
            step_tokens=part.step_tokens.tolist(),
            step_loss_tokens=part.step_loss_tokens.tolist(),
            workload=part.workload.tolist(),
            efficiency=part.efficiency,
            efficiency_bound=part.efficiency_bound,
            lower_bound=part.lower_bound,
            n_empty=part.n_empty,
            n_oversized=part.n_oversized,
        )
    (args.out / f"steps-{args.case}-rank{args.rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
