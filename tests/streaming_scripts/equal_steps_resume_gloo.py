"""One rank of a 2-process gloo run that resumes ``equal_steps`` (issue "Nothing lost, nothing hangs").

Usage: python equal_steps_resume_gloo.py MODE RANK WORLD INIT_FILE OUT_JSON

Rank r streams ``900 - 100 * r`` items (sizes ``1 + (i * 7919) % 50``, budget 200, padded cost),
so the ranks' shards end at different steps. Every training step runs a checking collective
(``check``): all ranks must be at the same step, else the run fails instead of hanging on.

MODE ``defect``: save at step 190 (one step into the last, 3-batch window of ``sync_every=7``),
restore a fresh run on every rank and finish it (the defect: rank 0 restored a 7-batch window).
MODE ``every``: for ``sync_every=7`` and then ``steps=150``, one uninterrupted run saves its state
(JSON) at every step boundary, then a fresh run is restored from each state and finished; the
checking collective runs at the end of each restored run only (the steps between are checked
by the test, which compares each rank's batches with the uninterrupted run's).
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any

import torch
import torch.distributed as dist

import fitbatch.streaming as fs

STEP, END = 0, 1  # tags of the checking collective


class Shard:
    """A replayable shard: iterating it again yields the same items (like a fixed shard list)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.n))


def check(tag: int, value: int) -> None:
    """Every rank must call this with the same (tag, value), else raise (a hang would be a bug)."""
    t = torch.tensor([tag, value, -tag, -value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if t[0] != -t[2] or t[1] != -t[3]:
        raise RuntimeError(f"ranks out of step: local (tag {tag}, value {value}); max/min {t.tolist()}")


def make(n: int, **kw: Any) -> fs.EqualSteps:
    stream = fs.batch_stream(Shard(n), sizeof=lambda i: 1 + (i * 7919) % 50, budget=200)
    return fs.equal_steps(stream, **kw)


def finish(run: fs.EqualSteps, start: int, every_step: bool = True) -> list[list[int]]:
    out = []
    for step, batch in enumerate(run, start):
        if every_step:
            check(STEP, step)
        out.append(list(batch))
    check(END, start + len(out))
    return out


def every_boundary(n: int, **kw: Any) -> dict[str, Any]:
    """Save at every step boundary of one run, restore a fresh run from each state and finish it."""
    run = make(n, **kw)
    states = [json.dumps(run.state_dict())]
    full = []
    for batch in run:
        full.append(list(batch))
        states.append(json.dumps(run.state_dict()))
    check(END, len(full))
    tails, summaries = [], []
    for step, saved in enumerate(states):
        again = make(n, **kw)
        again.load_state_dict(json.loads(saved))
        tails.append(finish(again, step, every_step=False))
        summaries.append(again.summary.__dict__)
    return {"full": full, "summary": run.summary.__dict__, "tails": tails, "summaries": summaries}


def main() -> None:
    mode, rank, world, init_file, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=30),  # a collective left waiting raises instead of hanging
    )
    n = 900 - 100 * rank
    result: dict[str, Any] = {"rank": rank}
    if mode == "defect":
        first = make(n, sync_every=7)
        head = [list(next(first)) for _ in range(190)]
        state = json.loads(json.dumps(first.state_dict()))
        again = make(n, sync_every=7)
        again.load_state_dict(state)
        result["head"], result["tail"] = head, finish(again, 190)
        result["summary"] = again.summary.__dict__
        result["full"] = finish(make(n, sync_every=7), 0)
    else:
        result["sync_every"] = every_boundary(n, sync_every=7)
        result["steps"] = every_boundary(n, steps=150)
    with open(out, "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
