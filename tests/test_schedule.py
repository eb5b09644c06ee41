"""fitbatch.schedule: traces, scheduled micro-batches, gradient accumulation, LR rules, gloo runs."""

from __future__ import annotations

import copy
import io
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from contracts import load_script, run_processes
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from fitbatch.plan._planner import PlanOptions  # noqa: E402
from fitbatch.schedule import (  # noqa: E402
    BatchSizeSchedule,
    GradientAccumulator,
    MicroBatchInfo,
    ScheduledBatchSampler,
)

WORKER = Path(__file__).parent / "schedule_scripts" / "gloo_worker.py"
W = load_script(WORKER, "schedule_gloo_worker")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def csv_schedule(text: str, **kw) -> BatchSizeSchedule:
    return BatchSizeSchedule.from_csv(io.StringIO(text), **kw)


# ---------------------------------------------------------------- traces


@pytest.mark.parametrize(
    "text",
    [
        "step,batchsize\n0,8\n1,16\n2,8\n",
        "step,batchsize\r\n0,8\r\n1,16\r\n2,8\r\n",  # CRLF
        " step, batchsize\n 0, 8\n 1, 16\n 2,    8\n",  # the seed's README: leading spaces
        "\ufeffstep,batchsize\n0,8\n\n1,16\n2,8\n\n",  # BOM, blank lines
        "0,8\n1,16\n2,8",  # no header, no final newline
    ],
)
def test_trace_formats(text):
    sched = csv_schedule(text)
    assert sched.values(0, 3).tolist() == [8, 16, 8]
    assert len(sched) == 3 and sched.kind == "trace"


def test_trace_from_path_with_crlf(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(b"\xef\xbb\xbfstep,batchsize\r\n 0, 1024\r\n 1, 2048\r\n")
    sched = BatchSizeSchedule.coerce(str(path))
    assert sched.values(0, 2).tolist() == [1024, 2048]
    assert BatchSizeSchedule.coerce(path).to_dict() == sched.to_dict()


@pytest.mark.parametrize(
    "text, match",
    [
        ("step,batchsize\n0,8\n1,0\n", r"line 3 \(0\)"),
        ("step,batchsize\n0,8\n1,-4\n", r"line 3 \(-4\)"),
        ("step,batchsize\n0,8\n1,8.5\n", "line 3: expected 'step,batchsize'"),
        ("step,batchsize\n0,8\n1,abc\n", "line 3"),
        ("step,batchsize\n0,8,1\n", "line 2"),
        ("step,batchsize\n0,8\n2,8\n", "line 3: step 2 out of order; expected step 1"),
        ("step,batchsize\n1,8\n", "step 1 out of order; expected step 0"),
        ("step,batchsize\n", "no 'step,batchsize' rows"),
        ("", "no 'step,batchsize' rows"),
    ],
)
def test_bad_traces_name_the_line(text, match):
    with pytest.raises(ValueError, match=match):
        csv_schedule(text)


@pytest.mark.parametrize(
    "row, match",
    [
        ("0,+-5", r"trace\.csv line 2: expected 'step,batchsize' with two whole numbers, got batch size '\+-5'"),
        ("0,\u00b2", r"trace\.csv line 2: expected 'step,batchsize' with two whole numbers, got batch size '\u00b2'"),
        ("0,1_000", r"trace\.csv line 2: .* got batch size '1_000'"),
        ("+-0,5", r"trace\.csv line 2: .* got step '\+-0'"),
        ("0," + "1" + "0" * 30, r"trace\.csv line 2: batch size 1000000000000000000000000000000 is too large"),
        ("0,9223372036854775808", r"trace\.csv line 2: batch size 9223372036854775808 is too large"),
    ],
)
def test_rejected_trace_values_name_file_line_and_value(tmp_path, row, match):
    path = tmp_path / "trace.csv"
    path.write_text(f"step,batchsize\n{row}\n1,8\n", encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        BatchSizeSchedule.from_csv(path)
    with pytest.raises(ValueError, match=match):
        BatchSizeSchedule.coerce(str(path))


def test_a_binary_trace_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    with pytest.raises(ValueError, match=r"trace\.csv is not a UTF-8 text file \(byte 0: b'\\x89'\); expected a CSV trace"):
        BatchSizeSchedule.from_csv(path)
    with path.open("rb") as fh:  # an open binary file: the same message
        with pytest.raises(ValueError, match=r"trace\.csv is not a UTF-8 text file"):
            BatchSizeSchedule.from_csv(fh)
    with path.open(encoding="utf-8") as fh:  # an open text file that fails to decode
        with pytest.raises(ValueError, match=r"trace\.csv is not a UTF-8 text file"):
            BatchSizeSchedule.from_csv(fh)


def test_only_the_first_line_may_be_a_header():
    assert csv_schedule("step,batchsize\n0,8\n").values(0, 1).tolist() == [8]
    with pytest.raises(ValueError, match=r"line 2: expected 'step,batchsize' with two whole numbers, got 1 fields 'oops'"):
        csv_schedule("step,batchsize\noops\n0,8\n")
    with pytest.raises(ValueError, match=r"line 3: expected .* got step 'more'"):
        csv_schedule("junk\n\nmore,garbage\n0,8\n")
    with pytest.raises(ValueError, match=r"line 1: expected .* got step 'x0'"):
        csv_schedule("x0,8\n1,8\n")  # a number in it: a data row, not a header


def test_one_row_trace():
    one = "step,batchsize\n0,16\n"
    assert csv_schedule(one, on_exhausted="hold_last").values(0, 5).tolist() == [16] * 5
    assert csv_schedule(one, on_exhausted="cycle").values(3, 2).tolist() == [16, 16]
    strict = csv_schedule(one)
    assert strict(0) == 16
    with pytest.raises(ValueError, match="has 1 steps .* step 1 was asked for; pass on_exhausted"):
        strict(1)
    # one row covering exactly one epoch works; a second epoch needs more rows
    sampler = ScheduledBatchSampler(16, strict, micro_batch_size=4)
    assert len(sampler) == 4
    sampler.set_epoch(1)
    with pytest.raises(ValueError, match="step 1 was asked for"):
        len(sampler)


def test_short_trace_fails_when_the_sampler_is_built():
    short = csv_schedule("step,batchsize\n0,8\n1,8\n")
    with pytest.raises(ValueError, match="has 2 steps"):
        ScheduledBatchSampler(100, short, micro_batch_size=4)
    held = csv_schedule("step,batchsize\n0,8\n1,16\n", on_exhausted="hold_last")
    sampler = ScheduledBatchSampler(100, held, micro_batch_size=4, drop_last=True)
    assert sampler.step_totals()[0].tolist() == [8] + [16] * 5
    cyc = csv_schedule("step,batchsize\n0,8\n1,16\n", on_exhausted="cycle")
    assert ScheduledBatchSampler(48, cyc, micro_batch_size=4).step_totals()[0].tolist() == [8, 16, 8, 16]


def test_list_constant_function_and_coerce():
    assert BatchSizeSchedule.coerce(32)(10) == 32
    assert BatchSizeSchedule.coerce([4, 8]).values(0, 2).tolist() == [4, 8]
    assert BatchSizeSchedule.coerce(np.array([4, 8])).kind == "list"
    fn = BatchSizeSchedule.coerce(lambda s: 4 * (s + 1))
    assert fn.values(0, 3).tolist() == [4, 8, 12] and fn.length is None
    with pytest.raises(TypeError, match="has no end"):
        len(fn)
    with pytest.raises(ValueError, match="returned 0 for step 0"):
        BatchSizeSchedule.from_function(lambda s: 0)(0)
    with pytest.raises(ValueError, match=">= 1"):
        BatchSizeSchedule.from_list([4, 0])
    with pytest.raises(TypeError):
        BatchSizeSchedule.from_list([4.5])
    with pytest.raises(TypeError, match="schedule must be"):
        BatchSizeSchedule.coerce(4.5)
    with pytest.raises(ValueError, match="unknown on_exhausted 'wrap'; expected one of \\('error', 'hold_last', 'cycle'\\)"):
        BatchSizeSchedule.from_list([4], on_exhausted="wrap")


def test_ramp_matches_megatron_rule():
    start, inc, over, final = 32, 32, 1000, 256
    sched = BatchSizeSchedule.ramp(start, inc, over, final=final)
    values = sched.values(0, 200)
    consumed = np.concatenate([[0], np.cumsum(values)[:-1]])
    per_inc = over / ((final - start) // inc)
    expect = np.minimum(start + inc * np.floor(consumed / per_inc), final)
    assert values.tolist() == expect.astype(int).tolist()
    assert values[-1] == final and sched(10**6) == final
    with pytest.raises(ValueError, match="whole number of increments"):
        BatchSizeSchedule.ramp(32, 30, 100, final=100)


# ---------------------------------------------------------------- sampler contracts


def run_ranks(n_or_sizes, schedule, world, epoch=0, **kw):
    """Per rank: the sampler, its micro-batches and infos for ``epoch``."""
    out = []
    for rank in range(world):
        s = ScheduledBatchSampler(n_or_sizes, schedule, num_replicas=world, rank=rank, **kw)
        s.set_epoch(epoch)
        infos = s.infos()
        pairs = list(s.with_info())
        assert [i for _, i in pairs] == infos
        assert [b for b, _ in pairs] == list(s)
        assert len(s) == len(pairs)
        out.append((s, [b for b, _ in pairs], infos))
    return out


def check_contracts(runs, sizes, budget_mode=False, micro=None):
    n = len(sizes)
    counts = {len(batches) for _, batches, _ in runs}
    assert len(counts) == 1, f"unequal micro-batch counts per rank: {counts}"
    shared = [[(i.step, i.micro, i.n_micro, i.step_samples, i.step_units, i.scheduled) for i in infos] for _, _, infos in runs]
    assert all(s == shared[0] for s in shared)
    per_step: dict[int, list[int]] = defaultdict(list)
    for _, batches, infos in runs:
        for b, info in zip(batches, infos, strict=True):
            assert len(b) == info.samples >= 1
            assert info.units == pytest.approx(float(sum(sizes[i] for i in b)))
            if micro is not None:
                assert len(b) <= micro
            per_step[info.step].extend(b)
    seen = [i for idx in per_step.values() for i in idx]
    assert len(seen) == len(set(seen)), "a sample appears twice in one epoch"
    sampler = runs[0][0]
    assert len(seen) + sampler.layout().dropped == n == sampler.plan().stats().dropped + sampler.plan().stats().skipped + len(seen)
    first = runs[0][2][0].step if runs[0][2] else None
    totals = sampler.step_totals()
    infos = runs[0][2]
    last = max(per_step) if per_step else None
    for k, (step, idx) in enumerate(sorted(per_step.items())):
        info = next(i for i in infos if i.step == step)
        assert step == first + k
        assert len(idx) == info.step_samples == totals[0][k]
        assert info.step_units == pytest.approx(float(sum(sizes[i] for i in idx))) == pytest.approx(totals[1][k])
        if budget_mode:
            assert info.step_units <= info.scheduled or info.n_micro == 1
        elif step != last:
            assert len(idx) == info.scheduled  # every step but the epoch's last consumes its size exactly
    return per_step


@given(
    n=st.integers(0, 200),
    world=st.integers(1, 4),
    micro=st.integers(1, 6),
    raw=st.lists(st.integers(1, 60), min_size=1, max_size=8),
    rounding=st.sampled_from(["down", "up", "uneven"]),
    drop_last=st.booleans(),
    on_exhausted=st.sampled_from(["hold_last", "cycle"]),
    epoch=st.integers(0, 2),
)
def test_sample_mode_contracts(n, world, micro, raw, rounding, drop_last, on_exhausted, epoch):
    if rounding == "uneven":  # keep sizes the rule accepts: enough samples for every micro-batch
        q = micro * world
        raw = [max(v, -(-v // q) * world) for v in raw]
    sched = BatchSizeSchedule.from_list(raw, on_exhausted=on_exhausted)
    sizes = np.random.default_rng(n).integers(1, 9, n)
    runs = run_ranks(sizes, sched, world, epoch=epoch, micro_batch_size=micro, rounding=rounding, drop_last=drop_last, seed=5)
    per_step = check_contracts(runs, sizes, micro=micro)
    if drop_last and per_step:
        infos = runs[0][2]
        assert all(i.step_samples == i.scheduled for i in infos)
    sampler = runs[0][0]
    assert sampler.first_step(epoch) == sum(sampler.num_steps(e) for e in range(epoch))


@given(
    n=st.integers(1, 150),
    world=st.integers(1, 3),
    budget=st.integers(30, 120),
    raw=st.lists(st.integers(20, 400), min_size=1, max_size=6),
    drop_last=st.booleans(),
)
def test_budget_mode_contracts(n, world, budget, raw, drop_last):
    sizes = np.random.default_rng(n + 1).integers(1, 30, n)
    sched = BatchSizeSchedule.from_list(raw, on_exhausted="cycle")
    try:
        runs = run_ranks(sizes, sched, world, micro_budget=budget, drop_last=drop_last, seed=2)
    except ValueError as exc:  # too few samples to give every rank a micro-batch
        assert "cannot give every rank a batch" in str(exc)
        return
    check_contracts(runs, sizes, budget_mode=True)
    for _, batches, _ in runs:
        for b in batches:
            assert len(b) * max(sizes[i] for i in b) <= budget  # padded cost within the micro budget


def test_budget_mode_accepts_plan_options():
    sizes = np.arange(1, 41)
    opts = PlanOptions.build(64, cost="sum", strategy="sorted", seed=99)
    s = ScheduledBatchSampler(sizes, 200, micro_budget=opts, num_replicas=2, rank=0, seed=1)
    assert s._opts.seed == 1 and s._opts.cost.name == "sum"
    runs = run_ranks(sizes, 200, 2, micro_budget=opts, seed=1)
    check_contracts(runs, sizes, budget_mode=True)


def test_micro_batch_size_takes_an_int_or_a_budget_without_warning(recwarn):
    sizes = np.random.default_rng(0).integers(1, 20, 60)
    by_string = ScheduledBatchSampler(sizes, 120, micro_batch_size="60", num_replicas=2, rank=0, seed=1)
    opts = PlanOptions.build(60, seed=99)
    by_options = ScheduledBatchSampler(sizes, 120, micro_batch_size=opts, num_replicas=2, rank=0, seed=1)
    assert by_string.micro_batch_size is None and by_string._opts == by_options._opts
    assert list(by_string.with_info()) == list(by_options.with_info())
    assert ScheduledBatchSampler(60, 8, micro_batch_size=np.int64(4)).micro_batch_size == 4
    assert "micro_batch_size='60'" in repr(by_string) and "micro_batch_size=4" in repr(ScheduledBatchSampler(60, 8, micro_batch_size=4))
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
    with pytest.raises(TypeError, match=r"micro_batch_size must be an int .*or a PlanOptions, got 2.5"):
        ScheduledBatchSampler(10, 4, micro_batch_size=2.5)
    with pytest.raises(TypeError, match="got True"):
        ScheduledBatchSampler(10, 4, micro_batch_size=True)
    with pytest.raises(ValueError, match="micro_batch_size '64XB' is not a number"):
        ScheduledBatchSampler(10, 4, micro_batch_size="64XB")
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        ScheduledBatchSampler(10, 4, micro_batch_size=0)
    with pytest.raises(ValueError, match="rounding applies to sample counts"):
        ScheduledBatchSampler([1, 2], 4, micro_batch_size="10", rounding="up")


def test_micro_budget_still_works_with_a_deprecation_warning():
    sizes = np.random.default_rng(0).integers(1, 20, 60)
    with pytest.warns(DeprecationWarning, match=r"micro_budget=.*removed in 0\.3\.0; pass the budget as micro_batch_size="):
        old = ScheduledBatchSampler(sizes, 120, micro_budget=60, num_replicas=2, rank=1, seed=1)
    new = ScheduledBatchSampler(sizes, 120, micro_batch_size="60", num_replicas=2, rank=1, seed=1)
    assert list(old.with_info()) == list(new.with_info())
    assert old.state_dict() == new.state_dict(), "a checkpoint taken with either form resumes the other"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="micro_budget 'lots' is not a number"):
        ScheduledBatchSampler(sizes, 120, micro_budget="lots")


def test_sizes_not_divisible_by_ranks_uneven():
    # 20 = 2 x 4-sample micro-batches per rank... on 3 ranks: 6 micro-batches of 3 or 4 samples
    sched = BatchSizeSchedule.from_list([24, 20, 8, 16], on_exhausted="cycle")
    runs = run_ranks(68, sched, 3, micro_batch_size=4, rounding="uneven", drop_last=True)
    per_step = check_contracts(runs, list(np.ones(68)), micro=4)
    assert [len(per_step[k]) for k in sorted(per_step)] == [24, 20, 8, 16]
    sizes_step1 = sorted(len(b) for _, batches, infos in runs for b, i in zip(batches, infos, strict=True) if i.step == 1)
    assert sizes_step1 == [3, 3, 3, 3, 4, 4]


def test_rounding_rules_and_errors(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("step,batchsize\n0,48\n1,40\n2,50\n")
    with pytest.raises(ValueError, match=r"40 at .*trace.csv line 3 \(step 1\).*multiple of micro_batch_size x num_replicas = 4 x 3 = 12.*rounding="):
        ScheduledBatchSampler(200, str(path), micro_batch_size=4, num_replicas=3, rank=0)
    sched = BatchSizeSchedule.from_csv(path, on_exhausted="hold_last")
    kw = {"micro_batch_size": 4, "num_replicas": 3, "rank": 0}
    down = ScheduledBatchSampler(132, sched, rounding="down", **kw)
    assert down.layout().scheduled.tolist() == [48, 36, 48]
    up = ScheduledBatchSampler(156, sched, rounding="up", **kw)
    assert up.layout().scheduled.tolist() == [48, 48, 60]
    uneven = ScheduledBatchSampler(138, sched, rounding="uneven", **kw)
    assert uneven.step_totals()[0].tolist() == [48, 40, 50]
    with pytest.raises(ValueError, match="at least num_replicas"):
        ScheduledBatchSampler(10, [5], micro_batch_size=1, num_replicas=2, rank=0, rounding="uneven")
    with pytest.raises(ValueError, match="unknown rounding 'nearest'; expected one of \\('error', 'down', 'up', 'uneven'\\)"):
        ScheduledBatchSampler(10, 4, micro_batch_size=4, rounding="nearest")
    with pytest.raises(ValueError, match="exactly one of micro_batch_size"):
        ScheduledBatchSampler(10, 4)
    with pytest.raises(ValueError, match="exactly one of micro_batch_size"):
        ScheduledBatchSampler(10, 4, micro_batch_size=2, micro_budget=10)
    with pytest.raises(ValueError, match="rounding applies"):
        ScheduledBatchSampler([1, 2], 4, micro_budget=10, rounding="up")
    with pytest.raises(TypeError, match="shuffle"):
        ScheduledBatchSampler(10, 4, micro_batch_size=2, shuffle=1)


def test_function_schedule_errors_name_the_step():
    with pytest.raises(ValueError, match="6 at step 1"):
        ScheduledBatchSampler(40, lambda s: 8 if s == 0 else 6, micro_batch_size=4)


def test_epoch_end_final_step_and_drop_last():
    kept = ScheduledBatchSampler(30, 8, micro_batch_size=4, num_replicas=2, rank=0)
    assert kept.step_totals()[0].tolist() == [8, 8, 8, 6]
    assert kept.layout().scheduled.tolist() == [8, 8, 8, 8]
    dropped = ScheduledBatchSampler(30, 8, micro_batch_size=4, num_replicas=2, rank=0, drop_last=True)
    assert dropped.step_totals()[0].tolist() == [8, 8, 8] and dropped.plan().stats().dropped == 6
    # a final remainder below one sample per rank (m=1, 2 ranks, 1 left) is dropped and counted
    tiny = ScheduledBatchSampler(9, 4, micro_batch_size=2, num_replicas=2, rank=1)
    assert tiny.step_totals()[0].tolist() == [4, 4] and tiny.layout().dropped == 1


def test_global_steps_continue_across_epochs_and_shuffle_is_keyed():
    sched = BatchSizeSchedule.from_list(list(range(4, 400, 4)))
    s = ScheduledBatchSampler(50, sched, micro_batch_size=4, drop_last=True, seed=11)
    assert s.first_step(0) == 0
    steps0 = s.num_steps(0)
    s.set_epoch(1)
    infos = s.infos()
    assert infos[0].step == steps0 and infos[0].scheduled == 4 * (steps0 + 1)
    a = ScheduledBatchSampler(50, 10, micro_batch_size=5, seed=11)
    b = ScheduledBatchSampler(50, 10, micro_batch_size=5, seed=11)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)
    plain = ScheduledBatchSampler(20, 10, micro_batch_size=5, shuffle=False)
    assert sum(list(plain), []) == list(range(20))


def test_dataloader_multiworker_cursor_and_infos():
    sampler = ScheduledBatchSampler(40, [8, 16, 16], micro_batch_size=4, seed=0)
    full = list(sampler)
    sampler.load_state_dict(sampler.state_dict(micro=3))
    assert len(sampler) == len(full) - 3
    infos = sampler.infos()
    loader = torch.utils.data.DataLoader(list(range(40)), batch_sampler=sampler, num_workers=2)
    got = [b.tolist() for b in loader]
    assert got == full[3:]
    assert [i.micro for i in infos] == [1, 2, 3, 0, 1, 2, 3]


# ---------------------------------------------------------------- state


def test_resume_equals_uninterrupted_both_modes():
    sizes = np.random.default_rng(0).integers(1, 20, 90)
    for kw in ({"micro_batch_size": 3, "rounding": "uneven"}, {"micro_budget": 60}):
        sched = BatchSizeSchedule.from_list([6, 12, 18, 9], on_exhausted="cycle")
        ref = ScheduledBatchSampler(sizes, sched, num_replicas=2, rank=1, seed=4, **kw)
        ref.set_epoch(2)
        full = list(ref.with_info())
        for cut in (0, 1, len(full) // 2, len(full)):
            a = ScheduledBatchSampler(sizes, sched, num_replicas=2, rank=1, seed=4, **kw)
            a.set_epoch(2)
            it = a.with_info()
            head = [next(it) for _ in range(cut)]
            state = json.loads(json.dumps(a.state_dict()))
            frozen = copy.deepcopy(state)
            b = ScheduledBatchSampler(sizes, sched, num_replicas=2, rank=1, seed=4, **kw)
            b.load_state_dict(state)
            assert state == frozen, "load_state_dict mutated its argument"
            assert len(b) == len(full) - cut
            assert head + list(b.with_info()) == full
        b.set_epoch(3)
        ref.set_epoch(3)
        assert list(b.with_info()) == list(ref.with_info())


def test_load_state_dict_rejects_bad_state():
    s = ScheduledBatchSampler(20, 4, micro_batch_size=2)
    good = s.state_dict()
    for bad, match in (
        ({**good, "extra": 1}, "unknown sampler state keys"),
        ({**good, "version": 99}, "unsupported sampler state version 99"),
        ({**good, "micro": 1.5}, "'micro' must be an int >= 0, got 1.5"),
        ({**good, "n_samples": 21}, "21 samples"),
        ({**good, "num_replicas": 2}, "2 ranks"),
        ({k: v for k, v in good.items() if k != "micro"}, "lacks keys"),
    ):
        with pytest.raises(ValueError, match=match):
            s.load_state_dict(bad)
    other = ScheduledBatchSampler(20, 4, micro_batch_size=2, seed=1)
    with pytest.raises(ValueError, match="another schedule or options"):
        other.load_state_dict(good)
    traced = ScheduledBatchSampler(20, [4, 8, 8], micro_batch_size=2)
    changed = ScheduledBatchSampler(20, [4, 8, 4, 4], micro_batch_size=2)
    with pytest.raises(ValueError, match="another schedule"):
        changed.load_state_dict(traced.state_dict())


def test_load_state_dict_refuses_a_first_step_or_micro_the_schedule_does_not_give():
    sched = BatchSizeSchedule.from_list([4, 8], on_exhausted="hold_last")
    s = ScheduledBatchSampler(40, sched, micro_batch_size=2, num_replicas=2, rank=0)
    s.set_epoch(2)
    good = json.loads(json.dumps(s.state_dict(micro=1)))
    rows = len(s)
    assert good["first_step"] == s.first_step(2) != 7
    fresh = ScheduledBatchSampler(40, sched, micro_batch_size=2, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match=rf"first_step 7 is not where epoch 2 begins .*\(step {good['first_step']}\)"):
        fresh.load_state_dict({**good, "first_step": 7})
    with pytest.raises(ValueError, match=rf"micro 1000000 is beyond epoch 2, which has {rows} micro-batches"):
        fresh.load_state_dict({**good, "micro": 10**6})
    with pytest.raises(ValueError, match=rf"micro 1000000 is outside epoch 2.*0\.\.{rows}"):
        s.state_dict(micro=10**6)
    with pytest.raises(ValueError, match="'num_replicas' must be an int >= 1, got 0"):
        fresh.load_state_dict({**good, "num_replicas": 0})
    with pytest.raises(ValueError, match="saved over other sizes"):
        ScheduledBatchSampler(np.arange(1, 41), sched, micro_batch_size=2, num_replicas=2, rank=0).load_state_dict(good)
    fresh.load_state_dict(good)  # the genuine state still loads, on a sampler that derives epoch 2 itself
    assert list(fresh) == list(s)[1:]


# ---------------------------------------------------------------- accumulator


def token_data(n=14, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (n,), generator=gen)
    return [torch.randint(0, W.VOCAB, (int(k),), generator=gen) for k in lengths]


def big_batch_grads(items, normalize="tokens"):
    model = W.make_model()
    loss = W.loss_sum(model, items, normalize) / (sum(len(x) for x in items) if normalize == "tokens" else len(items))
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("normalize", ["tokens", "samples"])
def test_accumulated_gradient_equals_big_batch(normalize):
    items = token_data()
    sizes = [len(x) for x in items]
    model = W.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    acc = GradientAccumulator(model, opt, lr_rule="none", normalize=normalize)
    sampler = ScheduledBatchSampler(sizes, 14, micro_batch_size=3, rounding="uneven", seed=1)
    pairs = list(sampler.with_info())
    assert len({sum(sizes[i] for i in b) for b, _ in pairs}) > 1  # micro-batches of unequal tokens
    assert [acc.backward(W.loss_sum(model, [items[i] for i in b], normalize), info) for b, info in pairs][-1]
    for got, want in zip([p.grad for p in model.parameters()], big_batch_grads(items, normalize), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def info(step=0, micro=0, n_micro=1, samples=8, units=40.0, world=1):
    return MicroBatchInfo(epoch=0, step=step, micro=micro, n_micro=n_micro, samples=samples, units=units / n_micro,
                          step_samples=samples, step_units=units, scheduled=samples, world=world)


@pytest.mark.parametrize("rule, expect", [("linear", 0.1 * 32 / 8), ("sqrt", 0.1 * math.sqrt(32 / 8)), ("none", 0.1)])
def test_lr_rule_for_one_step_then_restored(rule, expect):
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    seen = []
    original = opt.step

    def spy(*a, **k):
        seen.append(opt.param_groups[0]["lr"])
        return original(*a, **k)

    opt.step = spy
    acc = GradientAccumulator(net, opt, lr_rule=rule, reference=None if rule == "none" else 8, normalize="samples")
    x = torch.ones(1, 2)
    assert acc.backward(net(x).sum(), info(samples=32)) is True
    assert seen == [pytest.approx(expect)] and acc.last_lrs == [pytest.approx(expect)]
    assert opt.param_groups[0]["lr"] == 0.1


def test_outer_scheduler_keeps_working_and_one_line_linear_rule():
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    outer = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    # the seed's LinearRuleOptimizer(optimizer, ref_batchsize=256), in one line:
    acc = GradientAccumulator(net, opt, lr_rule="linear", reference=256, normalize="samples")
    lrs = []
    for step, size in enumerate([256, 512, 1024]):
        for m in range(2):
            if acc.backward(net(torch.ones(1, 2)).sum(), info(step=step, micro=m, n_micro=2, samples=size)):
                lrs.append(acc.last_lrs[0])
        outer.step()
    assert lrs == [1.0, 0.5 * 2, 0.25 * 4]
    assert opt.param_groups[0]["lr"] == 0.125


def test_grad_scaler_and_clipping():
    items = token_data(8, seed=3)
    sizes = [len(x) for x in items]
    model = W.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    acc = GradientAccumulator(model, opt, lr_rule="none", scaler=scaler, clip_grad_norm=1e9)
    for b, inf in ScheduledBatchSampler(sizes, 8, micro_batch_size=3, rounding="uneven").with_info():
        acc.backward(W.loss_sum(model, [items[i] for i in b], "tokens"), inf)
    # clip_grad_norm unscaled the gradients before the step
    for got, want in zip([p.grad for p in model.parameters()], big_batch_grads(items), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    state = acc.state_dict()
    assert state["scaler"]["scale"] == scaler.get_scale()
    again = GradientAccumulator(model, opt, lr_rule="none", scaler=torch.amp.GradScaler("cpu"))
    frozen = copy.deepcopy(state)
    again.load_state_dict(state)
    assert state == frozen and again.steps == 1 and again.scaler.get_scale() == scaler.get_scale()


def test_accumulator_checks_order_state_and_options():
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    acc = GradientAccumulator(net, opt, reference=8)
    x = torch.ones(1, 2)
    assert acc.backward(net(x).sum(), info(micro=0, n_micro=3)) is False
    with pytest.raises(RuntimeError, match="checkpoint at a step boundary"):
        acc.state_dict()
    with pytest.raises(RuntimeError, match="micro-batch 2 of step 0 arrived, expected micro-batch 1"):
        acc.backward(net(x).sum(), info(micro=2, n_micro=3))
    with pytest.raises(RuntimeError, match="step 0 was left after 1 micro-batches"):
        acc.backward(net(x).sum(), info(step=1))
    fresh = GradientAccumulator(net, opt, reference=8)
    with pytest.raises(RuntimeError, match="expected micro-batch 0 of step None"):
        fresh.backward(net(x).sum(), info(micro=1, n_micro=2))
    with pytest.raises(ValueError, match="plans for 2 ranks but torch.distributed has 1"):
        fresh.backward(net(x).sum(), info(world=2))
    with pytest.raises(ValueError, match="no real units"):
        GradientAccumulator(net, opt, reference=8).backward(net(x).sum(), info(units=0.0))
    with pytest.raises(ValueError, match="needs reference="):
        GradientAccumulator(net, opt)
    with pytest.raises(ValueError, match="unknown lr_rule 'cosine'"):
        GradientAccumulator(net, opt, lr_rule="cosine", reference=1)
    good = GradientAccumulator(net, opt, reference=8).state_dict()
    for bad, match in (
        ({**good, "x": 1}, "unknown accumulator state keys"),
        ({**good, "version": 2}, "unsupported accumulator state version"),
        ({**good, "config": {**good["config"], "reference": 9.0}}, "saved with"),
    ):
        with pytest.raises(ValueError, match=match):
            GradientAccumulator(net, opt, reference=8).load_state_dict(bad)


# ---------------------------------------------------------------- gloo


def run_gloo(tmp_path, world, sizes_trace, normalize):
    trace = tmp_path / "trace.csv"
    trace.write_text("step,batchsize\r\n" + "".join(f" {k}, {v}\r\n" for k, v in enumerate(sizes_trace)))
    init_file = tmp_path / "init"
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    run_processes(
        [[sys.executable, str(WORKER), str(r), str(world), str(init_file), str(outs[r]), str(trace), normalize] for r in range(world)],
        timeout=100,
    )
    return [torch.load(o) for o in outs], trace


def reference_run(steps, normalize):
    """Single process, one big batch per step, mean loss per unit, the same LR rule."""
    data = W.make_data()
    model = W.make_model()
    grad0 = None
    for k, (idx, factor) in enumerate(steps):
        model.zero_grad(set_to_none=True)
        items = [data[i] for i in idx]
        total = sum(len(x) for x in items) if normalize == "tokens" else len(items)
        (W.loss_sum(model, items, normalize) / total).backward()
        if grad0 is None:
            grad0 = [p.grad.clone() for p in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                p -= W.LR * W.DECAY**k * factor * p.grad
    return grad0, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "world, trace, normalize",
    [(2, [8, 13, 16, 6, 20], "tokens"), (3, [24, 20, 12, 16, 8], "samples")],
)
def test_gloo_ddp_follows_trace(tmp_path, world, trace, normalize):
    results, _ = run_gloo(tmp_path, world, trace, normalize)
    logs = [r["log"] for r in results]
    # equal micro-batch counts, identical step metadata and LRs on every rank
    assert len({len(lg["micro"]) for lg in logs}) == 1
    assert all(lg["steps"] == logs[0]["steps"] for lg in logs)
    per_step: dict[int, list[int]] = defaultdict(list)
    for lg in logs:
        for m in lg["micro"]:
            per_step[m["step"]].extend(m["batch"])
    sizes = W.sizes()
    epoch_of = {m["step"]: m["epoch"] for m in logs[0]["micro"]}
    last_of_epoch = {e: max(s for s, ee in epoch_of.items() if ee == e) for e in set(epoch_of.values())}
    steps, seen = [], defaultdict(list)
    for rec in logs[0]["steps"]:
        k = rec["step"]
        idx = per_step[k]
        seen[epoch_of[k]].extend(idx)
        assert rec["samples"] == len(idx) and rec["units"] == sum(sizes[i] for i in idx)
        if k != last_of_epoch[epoch_of[k]]:
            assert len(idx) == trace[k % len(trace)]  # exactly the traced size (cycled trace)
        basis = rec["units"] if normalize == "tokens" else rec["samples"]
        factor = basis / W.REFERENCE
        assert rec["lrs"] == [pytest.approx(W.LR * W.DECAY**k * factor)]
        steps.append((idx, factor))
    assert any(trace[k % len(trace)] % world for k in per_step)  # some size does not divide by world
    for idx in seen.values():
        assert sorted(idx) == list(range(W.N_SAMPLES))
    grad0, params = reference_run(steps, normalize)
    for res in results:
        for got, want in zip(res["log"]["grad0"], grad0, strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        for name, want in params.items():
            torch.testing.assert_close(res["straight"][name], want, atol=1e-5, rtol=0)
            assert torch.equal(res["straight"][name], results[0]["straight"][name])
            torch.testing.assert_close(res["resumed"][name], res["straight"][name], atol=0, rtol=0)


def test_too_few_samples_for_the_ranks_names_a_way_out_it_takes():
    """The budget samplers' message named ``policy='drop'``, a keyword this sampler has not."""
    with pytest.raises(ValueError, match=r"each of 4 ranks; use fewer ranks, a smaller micro_batch_size") as err:
        ScheduledBatchSampler([5, 5, 5], 100, micro_batch_size="100", num_replicas=4, rank=0)
    assert "policy" not in str(err.value)


def test_a_finite_schedule_that_error_on_exhaustion_needs_no_step_for_dropped_samples():
    """drop_last drops what the schedule's steps do not hold: no step past its end is asked for
    (it raised); without drop_last the last samples need one, and that still raises."""
    from fitbatch.schedule import BatchSizeSchedule

    sched = BatchSizeSchedule.from_list([4, 4], on_exhausted="error")
    s = ScheduledBatchSampler(10, sched, micro_batch_size=2, drop_last=True, shuffle=False)
    assert s.num_steps() == 2 and s.plan().stats().dropped == 2
    with pytest.raises(ValueError, match="step 2 was asked for"):
        ScheduledBatchSampler(10, sched, micro_batch_size=2, drop_last=False, shuffle=False)
