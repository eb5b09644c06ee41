"""One rank of the gloo test of the collective census of BudgetBatchSampler(window=...) (run by tests/test_windowed.py).

Usage: python census_worker.py RANK WORLD INIT_FILE OUT_FILE

Joins a gloo group, builds the rank's sampler over the real function lengths (``census="collective"``:
each rank counts its share of the windows, one ``all_reduce`` sums them), and writes ``len()``
before iterating, the batches it yields, and the census's own batch counts as JSON.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch.distributed as dist

from fitbatch import BudgetBatchSampler

DATA = Path(__file__).resolve().parents[1] / "data" / "cpython_stdlib_functions.npy"
KW = {"window": 2048, "block": 256, "strategy": "pooled", "seed": 3}


def sizes() -> np.ndarray:
    return np.load(DATA)[:20000]


def main() -> None:
    rank, world, init_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        sampler = BudgetBatchSampler(sizes(), 8192, **KW)  # world and rank from torch.distributed
        n = len(sampler)
        counts = next(iter(sampler._counts.values()))
        batches = list(sampler)
        Path(out).write_text(json.dumps({"len": n, "batches": batches, "counts": {str(k): v for k, v in counts.items()}}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
