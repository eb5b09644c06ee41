"""fitbatch.resume: the one state schema (its check and envelope) and the resume on a new world."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fitbatch.distributed import arrange
from fitbatch.plan import PlanOptions, lower_bound, plan_with
from fitbatch.resume import (
    DIGEST,
    VERSION_KEY,
    StateSchema,
    Timeline,
    events,
    integer,
    sizes_digest,
)
from fitbatch.sizes import as_sizes

SCHEMA = StateSchema("widget", version=2, required=("epoch", "step"), optional=("history",))


def good(**extra):
    return {"version": 2, "epoch": 1, "step": 5, **extra}


def test_check_accepts_a_state_with_or_without_optional_keys_and_does_not_copy_it():
    state = good()
    assert SCHEMA.check(state) is state
    assert SCHEMA.check(good(history=[[4, 2]])) == good(history=[[4, 2]])


def test_unknown_keys_are_named_with_the_expected_ones():
    with pytest.raises(ValueError, match=r"unknown widget state keys \['cursor'\]; expected \['epoch', 'history', 'step', 'version'\]"):
        SCHEMA.check(good(cursor=3))


def test_missing_keys_are_named_with_the_way_out():
    with pytest.raises(ValueError, match=r"widget state lacks keys \['step'\]; pass what state_dict\(\) returned"):
        SCHEMA.check({"version": 2, "epoch": 1})
    with pytest.raises(ValueError, match=r"lacks keys \['epoch', 'step', 'version'\]"):
        SCHEMA.check({})


def test_wrong_version_is_named_with_the_expected_one():
    with pytest.raises(ValueError, match=r"unsupported widget state version 1; expected 2 \(resume with the fitbatch release"):
        SCHEMA.check(good(version=1))
    with pytest.raises(ValueError, match="unsupported widget state version '2'"):
        SCHEMA.check(good(version="2"))


def test_a_non_mapping_is_a_type_error_naming_the_object():
    for bad in (None, [("version", 2)], "state"):
        with pytest.raises(TypeError, match=f"widget state must be a mapping .*got {type(bad).__name__}"):
            SCHEMA.check(bad)


def test_checks_run_version_then_unknown_then_missing_then_values():
    # the version decides which keys are valid, so another version is named before its keys
    with pytest.raises(ValueError, match="version 9"):
        SCHEMA.check({"version": 9, "extra": 1})
    with pytest.raises(ValueError, match="unknown"):
        SCHEMA.check({"version": 2, "extra": 1})
    with pytest.raises(ValueError, match="lacks"):
        CHECKED.check({"version": 1, "step": -1})


CHECKED = StateSchema(
    "gadget", version=1, required={"step": integer(), "world": integer(1), "digest": DIGEST}, optional={"events": events}
)


def checked(**changes):
    return {"version": 1, "step": 3, "world": 2, "digest": "0" * 32, **changes}


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("step", -1, "an int >= 0"),
        ("step", 1.5, "an int >= 0"),
        ("step", True, "an int >= 0"),
        ("step", "3", "an int >= 0"),
        ("world", 0, "an int >= 1"),
        ("world", 1.7, "an int >= 1"),
        ("world", -2, "an int >= 1"),
        ("digest", "xyz", "a hexadecimal digest of 32 characters"),
        ("events", [[2, -3]], "a list of events"),
        ("events", [{"step": -1, "budget": 5.0}], "a list of events"),
        ("events", [{"step": 1, "budget": 5.0, "num_replicas": 2}], "a list of events"),
        ("events", [{"step": 1, "budget": float("nan")}], "a list of events"),
        ("events", [{"step": 1, "num_replicas": 0}], "a list of events"),
        ("events", [{"step": 1, "cost": "padded"}], "a list of events"),
        ("events", {"step": 1}, "a list of events"),
    ],
)
def test_values_are_checked_per_key_naming_key_value_and_way_out(key, value, expected):
    with pytest.raises(ValueError) as info:
        CHECKED.check(checked(**{key: value}))
    message = str(info.value)
    assert message.startswith(f"gadget state key {key!r} must be {expected}")
    assert repr(value) in message and "pass what state_dict() returned, unchanged" in message


def test_good_values_pass_and_keys_without_a_check_take_anything():
    good_events = [{"step": 0, "budget": 4.5}, {"step": 2, "num_replicas": 3}, {"step": 2, "cost": {"kind": "sum"}}]
    assert CHECKED.check(checked(events=good_events))["events"] == good_events
    assert SCHEMA.check(good(step="anything")) is not None


def test_sizes_digest_is_stable_and_tells_sizes_apart():
    a = np.array([3, 1, 4, 1, 5])
    assert sizes_digest(a) == sizes_digest(a.astype(np.float32)) == sizes_digest(list(a))
    assert DIGEST(sizes_digest(a)) is None
    assert sizes_digest(a) != sizes_digest(a[::-1]) != sizes_digest(a[:4])
    assert sizes_digest(a.reshape(5, 1)) != sizes_digest(a), "the shape is part of the digest"


def test_envelope_puts_the_version_first_and_checks_the_fields():
    state = SCHEMA.envelope(epoch=0, step=3)
    assert list(state) == [VERSION_KEY, "epoch", "step"] and state[VERSION_KEY] == 2
    assert json.loads(json.dumps(state)) == state
    with pytest.raises(ValueError, match="lacks keys"):
        SCHEMA.envelope(epoch=0)
    with pytest.raises(ValueError, match="unknown widget state keys"):
        SCHEMA.envelope(epoch=0, step=3, rank=1)


def test_schema_holds_version_among_the_required_keys():
    assert SCHEMA.required == frozenset({"version", "epoch", "step"})
    assert SCHEMA.optional == frozenset({"history"})


# ---------------------------------------------------------------- Timeline


def _epoch(n=60, seed=3, world=2):
    sizes = as_sizes(np.random.default_rng(seed).integers(1, 9, n))
    opts = PlanOptions.build(16, cost="sum", strategy="pooled", seed=seed)
    steps = arrange(plan_with(sizes, opts), sizes, opts.cost, world, seed=seed, epoch=0)
    return sizes, opts, Timeline.start(steps, opts.cost, opts.budget)


def _ran(timeline, start, stop):
    """The samples of steps start .. stop-1 of a timeline, all ranks."""
    out = []
    for seg, lo, hi in timeline.pieces(start):
        hi = min(hi, stop - seg.first)
        if hi > lo:
            out += seg.steps.consumed_samples(hi).tolist()[len(seg.steps.consumed_samples(lo)) :]
    return out


@pytest.mark.parametrize("changes", [[(3, 3)], [(3, 3), (5, 2)], [(0, 4), (2, 1)], [(6, 2), (4, 3)]])
def test_timeline_changes_keep_every_sample_once(changes):
    sizes, opts, timeline = _epoch()
    for generation, (step, world) in enumerate(changes, 1):
        step = min(step, timeline.total)
        before = timeline
        rest = arrange(timeline.rest_plan(step, sizes), sizes, opts.cost, world, seed=3, epoch=0, purpose=f"g{generation}")
        timeline = timeline.then(step, rest, opts.cost, opts.budget, world_change=True)
        assert timeline.base == step and timeline.world == world
        assert _ran(timeline, 0, step) == _ran(before, 0, step), "the steps before a change stay"
        assert sorted(_ran(timeline, step, timeline.total)) == sorted(before.rest_samples(step).tolist())
    assert sorted(_ran(timeline, 0, timeline.total)) == list(range(len(sizes)))
    samples, _ = timeline.step_totals()
    assert samples.size == timeline.total and int(samples.sum()) == len(sizes)


def test_timeline_rest_plan_carries_the_lower_bound_of_its_samples():
    sizes, opts, timeline = _epoch(n=400)
    step = timeline.total // 2
    rest = timeline.rest_plan(step, sizes)
    alone = sizes.values[rest.order]
    assert rest.lower_bound == lower_bound(opts.cost, opts.budget, float(alone.sum()), rest.n_samples)
    assert rest.lower_bound < timeline.steps.plan.lower_bound
    assert timeline.rest_plan(0, sizes).lower_bound == timeline.steps.plan.lower_bound
    assert timeline.rest_plan(timeline.total, sizes).lower_bound == 0


def test_timeline_rank_plan_runs_the_current_world_from_its_base():
    sizes, opts, timeline = _epoch(n=200)
    assert timeline.rank_plan(1, sizes).to_lists() == timeline.steps.rank_plan(1).to_lists()
    rest = arrange(timeline.rest_plan(4, sizes), sizes, opts.cost, 3, seed=3, epoch=0, purpose="g1")
    moved = timeline.then(4, rest, opts.cost, opts.budget, world_change=True)
    for r in range(3):
        assert moved.rank_plan(r, sizes).to_lists() == rest.rank_plan(r).to_lists()
    # a change that keeps the world: the rank runs the old rows, then the new ones
    again = arrange(moved.rest_plan(6, sizes), sizes, opts.cost, 3, seed=3, epoch=0, purpose="g2")
    later = moved.then(6, again, opts.cost, opts.budget)
    assert later.base == 4
    for r in range(3):
        assert later.rank_plan(r, sizes).to_lists() == rest.rank_plan(r).to_lists()[:2] + again.rank_plan(r).to_lists()
