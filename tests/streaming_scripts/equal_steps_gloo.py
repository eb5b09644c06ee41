"""One rank of a 2-process gloo run of ``equal_steps`` over shards of different lengths.

Usage: python equal_steps_gloo.py RANK WORLD INIT_FILE OUT_JSON
Rank r streams 1000 + 400 * r items; with sync_every=3 every rank must stop at the same step.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

import fitbatch.streaming as fs


def main() -> None:
    rank, world, init_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    n = 1000 + 400 * rank
    items = range(rank * 100_000, rank * 100_000 + n)
    stream = fs.batch_stream(items, sizeof=lambda x: 1 + x % 37, budget=200, cost="padded")
    run = fs.equal_steps(stream, sync_every=3)
    seen = [list(b) for b in run]
    s = run.summary
    with open(out, "w") as f:
        json.dump({
            "rank": rank, "steps": s.steps, "batches": len(seen), "items": sum(map(len, seen)),
            "n": n, "dropped_batches": s.dropped_batches, "dropped_items": s.dropped_items,
            "exhausted": s.exhausted, "collectives": s.collectives, "unique": len({i for b in seen for i in b}),
        }, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
