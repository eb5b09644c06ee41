"""Tests of fitbatch.pipeline: exact batches, real threads and processes, no timing asserts.

Bounds such as "close() returns within 5 s" are hang detectors (a join or wait timeout), never
performance checks; the benchmark measures speed.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_scripts import workers

import fitbatch.pipeline as pipeline
from fitbatch.costs import PaddedCost, PaddedPolynomial, SumCost, resolve_cost
from fitbatch.pipeline import (
    Budget,
    Infinite,
    Loky,
    Processes,
    Threads,
    apply_at,
    combine_batches,
    combine_pad,
    combine_to_arrays,
    combine_to_tensors,
    sample,
    unpack_args,
)

SCRIPTS = Path(__file__).parent / "pipeline_scripts"
HANG = 5.0  # seconds after which a wait counts as a hang


def _pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fitbatch-pipeline")]


@pytest.fixture(autouse=True)
def no_leftover_threads() -> Any:
    """Every test closes what it opens: no pipeline thread survives it."""
    yield
    deadline = time.monotonic() + HANG
    while _pipeline_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _pipeline_threads() == []


def notes(error: BaseException) -> list[str]:
    return list(getattr(error, "__notes__", []))


def epochs(batches: Infinite, n: int) -> list[list[Any]]:
    return [list(batches()) for _ in range(n)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_all_dead(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + HANG
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


# --- batching ------------------------------------------------------------------------------


def test_fixed_size_cycles_a_finite_iterable_across_epochs() -> None:
    with Infinite(range(7), batch_size=3, batches_per_epoch=2, combiner=list) as batches:
        assert epochs(batches, 3) == [
            [[0, 1, 2], [3, 4, 5]],
            [[6, 0, 1], [2, 3, 4]],
            [[5, 6, 0], [1, 2, 3]],
        ]
        assert batches.epoch == 3 and len(batches) == 2


def test_default_combiner_stacks_components() -> None:
    items = [(np.full((2,), i), i) for i in range(4)]
    with Infinite(items, batch_size=2, batches_per_epoch=2) as batches:
        (x0, y0), (x1, y1) = batches()
    np.testing.assert_array_equal(x0, [[0, 0], [1, 1]])
    np.testing.assert_array_equal(y1, [2, 3])
    assert x1.shape == (2, 2) and y0.tolist() == [0, 1]


def test_transforms_apply_in_order() -> None:
    def add_tag(pair: tuple[int, str]) -> tuple[int, str]:
        return pair[0], pair[1] + "!"

    with Infinite(
        [(1, "a"), (2, "b"), (3, "c")],
        add_tag,
        unpack_args(lambda x, tag, k: (x * k, tag), k=10),
        apply_at(-1, str.upper),
        batch_size=3,
        batches_per_epoch=1,
        combiner=combine_batches,
    ) as batches:
        assert list(batches()) == [((10, 20, 30), ("A!", "B!", "C!"))]


SIZES = [3, 4, 2, 6, 1, 9, 12, 2]


def test_predicate_batches_follow_dpipe_rule() -> None:
    seen: list[int] = []

    def should_add(batch: list[int], item: int) -> bool:
        seen.append(len(batch))
        return sum(batch) + item <= 10

    with Infinite(SIZES, batch_size=should_add, batches_per_epoch=6, combiner=list) as batches:
        assert list(batches()) == [[3, 4, 2], [6, 1], [9], [12], [2, 3, 4], [2, 6, 1]]
    assert 0 not in seen  # an empty batch takes the item without asking


def test_budget_sum_matches_the_predicate(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "fitbatch.pipeline"):
        with Infinite(
            SIZES, batch_size=Budget(10, size=float), batches_per_epoch=6, combiner=list
        ) as batches:
            assert list(batches()) == [[3, 4, 2], [6, 1], [9], [12], [2, 3, 4], [2, 6, 1]]
    oversized = [r for r in caplog.records if "over the budget" in r.getMessage()]
    assert len(oversized) == 1 and "12" in oversized[0].getMessage()


def test_budget_padded_batches() -> None:
    # count x max <= 10
    with Infinite(
        SIZES[:6] + [12],
        batch_size=Budget(10, size=float, cost="padded"),
        batches_per_epoch=6,
        combiner=list,
    ) as batches:
        assert list(batches()) == [[3, 4], [2], [6], [1], [9], [12]]


@pytest.mark.parametrize(
    "rule", [2, Budget(10, size=float, cost="padded")], ids=["fixed", "budget"]
)
def test_a_full_batch_leaves_before_the_next_item_arrives(rule: Any) -> None:
    more = threading.Event()
    waited_out: list[bool] = []

    def source() -> Any:
        yield 3
        yield 4  # [3, 4] is full for both rules: 2 items; 3 x 4 > 10
        waited_out.append(not more.wait(HANG))
        yield from itertools.count(5)

    with Infinite(source(), batch_size=rule, batches_per_epoch=2, combiner=list) as batches:
        it = batches()
        assert next(it) == [3, 4]
        assert waited_out == []  # the source was still holding back item 5
        more.set()
        next(it)
    assert waited_out == [False]


def test_budget_with_d_dimensional_sizes() -> None:
    # padded volume: count x max(h) x max(w) <= 24
    shapes = [(2, 3), (2, 2), (1, 4), (4, 4), (3, 1)]
    with Infinite(
        shapes,
        batch_size=Budget(24, size=lambda s: s, cost="padded"),
        batches_per_epoch=5,
        combiner=list,
    ) as batches:
        assert list(batches()) == [
            [(2, 3), (2, 2), (1, 4)],
            [(4, 4)],
            [(3, 1), (2, 3)],
            [(2, 2), (1, 4)],
            [(4, 4)],
        ]


def reference_batches(
    items: list[Any], n: int, budget: float, size: Any, model: Any
) -> list[list[Any]]:
    """Obviously correct: re-evaluate the whole candidate batch for each item."""

    def cost(batch: list[Any]) -> float:
        sizes = np.array([size(x) for x in batch], dtype=np.float64)
        return float(
            model.evaluate(
                np.array([len(batch)], dtype=np.float64),
                sizes.max(axis=0)[None],
                sizes.sum(axis=0)[None],
            )[0]
        )

    out: list[list[Any]] = []
    batch: list[Any] = []
    for item in itertools.cycle(items):
        if batch and cost(batch + [item]) > budget:
            out.append(batch)
            batch = []
            if len(out) == n:
                return out
        batch.append(item)
    raise AssertionError("unreachable: the cycle is endless")


@pytest.mark.parametrize(
    "cost", ["sum", "padded", PaddedPolynomial(fixed=5, linear=1, per_token=2, quadratic=0.1)]
)
@pytest.mark.parametrize("generic", [False, True], ids=["builtin", "function"])
def test_budget_matches_reference(cost: Any, generic: bool) -> None:
    rng = np.random.default_rng(np.random.SeedSequence(7, spawn_key=(1,)))
    model = resolve_cost(cost)
    # `generic` hides the model behind a function: the vectorised path instead of pure Python.
    rule_cost = (lambda c, m, s: model.evaluate(c, m, s)) if generic else model
    for _ in range(5):
        items = rng.integers(0, 40, size=int(rng.integers(3, 30))).tolist()
        expected = reference_batches(items, 12, 100.0, float, model)
        with Infinite(
            items,
            batch_size=Budget(100, size=float, cost=rule_cost),
            batches_per_epoch=12,
            combiner=list,
        ) as batches:
            assert list(batches()) == expected


def test_budget_measures_each_item_once_and_never_rescans() -> None:
    calls = {"size": 0, "cost": 0}

    def size(x: int) -> int:
        calls["size"] += 1
        return x

    def cost(count: Any, max_size: Any, sum_size: Any) -> Any:
        calls["cost"] += 1
        return sum_size

    rule = Budget(50, size=size, cost=cost)
    calls["cost"] = 0  # resolve_cost probes the function for monotonicity once
    state = rule.start()
    batches = [b for x in range(1, 200) for b in state.push(x)]
    assert calls == {"size": 199, "cost": 199}
    assert batches[:3] == [list(range(1, 10)), list(range(10, 14)), [14, 15, 16]]


def test_budget_parses_units_and_validates() -> None:
    assert Budget("1KiB", size=len).budget == 1024.0
    assert isinstance(Budget(1, size=len, cost="padded").cost, PaddedCost)
    assert isinstance(Budget(1, size=len).cost, SumCost)
    with pytest.raises(ValueError, match="budget"):
        Budget(0, size=len)
    with pytest.raises(TypeError, match="size"):
        Budget(10, size=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost"):
        Budget(10, size=len, cost="nope")


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "x", [[1, 2]]])
def test_budget_rejects_bad_sizes_in_the_consumer(bad: Any) -> None:
    with Infinite([1], batch_size=Budget(10, size=lambda _: bad), batches_per_epoch=1) as batches:
        with pytest.raises(ValueError, match="Budget.size returned"):
            list(batches())


# --- sources -------------------------------------------------------------------------------


def test_sample_weighted_frequencies() -> None:
    weights = [1.0, 2.0, 7.0, 0.0]
    n = 30_000
    counts = Counter(itertools.islice(sample("abcd", weights=weights, seed=123), n))
    assert counts["d"] == 0
    for letter, w in zip("abc", weights, strict=False):
        p = w / 10.0
        assert abs(counts[letter] - n * p) < 5 * np.sqrt(n * p * (1 - p)), (letter, counts)


def test_sample_uniform_frequencies() -> None:
    n = 20_000
    counts = Counter(itertools.islice(sample(range(4), seed=5), n))
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(abs(c - n / 4) < 5 * np.sqrt(n * 0.25 * 0.75) for c in counts.values())


def test_sample_is_reproducible_from_its_seed() -> None:
    def first(s: Any) -> list[int]:
        return list(itertools.islice(sample(range(1000), seed=s), 2000))

    assert first(1) == first(1)
    assert first(1) != first(2)
    fresh = sample(range(1000))
    assert list(itertools.islice(fresh, 2000)) == first(fresh.seed)
    assert first(np.random.SeedSequence(9)) == first(9)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([],), ValueError, "non-empty"),
        ((iter([1]),), TypeError, "sequence"),
        (([1, 2], [1.0]), ValueError, "one number per item"),
        (([1, 2], [1.0, -1.0]), ValueError, "index 1"),
        (([1, 2], [0.0, 0.0]), ValueError, "zero"),
        (([1, 2], None, -3), ValueError, "seed"),
    ],
)
def test_sample_validates(args: tuple[Any, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        sample(*args)


def test_infinite_iterator_source_continues_across_epochs() -> None:
    with Infinite(itertools.count(), batch_size=2, batches_per_epoch=2, combiner=list) as batches:
        assert epochs(batches, 2) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


def test_one_shot_iterator_ends_the_epoch_then_raises(caplog: pytest.LogCaptureFixture) -> None:
    batches = Infinite(iter(range(5)), batch_size=2, batches_per_epoch=5, combiner=list)
    with caplog.at_level(logging.WARNING, "fitbatch.pipeline"):
        assert list(batches()) == [[0, 1], [2, 3], [4]]
    assert "epoch 1 has 3 of 5 batches" in caplog.text
    with pytest.raises(RuntimeError, match="re-iterable"):
        batches()
    batches.close()


def test_empty_source_fails_in_the_consumer() -> None:
    with Infinite([], batch_size=2, batches_per_epoch=1) as batches:
        with pytest.raises(ValueError, match="yielded no items"):
            list(batches())


# --- parallel stages -----------------------------------------------------------------------


def test_threads_keep_input_order() -> None:
    def uneven(x: int) -> int:
        time.sleep(0.01 * (3 - x % 4))  # later items often finish first
        return x

    with Infinite(
        range(12), Threads(uneven, n_workers=3), batch_size=4, batches_per_epoch=3, combiner=list
    ) as batches:
        assert list(batches()) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_threads_completion_order_is_an_option() -> None:
    one_passed = threading.Event()

    def zero_waits_for_one(x: int) -> int:
        if x == 0:
            assert one_passed.wait(HANG)
        return x

    def note_one(x: int) -> int:  # the next stage: item 1 got there before item 0 finished
        if x == 1:
            one_passed.set()
        return x

    stage = Threads(zero_waits_for_one, n_workers=2, ordered=False)
    with Infinite(
        [0, 1], stage, note_one, batch_size=2, batches_per_epoch=1, combiner=list
    ) as batches:
        assert list(batches()) == [[1, 0]]


def test_stage_bounds_work_in_flight() -> None:
    started = itertools.count()

    def count(x: int) -> int:
        next(started)
        return x

    # Nothing is consumed: the stages fill their buffers and stop pulling from the source.
    stage = Threads(count, n_workers=2, max_in_flight=3)
    with Infinite(itertools.count(), stage, batch_size=1, batches_per_epoch=1, combiner=list):
        time.sleep(0.3)
        calls = next(started)
        # 3 in flight + 1 each in: results queue, batching, its queue, combiner, batch queue
        assert calls <= 3 + 5


def test_processes_keep_input_order_across_epochs() -> None:
    assert Loky is Processes
    with Infinite(
        range(5),
        Loky(workers.square, n_workers=2),
        batch_size=3,
        batches_per_epoch=2,
        combiner=list,
    ) as batches:
        assert epochs(batches, 2) == [[[0, 1, 4], [9, 16, 0]], [[1, 4, 9], [16, 0, 1]]]


def test_processes_with_the_standard_library() -> None:
    stage = Processes(workers.square, n_workers=2, backend="stdlib")
    with Infinite(range(4), stage, batch_size=2, batches_per_epoch=2, combiner=list) as batches:
        assert list(batches()) == [[0, 1], [4, 9]]


def test_processes_need_picklable_functions() -> None:
    lock = threading.Lock()
    with pytest.raises(TypeError, match="picklable"):
        Processes(lambda x: x, backend="stdlib")
    with pytest.raises(TypeError, match="picklable"):
        Processes(lambda x, _lock=lock: x)  # type: ignore[misc]


# --- errors reach the consumer with their own type -----------------------------------------


class SourceError(Exception):
    pass


def test_source_error_arrives_after_the_batches_before_it() -> None:
    def source() -> Any:
        yield from range(5)
        raise SourceError("disk on fire")

    with Infinite(source(), batch_size=2, batches_per_epoch=5, combiner=list) as batches:
        it = batches()
        assert [next(it), next(it)] == [[0, 1], [2, 3]]
        with pytest.raises(SourceError, match="disk on fire") as info:
            next(it)
    assert "raised in fitbatch.pipeline stage source" in notes(info.value)


def _boom_at_three(stage: Any) -> pytest.ExceptionInfo[workers.Boom]:
    """The error a stage raised on item 3, after the first batch came through."""
    with Infinite(range(10), stage, batch_size=2, batches_per_epoch=3, combiner=list) as batches:
        it = batches()
        assert next(it) == [0, 1]
        with pytest.raises(workers.Boom, match="item 3") as info:
            next(it)
    return info


def test_thread_stage_error_keeps_type_and_traceback() -> None:
    info = _boom_at_three(Threads(workers.fail_at_three, n_workers=2))
    assert any(
        "Threads(fail_at_three" in note and "worker thread" in note for note in notes(info.value)
    )
    assert "fail_at_three" in [
        frame.name for frame in traceback.extract_tb(info.value.__traceback__)
    ]


def test_process_stage_error_keeps_type_and_remote_traceback() -> None:
    info = _boom_at_three(Processes(workers.fail_at_three, n_workers=2))
    assert any("worker process" in note for note in notes(info.value))
    assert "fail_at_three" in str(info.value.__cause__)  # the worker's traceback, as text


@pytest.mark.parametrize("backend", ["loky", "stdlib"])
@pytest.mark.parametrize(("fn", "kind", "message", "why"), [
    (workers.unpicklable_error_at_three, "NeedsTwoArgs", "shard-3.tar: truncated", "unpickling it fails: TypeError"),
    (workers.lock_error_at_three, "HoldsALock", "item 3 holds a lock", "pickling it fails: TypeError"),
])
def test_a_worker_error_that_cannot_travel_arrives_named(backend: str, fn: Any, kind: str, message: str, why: str) -> None:
    stage = Processes(fn, n_workers=2, backend=backend)
    with Infinite(range(10), stage, batch_size=2, batches_per_epoch=3, combiner=list) as batches:
        it = batches()
        assert next(it) == [0, 1]
        with pytest.raises(RuntimeError) as info:  # was: loky's BrokenProcessPool, or a bare pickling TypeError
            next(it)
    text = str(info.value)
    assert text.startswith(f"pipeline stage 1 Processes({fn.__name__}, n_workers=2), in worker process ")
    assert f"raised pipeline_scripts.workers.{kind}: {message}\n" in text
    assert why in text
    assert f'in {fn.__name__}\n    raise {kind}(' in text  # the worker's traceback, as text
    assert any("worker process" in note for note in notes(info.value))


@pytest.mark.parametrize("backend", ["loky", "stdlib"])
def test_a_dead_worker_process_is_reported(backend: str) -> None:
    stage = Processes(workers.die_at_three, n_workers=2, backend=backend)
    with Infinite(range(10), stage, batch_size=2, batches_per_epoch=3, combiner=list) as batches:
        with pytest.raises(BrokenProcessPool) as info:
            list(batches())
    assert any("worker process" in note for note in notes(info.value))


def _divide(x: int) -> float:
    return 1 / (x - 2)


@pytest.mark.parametrize(
    ("where", "error"),
    [("transform", ZeroDivisionError), ("predicate", KeyError), ("combiner", IndexError)],
)
def test_errors_of_every_stage_keep_their_type(where: str, error: type[Exception]) -> None:
    transforms = [_divide] if where == "transform" else []

    def should_add(batch: list[Any], item: Any) -> bool:
        if where == "predicate":
            raise KeyError(item)
        return len(batch) < 2

    def combiner(batch: list[Any]) -> Any:
        if where == "combiner":
            raise IndexError(len(batch))
        return batch

    with Infinite(
        range(5), *transforms, batch_size=should_add, batches_per_epoch=3, combiner=combiner
    ) as batches:
        with pytest.raises(error) as info:
            list(batches())
    stage = {
        "transform": "stage 1 _divide",
        "predicate": "stage batching",
        "combiner": "stage combiner",
    }[where]
    assert any(stage in note for note in notes(info.value))


def test_a_failed_pipeline_stays_failed() -> None:
    batches = Infinite(range(10), _divide, batch_size=3, batches_per_epoch=2, combiner=list)
    with pytest.raises(ZeroDivisionError):
        list(batches())
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as info:
        batches()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    batches.close()


# --- lifecycle -----------------------------------------------------------------------------


def test_breaking_out_of_an_epoch_loses_nothing() -> None:
    with Infinite(range(100), batch_size=2, batches_per_epoch=4, combiner=list) as batches:
        for i, _ in enumerate(batches()):
            if i == 1:
                break
        assert list(batches()) == [[4, 5], [6, 7], [8, 9], [10, 11]]


def test_an_abandoned_epoch_cannot_be_resumed() -> None:
    with Infinite(range(100), batch_size=2, batches_per_epoch=4, combiner=list) as batches:
        old = batches()
        assert next(old) == [0, 1]
        new = batches()
        with pytest.raises(RuntimeError, match="abandoned"):
            next(old)
        assert next(new) == [2, 3]


def test_close_is_idempotent_and_final() -> None:
    batches = Infinite(range(10), batch_size=2, batches_per_epoch=1, combiner=list)
    batches.close()  # never started
    batches.close()
    with pytest.raises(RuntimeError, match="closed"):
        batches()
    with Infinite(range(10), batch_size=2, batches_per_epoch=3, combiner=list) as started:
        it = started()
        assert next(it) == [0, 1]
    with pytest.raises(RuntimeError, match="closed"):
        next(it)
    assert "closed" in repr(started)


def _close_in_thread(batches: Infinite) -> threading.Thread:
    closer = threading.Thread(target=batches.close, daemon=True)
    closer.start()
    closer.join(HANG)
    return closer


def test_close_returns_while_a_thread_stage_blocks(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    entered = threading.Event()

    def block(x: int) -> int:
        entered.set()
        release.wait(30)
        return x

    batches = Infinite(range(10), Threads(block, n_workers=2), batch_size=2, batches_per_epoch=1)
    try:
        batches()
        assert entered.wait(HANG)
        with caplog.at_level(logging.WARNING, "fitbatch.pipeline"):
            assert not _close_in_thread(batches).is_alive()
        assert "blocked in user code" in caplog.text
    finally:
        release.set()  # the daemon threads end once the user's call returns


def test_close_kills_blocked_worker_processes(tmp_path: Path) -> None:
    source = ((str(tmp_path), x) for x in itertools.count())
    batches = Infinite(
        source,
        Processes(workers.record_pid_and_block, n_workers=2),
        batch_size=2,
        batches_per_epoch=1,
    )
    batches()
    deadline = time.monotonic() + 30  # worker start-up, on a busy machine
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    assert not _close_in_thread(batches).is_alive()
    assert wait_all_dead(pids) == []


def test_garbage_collection_closes_a_forgotten_pipeline() -> None:
    def start() -> None:
        batches = Infinite(range(10), Threads(abs, 2), batch_size=2, batches_per_epoch=1)
        assert len(list(batches())) == 1

    start()
    gc.collect()  # the fixture checks that the threads end


def _run_script(name: str, *args: str) -> subprocess.Popen[str]:
    """The script in a session of its own, so that :func:`_end` reaches its workers too."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / name), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=sys.platform != "win32",
    )


def _end(proc: subprocess.Popen[str]) -> None:
    """Kill the script and whatever it left (a hung exit's workers hold its pipes open)."""
    if sys.platform != "win32":
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.kill()
    proc.communicate(timeout=HANG)


@pytest.mark.parametrize("mode, pools", [("threads", ""), ("loky", ""), ("stdlib", ""), ("loky", "two"), ("stdlib", "two")])
def test_a_forgotten_pipeline_does_not_delay_exit(mode: str, pools: str, tmp_path: Path) -> None:
    """``two``: two process pools (loky's second registered its exit hook after ours, which ran
    after it, and the exit hung on the busy workers)."""
    proc = _run_script("forgotten.py", mode, str(tmp_path), *([pools] if pools else []))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "[0, 1]"
        assert proc.stdout.readline().strip() == "exiting"
        assert proc.wait(HANG) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        _end(proc)
    assert wait_all_dead([int(p.name) for p in tmp_path.iterdir()]) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_interrupts_the_consumer_and_ends_the_workers(tmp_path: Path) -> None:
    proc = _run_script("interrupt.py", str(tmp_path))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # the consumer now waits for a batch that will not come
        proc.send_signal(signal.SIGINT)
        proc.wait(HANG)
        stderr = proc.stderr.read() if proc.stderr else ""
    finally:
        _end(proc)
    assert proc.returncode in (1, -signal.SIGINT)
    assert "KeyboardInterrupt" in stderr
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert pids and wait_all_dead(pids) == []


# --- combiners -----------------------------------------------------------------------------


def test_combine_pad_splits_padding_by_ratio() -> None:
    batch = [np.array([1, 1, 1]), np.array([2]), np.array([3, 3])]
    np.testing.assert_array_equal(combine_pad(batch), [[1, 1, 1], [0, 2, 0], [3, 3, 0]])
    np.testing.assert_array_equal(combine_pad(batch, ratio=1.0), [[1, 1, 1], [0, 0, 2], [0, 3, 3]])
    images = [np.ones((1, 3), int), np.full((3, 1), 2)]
    np.testing.assert_array_equal(
        combine_pad(padding_values=9, ratio=[0.0, 0.5])(images),
        [[[1, 1, 1], [9, 9, 9], [9, 9, 9]], [[9, 2, 9], [9, 2, 9], [9, 2, 9]]],
    )


def test_combine_pad_per_component_values() -> None:
    batch = [(np.array([5.0, 6.0]), np.array([1]), 0), (np.array([7.0]), np.array([1, 2, 3]), 1)]
    xs, masks, labels = combine_pad(padding_values=[np.min, -1, 0], ratio=0.0)(batch)
    np.testing.assert_array_equal(xs, [[5.0, 6.0], [7.0, 7.0]])
    np.testing.assert_array_equal(masks, [[1, -1, -1], [1, 2, 3]])
    np.testing.assert_array_equal(labels, [0, 1])
    dicts = [{"x": np.array([1]), "y": 0}, {"x": np.array([1, 2]), "y": 1}]
    out = combine_pad(dicts, padding_values={"x": 7, "y": 0}, ratio=0.0)
    np.testing.assert_array_equal(out["x"], [[1, 7], [1, 2]])
    np.testing.assert_array_equal(out["y"], [0, 1])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: combine_pad(0), TypeError, "keywords only"),  # type: ignore[arg-type]
        (lambda: combine_pad(ratio=1.5), ValueError, "ratio"),
        (lambda: combine_pad(padding_values="x"), TypeError, "padding_values"),
        (lambda: combine_pad([np.zeros(2), np.zeros((2, 2))]), ValueError, "dimensions"),
        (lambda: combine_pad([(1, 2), (3, 4)], padding_values=[0]), ValueError, "2 components"),
        (lambda: combine_pad([np.zeros(2)], ratio=[0.5, 0.5]), ValueError, "one per axis"),
        (lambda: combine_to_arrays([(1, 2), (3,)]), ValueError, "item 1"),
        (lambda: combine_batches([]), ValueError, "empty"),
        (lambda: combine_batches([{"a": 1}, {"b": 1}]), ValueError, "keys"),
    ],
)
def test_combiners_validate(call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_combine_structures() -> None:
    assert combine_batches([(1, "a"), (2, "b")]) == ((1, 2), ("a", "b"))
    assert combine_batches([[1, "a"], [2, "b"]]) == ((1, 2), ("a", "b"))
    assert combine_batches([{"k": 1}, {"k": 2}]) == {"k": (1, 2)}
    out = combine_to_arrays([np.zeros((2, 3)), np.ones((2, 3))])
    assert isinstance(out, np.ndarray) and out.shape == (2, 2, 3)


def test_combine_to_tensors() -> None:
    torch = pytest.importorskip("torch")
    xs, ys = combine_to_tensors([(torch.zeros(2), 0), (torch.ones(2), 1)])
    assert torch.equal(xs, torch.tensor([[0.0, 0.0], [1.0, 1.0]])) and ys.tolist() == [0, 1]
    with Infinite(
        [np.zeros(3, np.float32)], batch_size=2, batches_per_epoch=1, combiner=combine_to_tensors
    ) as b:
        (batch,) = b()
    assert batch.dtype == torch.float32 and tuple(batch.shape) == (2, 3)


# --- the seed tutorial's examples, with fitbatch's names -----------------------------------


def test_tutorial_shapes() -> None:
    rng = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(2,)))
    dataset = [(rng.integers(0, 255, (28, 28)), int(rng.integers(10))) for _ in range(50)]

    def zoom(image: np.ndarray, scale_factor: list[int]) -> np.ndarray:
        return np.kron(image, np.ones(scale_factor, dtype=image.dtype))

    x, y = next(sample(dataset))
    assert x.shape == (28, 28) and 0 <= y < 10
    with Infinite(sample(dataset, seed=1), batch_size=30, batches_per_epoch=10) as batches:
        for _ in range(2):
            assert [(xs.shape, ys.shape) for xs, ys in batches()] == [((30, 28, 28), (30,))] * 10
    for step in (
        apply_at(0, zoom, scale_factor=[2, 2]),
        unpack_args(lambda image, label: [zoom(image, [2, 2]), label]),
    ):
        with Infinite(sample(dataset, seed=1), step, batch_size=30, batches_per_epoch=3) as batches:
            assert [(xs.shape, ys.shape) for xs, ys in batches()] == [((30, 56, 56), (30,))] * 3

    images = [np.zeros((10, 10, int(rng.integers(2, 40)))) for _ in range(100)]
    labels = rng.integers(0, 2, size=30)
    pairs = list(zip(images, labels, strict=False))

    def should_add(seq: list[Any], item: Any) -> bool:
        return sum(image.shape[-1] for image, _ in seq + [item]) <= 100

    expected_stream = sample(pairs, seed=4)
    with Infinite(
        sample(pairs, seed=4), batch_size=should_add, batches_per_epoch=3, combiner=combine_pad
    ) as batches:
        for xs, ys in batches():
            depths = [next(expected_stream)[0].shape[-1] for _ in range(len(ys))]
            assert xs.shape == (len(ys), 10, 10, max(depths)) and sum(depths) <= 100


# --- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"batch_size": True}, TypeError, "batch_size"),
        ({"batch_size": "3"}, TypeError, "Budget"),
        ({"batches_per_epoch": 0}, ValueError, "batches_per_epoch"),
        ({"buffer_size": 0}, ValueError, "buffer_size"),
        ({"combiner": "pad"}, TypeError, "combiner"),
        ({"source": 3}, TypeError, "iterable"),
        ({"transforms": (3,)}, TypeError, "transform 1"),
    ],
)
def test_infinite_validates_arguments(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args = {"source": range(3), "transforms": (), "batch_size": 2, "batches_per_epoch": 1, **kwargs}
    source, transforms = args.pop("source"), args.pop("transforms")
    with pytest.raises(error, match=match):
        Infinite(source, *transforms, **args)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: Threads(abs, n_workers=0), ValueError, "n_workers"),
        (lambda: Threads(abs, n_workers=3, max_in_flight=2), ValueError, "max_in_flight"),
        (lambda: Threads(abs, ordered="yes"), TypeError, "ordered"),  # type: ignore[arg-type]
        (lambda: Threads(3), TypeError, "callable"),  # type: ignore[arg-type]
        (lambda: Processes(abs, backend="gpu"), ValueError, "backend"),
        (lambda: apply_at("0", abs), TypeError, "index"),  # type: ignore[arg-type]
        (lambda: unpack_args(None), TypeError, "callable"),  # type: ignore[arg-type]
    ],
)
def test_transforms_validate(call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_apply_at_checks_the_index_per_item() -> None:
    with pytest.raises(IndexError, match="out of range"):
        apply_at(2, abs)((1, 2))


def test_public_names() -> None:
    assert pipeline.__all__ == sorted(pipeline.__all__)
    assert all(hasattr(pipeline, name) for name in pipeline.__all__)
