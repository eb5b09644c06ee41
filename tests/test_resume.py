"""fitbatch._state: the one state schema (its check and envelope) and the resume on a new world."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fitbatch
from fitbatch._state import DIGEST, VERSION_KEY, StateSchema, events, integer, sizes_digest

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
    DIGEST("digest", sizes_digest(a))  # accepted: no error
    with pytest.raises(ValueError, match="digest must be a hexadecimal digest of 32 characters"):
        DIGEST("digest", sizes_digest(a).upper())
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


def test_value_checks_name_the_state_and_key_and_run_after_the_key_checks():
    from fitbatch._validate import non_negative_int

    schema = StateSchema("widget", version=2, required={"epoch": None, "step": non_negative_int})
    good = {"version": 2, "epoch": 0, "step": 3}
    assert schema.check(good) == good
    with pytest.raises(ValueError, match=r"widget state key 'step' must be >= 0, got -1"):
        schema.check({**good, "step": -1})
    with pytest.raises(TypeError, match=r"widget state key 'step' must be an int >= 0, got '5'"):
        schema.check({**good, "step": "5"})
    with pytest.raises(ValueError, match="lacks keys"):  # a missing key is named first
        schema.check({"version": 2, "step": -1})
    assert schema == StateSchema("widget", version=2, required=("epoch", "step"))  # checks are not compared


@pytest.mark.parametrize("make", [
    lambda sizes: fitbatch.BudgetBatchSampler(sizes, 100, num_replicas=1, rank=0, seed=0),
    lambda sizes: fitbatch.BudgetBatchSampler(sizes, 100, window=30, num_replicas=1, rank=0, block=1, census="local", seed=0),
], ids=["global", "windowed"])
def test_the_same_sampler_loads_its_state_again_after_a_budget_change(make):
    """A rollback or a second load of one state into the sampler that saved it: the epoch began
    with the built options (the state's), not the changed ones. The global sampler refused it as
    "another set of planning options"; the windowed one replayed the events on the changed
    options (other batches, samples repeated and lost) and saved a state a fresh one refused."""
    sizes = np.random.default_rng(5).integers(1, 60, 60).tolist()
    s = make(sizes)
    it = iter(s)
    done = [next(it) for _ in range(3)]
    s.set_budget(80)
    done += [next(it) for _ in range(2)]
    ckpt = json.loads(json.dumps(s.state_dict()))
    expected = list(it)
    for _ in range(2):
        s.load_state_dict(ckpt)
        assert list(s) == expected
    assert sorted(i for b in done + expected for i in b) == list(range(len(sizes)))
    again = s.state_dict(step=ckpt["step"])
    assert again["options"]["budget"] == 100.0
    fresh = make(sizes)
    fresh.load_state_dict(again)
    assert list(fresh) == expected
    s.set_epoch(1)  # the next epoch begins with the budget in force: a state of it loads too
    state = json.loads(json.dumps(s.state_dict(step=2)))
    assert state["options"]["budget"] == 80.0
    s.load_state_dict(state)
    assert len(list(s)) == s.n_steps() - 2
