"""fitbatch.resume: the one state schema (its check and envelope) and the resume on a new world."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fitbatch.distributed import arrange
from fitbatch.plan import PlanOptions, plan_with
from fitbatch.resume import VERSION_KEY, StateSchema, continue_epoch
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


def test_checks_run_unknown_then_version_then_missing():
    with pytest.raises(ValueError, match="unknown"):
        SCHEMA.check({"version": 9, "extra": 1})
    with pytest.raises(ValueError, match="version 9"):
        SCHEMA.check({"version": 9})


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


def test_field_checks_name_the_state_and_key_and_run_after_the_key_checks():
    from fitbatch._validate import non_negative_int

    schema = StateSchema("widget", version=2, required=("epoch", "step"), fields={"step": non_negative_int})
    assert schema.check(good()) == good()
    with pytest.raises(ValueError, match=r"widget state 'step' must be >= 0, got -1"):
        schema.check(good(step=-1))
    with pytest.raises(TypeError, match=r"widget state 'step' must be an int >= 0, got '5'"):
        schema.check(good(step="5"))
    with pytest.raises(ValueError, match="lacks keys"):  # a missing key is named first
        schema.check({"version": 2, "step": -1})
    assert schema == StateSchema("widget", version=2, required=("epoch", "step"))  # checks are not compared


# ---------------------------------------------------------------- continue_epoch


def _arrangers(n=60, seed=3):
    sizes = as_sizes(np.random.default_rng(seed).integers(1, 9, n))
    opts = PlanOptions.build(16, cost="sum", strategy="pooled", seed=seed)

    def fresh(world):
        return arrange(plan_with(sizes, opts), sizes, opts.cost, world, seed=seed, epoch=0)

    def rest(plan, world, purpose):
        return arrange(plan, sizes, opts.cost, world, seed=seed, epoch=0, purpose=purpose)

    return sizes, fresh, rest


def _samples(steps, first=0):
    return sorted(steps.plan.select(steps.grid[first:].ravel()).order.tolist()) if steps.n_steps > first else []


@pytest.mark.parametrize("chain, world", [([[2, 3]], 2), ([[2, 3]], 3), ([[4, 1], [3, 2]], 2), ([[4, 1], [3, 2]], 3)])
def test_continue_epoch_runs_every_remaining_sample_exactly_once(chain, world):
    sizes, fresh, rest = _arrangers()
    after = continue_epoch(chain, world, fresh=fresh, rest=rest)
    # the samples consumed before, link by link, plus those left, are every sample once
    consumed, current = [], fresh(chain[0][0])
    for i, (_, done) in enumerate(chain):
        consumed += current.consumed_samples(done).tolist()
        if i + 1 < len(chain):
            current = continue_epoch(chain[: i + 1], chain[i + 1][0], fresh=fresh, rest=rest).steps
    left = _samples(after.steps, after.start)
    assert sorted(consumed + left) == list(range(len(sizes)))
    assert after.rearranged == (len(chain) > 1 or chain[-1][0] != world)
    assert after.history == (chain[:-1] if chain[-1][0] == world else chain)
    assert after.steps.grid.shape[1] == world


def test_continue_epoch_in_the_same_world_is_the_fresh_arrangement_at_the_step():
    _, fresh, rest = _arrangers()
    after = continue_epoch([[2, 4]], 2, fresh=fresh, rest=rest)
    assert (after.start, after.history, after.rearranged) == (4, [], False)
    assert np.array_equal(after.steps.grid, fresh(2).grid)
