"""Benchmark of fitbatch.pipeline, and of dpipe's batch_iter on the same script when importable.

    python bench/pipeline.py            # full run (about 2 minutes with dpipe, 1 without)
    python bench/pipeline.py --quick    # smoke run: fewer batches, shorter sleeps

Sections:

1. The seed tutorial's timing cells: 10 items x 1 s ``time.sleep`` per item, one batch of 10:
   serial, ``Threads(n_workers=2)`` and ``Processes``/``Loky(n_workers=2)``. Expected: 10 s, 5 s,
   5 s plus the workers' start-up. Close time is reported apart (stages still sleep then).
2. Overlap: a 5 ms per-item transform, batches of 8 and a 20 ms per-batch consumer. Each side
   alone is measured, then both together: ``overlap`` = together / slower side, 1.00 being
   perfect overlap (the target is <= 1.10). One pipeline per row: a warm-up epoch (not timed,
   starts the workers), an epoch pulled as fast as possible, then one with the consumer.
3. Batching cost per item (best of 3): a ``Budget`` (running totals) against the tutorial's
   ``should_add`` predicate, which sums the whole batch for each item.
4. Behaviour (dpipe vs fitbatch), each in a subprocess with a time limit: what the consumer
   gets when a ``Threads`` stage raises, and how long the interpreter takes to exit when a
   pipeline with a sleeping stage was not closed.

dpipe is measured only if ``import dpipe.batch_iter`` works in this interpreter. deep-pipe
pins heavy dependencies, so install it apart, for example::

    python -m venv --system-site-packages /tmp/dpipe-venv
    /tmp/dpipe-venv/bin/pip install deep-pipe -c constraints.txt
    /tmp/dpipe-venv/bin/python bench/pipeline.py
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import platform
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

import fitbatch.pipeline as fb

SLEEP = 1.0  # the tutorial's per-item sleep (scaled down by --quick)


def do_stuff(x: int) -> tuple[int]:
    """The tutorial's stage: sleep, then return a 1-tuple."""
    time.sleep(SLEEP)
    return (x**2,)


def work_5ms(x: int) -> tuple[int]:
    time.sleep(0.005)
    return (x,)


def load_libraries() -> tuple[dict[str, SimpleNamespace], str]:
    libs = {
        "fitbatch": SimpleNamespace(
            Infinite=fb.Infinite, Threads=fb.Threads, Processes=fb.Processes
        )
    }
    try:
        dpipe = importlib.import_module("dpipe.batch_iter")
        version = importlib.import_module("importlib.metadata").version("deep-pipe")
        libs["dpipe"] = SimpleNamespace(
            Infinite=dpipe.Infinite, Threads=dpipe.Threads, Processes=dpipe.Loky
        )
        note = f"deep-pipe {version} imported"
    except Exception as error:  # any import failure is reported, not fatal
        note = f"deep-pipe not measured: `import dpipe.batch_iter` failed here ({type(error).__name__}: {error})"
    return libs, note


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def tutorial_cell(lib: SimpleNamespace, stage: Any) -> tuple[float, float]:
    """(time of the tutorial's cell: build + one epoch, time to close)."""
    start = time.perf_counter()
    batch_iter = lib.Infinite(range(10), stage, batch_size=10, batches_per_epoch=1)
    for _ in batch_iter():
        pass
    cell = time.perf_counter() - start
    return cell, timed(batch_iter.close)


def section_tutorial(libs: dict[str, SimpleNamespace]) -> list[str]:
    rows = [
        "| library | stage | tutorial says | cell time (s) | close (s) |",
        "|---|---|---|---|---|",
    ]
    for name, lib in libs.items():
        for label, make, says in [
            ("plain function", lambda lib: do_stuff, 10 * SLEEP),
            ("Threads(n_workers=2)", lambda lib: lib.Threads(do_stuff, n_workers=2), 5 * SLEEP),
            (
                "Processes / Loky (n_workers=2)",
                lambda lib: lib.Processes(do_stuff, n_workers=2),
                5 * SLEEP,
            ),
        ]:
            cell, close = tutorial_cell(lib, make(lib))
            rows.append(f"| {name} | {label} | {says:.3g} | {cell:.2f} | {close:.2f} |")
            print(rows[-1], flush=True)
    return rows


def consume(batches: Any, per_batch: float) -> int:
    n = 0
    for _ in batches:
        time.sleep(per_batch)
        n += 1
    return n


def overlap_run(
    lib: SimpleNamespace, stage: Any, n_batches: int, consumer: float
) -> tuple[float, float]:
    """(producer alone, producer with consumer): two epochs of one pipeline, after a warm-up."""
    with lib.Infinite(
        itertools.count(), stage, batch_size=8, batches_per_epoch=n_batches
    ) as batch_iter:
        consume(itertools.islice(batch_iter(), 5), 0.0)  # workers started, the pipeline flowing
        alone = timed(lambda: consume(batch_iter(), 0.0))
        # starts with the buffers drained by the fast epoch before: no head start
        together = timed(lambda: consume(batch_iter(), consumer))
    return alone, together


def section_overlap(libs: dict[str, SimpleNamespace], n_batches: int) -> list[str]:
    consumer = 0.020
    consumer_alone = timed(lambda: consume(range(n_batches), consumer))
    rows = [
        f"{n_batches} batches of 8; transform 5 ms per item; consumer 20 ms per batch "
        f"(consumer alone: {consumer_alone:.2f} s)",
        "",
        "| library | stage | producer alone (s) | with consumer (s) | slower side (s) | overlap | ms per batch |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, lib in libs.items():
        for label, make in [
            ("plain function", lambda lib: work_5ms),
            ("Threads(n_workers=2)", lambda lib: lib.Threads(work_5ms, n_workers=2)),
            ("Threads(n_workers=4)", lambda lib: lib.Threads(work_5ms, n_workers=4)),
            ("Processes / Loky (n_workers=2)", lambda lib: lib.Processes(work_5ms, n_workers=2)),
            ("Processes / Loky (n_workers=4)", lambda lib: lib.Processes(work_5ms, n_workers=4)),
        ]:
            alone, together = overlap_run(lib, make(lib), n_batches, consumer)
            slower = max(alone, consumer_alone)
            rows.append(
                f"| {name} | {label} | {alone:.2f} | {together:.2f} | {slower:.2f} | "
                f"{together / slower:.2f} | {1000 * together / n_batches:.1f} |"
            )
            print(rows[-1], flush=True)
    return rows


def predicate_batches(items: list[int], should_add: Callable[[list[int], int], bool]) -> int:
    """dpipe's stacker loop (also fitbatch's for predicates): the number of finished batches."""
    chunk: list[int] = []
    n_batches = 0
    for item in items:
        if not chunk or should_add(chunk, item):
            chunk.append(item)
        else:
            n_batches += 1
            chunk = [item]
    return n_batches


def budget_batches(items: list[int], rule: fb.Budget) -> int:
    state = rule.start()
    return sum(len(state.push(item)) for item in items)


def section_batching(n_items: int) -> list[str]:
    rng = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(0,)))
    sizes = rng.integers(1, 8, size=n_items).tolist()
    rows = [
        "| rule | batch budget (size units) | items per batch | µs per item |",
        "|---|---|---|---|",
    ]
    for budget in (64, 512, 4096, 32768):

        def should_add(batch: list[int], item: int, budget: int = budget) -> bool:
            return sum(batch) + item <= budget  # the tutorial's shape: re-scans the batch

        rule = fb.Budget(budget, size=float)
        for label, run in (
            ("should_add predicate", lambda: predicate_batches(sizes, should_add)),
            ("Budget (running totals)", lambda rule=rule: budget_batches(sizes, rule)),
        ):
            times = []
            for _ in range(3):  # best of 3: the machine may be shared
                start = time.perf_counter()
                n_batches = run()
                times.append(time.perf_counter() - start)
            per_item = min(times) / n_items * 1e6
            rows.append(
                f"| {label} | {budget} | {n_items / max(n_batches, 1):.0f} | {per_item:.2f} |"
            )
            print(rows[-1], flush=True)
    return rows


BEHAVIOUR = {
    "error": """
        import time
        from {module} import Infinite, Threads
        def boom(x):
            if x == 3:
                raise KeyError("boom")
            return (x,)
        with Infinite(range(10), Threads(boom, n_workers=2), batch_size=2, batches_per_epoch=5) as b:
            try:
                list(b())
                print("no error")
            except BaseException as e:
                print(type(e).__module__ + "." + type(e).__qualname__)
    """,
    "exit": """
        import time
        from {module} import Infinite
        def slow(x):
            time.sleep(0.5 if x < 2 else 30)
            return (x,)
        b = Infinite(range(100), slow, batch_size=2, batches_per_epoch=1)
        next(iter(b()))
        print(time.time())
    """,
}


def run_behaviour(module: str, kind: str, limit: float = 20.0) -> str:
    code = textwrap.dedent(BEHAVIOUR[kind]).format(module=module)
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=limit
        )
    except subprocess.TimeoutExpired:
        return f"hung (killed after {limit:.0f} s)"
    end = time.time()
    lines = out.stdout.strip().splitlines()
    if not lines:
        return f"no output, exit code {out.returncode}"
    if kind == "exit":
        return f"exited {end - float(lines[-1]):.2f} s after the last line (code {out.returncode})"
    return f"`{lines[-1]}`"


def section_behaviour(libs: dict[str, SimpleNamespace]) -> list[str]:
    rows = [
        "| library | KeyError('boom') in a Threads stage: consumer gets | not closed, stage sleeping 30 s: interpreter |",
        "|---|---|---|",
    ]
    modules = {"fitbatch": "fitbatch.pipeline", "dpipe": "dpipe.batch_iter"}
    for name in libs:
        rows.append(
            f"| {name} | {run_behaviour(modules[name], 'error')} | {run_behaviour(modules[name], 'exit')} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    global SLEEP
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="short sleeps and few batches (smoke run)"
    )
    parser.add_argument("--skip-dpipe", action="store_true", help="measure fitbatch only")
    args = parser.parse_args()
    if args.quick:
        SLEEP = 0.1
    libs, note = load_libraries()
    if args.skip_dpipe:
        libs.pop("dpipe", None)
        note += " (skipped: --skip-dpipe)"
    header = (
        f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
        f"{platform.platform()}; {note}"
    )
    print(header, flush=True)
    # One-time costs (loky's imports and resource tracker) are paid here, not by the first row.
    with fb.Infinite(range(2), fb.Processes(abs), batch_size=2, batches_per_epoch=1) as warm_up:
        list(warm_up())
    sections = [
        ("Tutorial cells (10 items, sleep per item, one batch of 10)", section_tutorial(libs)),
        (
            "Overlap of preparation and consumption",
            section_overlap(libs, 20 if args.quick else 100),
        ),
        ("Batching cost per item (fitbatch)", section_batching(20_000 if args.quick else 100_000)),
        ("Behaviour", section_behaviour(libs)),
    ]
    print("\n" + header + "\n")
    for title, rows in sections:
        print(f"### {title}\n")
        print("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
