"""Record a hash of every rank's batches (and len, step totals, state) for many sampler configurations.

Usage: PYTHONPATH=<src> python bench/_sampler_hashes.py OUT.json  (run on two versions and compare).
Layout-agnostic: imports only ``fitbatch.BudgetBatchSampler`` (and ``fitbatch.SizeIndex``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import warnings

import numpy as np

warnings.simplefilter("ignore")
import logging  # noqa: E402

logging.disable(logging.CRITICAL)
import fitbatch  # noqa: E402

B = fitbatch.BudgetBatchSampler


def sizes_of(kind: str, n: int, seed: int):
    rng = np.random.default_rng(seed)
    if kind == "lengths":
        return rng.integers(1, 60, n).tolist()
    if kind == "heavy":
        return np.minimum(rng.pareto(1.3, n) * 8 + 1, 400).astype(int).tolist()
    if kind == "limits":
        return {"tokens": rng.integers(1, 60, n).tolist(), "images": rng.integers(0, 4, n).tolist()}
    raise ValueError(kind)


def run(make, world, mode):
    out = []
    samplers = [make(r) for r in range(world)]
    for epoch in (0, 1):
        for s in samplers:
            s.set_epoch(epoch)
        if mode == "budget":
            its = [iter(s) for s in samplers]
            got = [[next(it) for _ in range(2)] for it in its]
            for s in samplers:
                s.set_budget(s.budget * 0.7)
            got = [g + list(it) for g, it in zip(got, its)]
            out.append(got)
            out.append([s.state_dict() for s in samplers])
        elif mode == "resume":
            state = samplers[0].state_dict(step=min(2, len(samplers[0])))
            other = world + 1 if world < 3 else 1
            res = [make(r, other) for r in range(other)]
            for s in res:
                s.load_state_dict(state)
            out.append([list(s) for s in res])
            out.append([len(s) for s in res])
        else:
            out.append([list(s) for s in samplers])
        out.append([len(s) for s in samplers])
        t = samplers[0].step_totals()
        out.append([np.asarray(x).tolist() for x in t])
    return out


def configs():
    strategies = ["sequential", "sorted", "pooled", "buckets", "packed"]
    costs = ["padded", "sum", "polynomial"]
    for strat, cost, world, kind in itertools.product(strategies, costs, (1, 2, 3), ("lengths", "heavy")):
        yield dict(kind=kind, n=150, strategy=strat, cost=cost, world=world, budget=240, mode="plain")
    for strat, world in itertools.product(strategies, (1, 2, 4)):
        base = dict(kind="lengths", n=120, strategy=strat, cost="padded", world=world, budget=200)
        yield {**base, "mode": "budget"}
        yield {**base, "mode": "resume"}
        yield {**base, "mode": "plain", "loss": True}
        yield {**base, "mode": "budget", "loss": True}
        yield {**base, "mode": "plain", "drop_last": True}
        yield {**base, "mode": "plain", "max_shapes": 3}
        yield {**base, "mode": "plain", "policy": "drop"}
        yield {**base, "mode": "resume", "policy": "drop"}
        yield {**base, "mode": "plain", "shuffle": False}
        yield {**base, "mode": "plain", "seed": 7}
        yield {**base, "mode": "plain", "max_batch_size": 5, "batch_size_multiple": 2}
        for ov in ("single", "skip"):
            yield {**base, "kind": "heavy", "budget": 150, "cost": "sum", "mode": "plain", "oversized": ov}
            yield {**base, "kind": "heavy", "budget": 150, "cost": "sum", "mode": "budget", "oversized": ov}
        if world > 1:
            yield {**base, "mode": "plain", "per_rank": True}
            yield {**base, "mode": "budget", "per_rank": True}
        yield {**base, "kind": "limits", "budget": {"tokens": 200, "images": 6}, "cost": {"images": "sum"}, "mode": "plain"}
        yield {**base, "kind": "limits", "budget": {"tokens": 200, "images": 6}, "cost": {"images": "sum"}, "mode": "resume"}
    for strat, world, window in itertools.product(strategies, (1, 2, 3), (16, 40)):
        base = dict(kind="lengths", n=130, strategy=strat, cost="sum", world=world, budget=150, window=window, block=4)
        yield {**base, "mode": "plain"}
        yield {**base, "mode": "budget"}
        yield {**base, "mode": "resume"}
        yield {**base, "mode": "plain", "policy": "drop"}


def make_for(c):
    sizes = sizes_of(c["kind"], c["n"], 3)
    rng = np.random.default_rng(5)
    opts = {k: c[k] for k in ("drop_last", "max_shapes", "shuffle", "seed", "max_batch_size", "batch_size_multiple", "oversized", "policy") if k in c}
    if c.get("loss"):
        opts["loss_sizes"] = [int(rng.integers(0, s + 1)) for s in sizes]
    if "window" in c:
        opts["window"], opts["block"] = c["window"], c["block"]

    def make(rank, world=None):
        world = c["world"] if world is None else world
        budget = c["budget"]
        if c.get("per_rank"):
            budget = [budget * (1 + 0.5 * r) for r in range(world)]
        return B(sizes, budget, cost=c["cost"], strategy=c["strategy"], num_replicas=world, rank=rank, **opts)

    return make


def main() -> None:
    results = {}
    for c in configs():
        key = json.dumps(c, sort_keys=True)
        try:
            out = run(make_for(c), c["world"], c["mode"])
            results[key] = hashlib.sha256(json.dumps(out, default=str).encode()).hexdigest()[:16]
        except Exception as e:  # noqa: BLE001
            results[key] = f"{type(e).__name__}: {str(e)[:120]}"
    json.dump(results, open(sys.argv[1], "w"), indent=0, sort_keys=True)
    print(len(results), "configs;", sum(not v[:1].isalnum() or ":" in v for v in results.values()), "errors")


if __name__ == "__main__":
    main()
