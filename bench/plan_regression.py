"""Plan time and batches of every strategy at 1M samples, for comparing two checkouts.

Best of 3 (plan + the order/offsets arrays), 1,000,000 sizes resampled with a fixed seed from a
shared length set, budget 16384, oversized samples skipped. Prints one JSON line; run it once per
checkout with that checkout's ``src`` first on ``PYTHONPATH``:

    PYTHONPATH=/path/to/old/src python bench/plan_regression.py cpython_stdlib_functions
    PYTHONPATH=src python bench/plan_regression.py cpython_stdlib_functions
"""
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

import fitbatch

logging.disable(logging.WARNING)  # the skipped-samples warning, once per run
name = sys.argv[1]
base = np.load(Path(__file__).resolve().parents[2] / "shared" / "data" / f"{name}.npy")
sizes = np.random.default_rng(0).choice(base, 1_000_000)
out = {}
for strategy, cost in [("sequential", "padded"), ("sorted", "padded"), ("pooled", "padded"), ("buckets", "padded"), ("packed", "padded"), ("packed", "sum")]:
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        plan = fitbatch.plan_batches(sizes, 16384, cost=cost, strategy=strategy, seed=0, oversized="skip")
        _ = plan.order, plan.offsets
        best = min(best, time.perf_counter() - t0)
    out[f"{strategy}/{cost}"] = (best, len(plan), round(plan.stats().padding_efficiency, 4))
print(json.dumps(out))
