"""One rank calling fitbatch.integrations.verl.rearrange_micro_batches under gloo, as verl's own
distributed test does; started by tests/test_steps_verl.py.

    python verl_worker.py --init file:///tmp/x/store --world 2 --rank 0 --out /tmp/x --same 1 --min-mb 0

Each rank builds a different batch (20 + 5 * rank rows of 100 tokens, random masks seeded by the
rank) and writes ``verl-rank<r>.json``: its effective lengths, the micro-batch indices and whether
the micro-batches put back in order give the batch back.
"""

from __future__ import annotations

import json

from _gloo import join_group, worker_args


def random_mask(rows: int, width: int, seed: int):
    """Left padding up to 10 % of the width, then 50-90 % valid tokens, then right padding."""
    import torch

    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, width, dtype=torch.int64)
    for i in range(rows):
        left = int(torch.randint(0, width // 10 + 1, (1,), generator=g))
        valid = int(torch.randint(width // 2, int(width * 0.9) + 1, (1,), generator=g))
        mask[i, left : min(width, left + valid)] = 1
    return mask


def main() -> None:
    args = worker_args(same={"type": int}, min_mb={"type": int})

    import torch
    import torch.distributed as dist

    from fitbatch.integrations.verl import rearrange_micro_batches

    join_group(args)
    rows = 20 + 5 * args.rank
    mask = random_mask(rows, 100, 42 + args.rank)
    batch = {"input_ids": torch.randint(0, 10, (rows, 100), generator=torch.Generator().manual_seed(args.rank)),
             "attention_mask": mask}
    micros, idx = rearrange_micro_batches(batch, max_token_len=300, dp_group=dist.group.WORLD,
                                          same_micro_num_in_dp=bool(args.same),
                                          min_num_micro_batch=args.min_mb or None)
    flat = [i for part in idx for i in part]
    inverse = torch.empty(len(flat), dtype=torch.long)
    inverse[torch.tensor(flat)] = torch.arange(len(flat))
    restored = torch.cat([m["input_ids"] for m in micros])[inverse]
    record = {
        "lengths": mask.sum(dim=1).tolist(),
        "idx": idx,
        "restored": bool(torch.equal(restored, batch["input_ids"])),
        "tokens": [int(m["attention_mask"].sum()) for m in micros],
    }
    (args.out / f"verl-rank{args.rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
