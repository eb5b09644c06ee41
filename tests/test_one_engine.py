"""One epoch engine (#36): ``BudgetBatchSampler(window=...)`` is one class, every option works at
every window size, and the defects the second engine had are gone (each test below failed on it).

An unwindowed epoch is one window of the engine; the plans it makes are those the golden files,
the plan-hash tests and ``bench/_sampler_hashes.py`` pin (unchanged batch for batch).
"""

from __future__ import annotations

import numpy as np
import pytest

import fitbatch
from fitbatch import BudgetBatchSampler


def ranks(sizes, budget, world, **kw):
    return [BudgetBatchSampler(sizes, budget, num_replicas=world, rank=r, census="local", **kw) for r in range(world)]


def run(samplers):
    lens = [len(s) for s in samplers]
    runs = [list(s) for s in samplers]
    return lens, runs


def flat(runs):
    return sorted(i for r in runs for b in r for i in b)


# ---------------------------------------------------------------- the defects of the windowed engine


def test_a_last_window_that_cannot_be_split_joins_the_one_before():
    """It raised TooFewSamples at the second step, after len() had said 3."""
    sizes = [5, 8, 5, 3, 8, 3]
    lens, runs = run(ranks(sizes, 10, 2, window=4, block=1, cost="sum", strategy="sequential"))
    assert lens == [len(r) for r in runs] == [3, 3]
    assert flat(runs) == list(range(6)) and all(sum(sizes[i] for i in b) <= 10 for r in runs for b in r)


def test_a_resume_on_more_ranks_carries_a_rest_it_cannot_split_into_the_next_window():
    """1 -> 2 ranks at step 7 of [6] * 21 (one sample a batch): the window's last batch could not be split."""
    sizes, kw = [6] * 21, {"window": 8, "block": 1, "cost": "sum", "strategy": "sequential"}
    (alone,) = ranks(sizes, 10, 1, **kw)
    done = list(alone)[:7]
    state = alone.state_dict(step=7)
    resumed = ranks(sizes, 10, 2, **kw)
    for s in resumed:
        s.load_state_dict(state)
    lens, runs = run(resumed)
    assert lens == [len(r) for r in runs] == [7, 7]
    assert flat([done, *runs]) == list(range(21))
    # a state saved in the joined window resumes there
    later = resumed[0].state_dict(step=10)
    again = ranks(sizes, 10, 2, **kw)
    for s in again:
        s.load_state_dict(later)
    assert [list(s) for s in again] == [r[3:] for r in runs]


@pytest.mark.parametrize("seed, world, policy", [(17, 4, "split"), (24, 4, "drop"), (29, 4, "drop")])
def test_a_lone_oversized_batch_handed_on_is_not_planned_again(seed, world, policy):
    """oversized="single": a handed-on batch of one sample over the budget was re-planned as if the
    budget had dropped, so len() and the steps run disagreed (and "drop" lost samples mid-epoch)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 8, int(rng.integers(30, 60))).tolist()
    sizes = [15 if rng.random() < 0.2 else x for x in sizes]
    samplers = ranks(sizes, 10, world, window=8, block=1, cost="sum", strategy="sequential", oversized="single", policy=policy)
    lens, runs = run(samplers)
    assert lens == [len(r) for r in runs]
    dropped = samplers[0].plan().dropped
    assert flat(runs) + sorted(dropped.tolist()) == sorted(range(len(sizes))) or policy == "drop"
    assert sorted(flat(runs) + dropped.tolist()) == list(range(len(sizes)))


@pytest.mark.parametrize("field, delta", [("window", 1), ("window_step", 1), ("carry", 1), ("window_step", -1)])
def test_an_edited_window_field_is_refused(field, delta):
    sizes = np.random.default_rng(0).integers(1, 60, 400)
    (sampler,) = ranks(sizes, 150, 1, window=64, block=8, cost="sum")
    steps = len(list(sampler))
    state = sampler.state_dict(step=steps // 2)
    assert state["window"] > 0 and state["carry"] >= 0
    edited = {**state, field: max(0, state[field] + delta)}
    if edited == state:
        edited[field] += 2
    with pytest.raises(ValueError, match="window fields .* contradict"):
        ranks(sizes, 150, 1, window=64, block=8, cost="sum")[0].load_state_dict(edited)


def test_several_limits_are_screened_for_oversized_samples_when_built():
    """It failed 142 batches into the epoch, at the window that held the sample."""
    n = 3000
    sizes = {"tokens": [10] * n, "images": [1] * (n - 1) + [9]}
    with pytest.raises(ValueError, match=r"index 2999"):
        BudgetBatchSampler(sizes, {"tokens": 100, "images": 4}, cost={"images": "sum"}, window=64, num_replicas=1, rank=0)


def test_an_untrusted_index_is_checked_and_a_negative_size_refused(tmp_path):
    index = fitbatch.SizeIndex.create(tmp_path / "idx", [np.array([3, 5, 2, 7] * 10, np.int32)])
    column = np.load(tmp_path / "idx" / index.stats["file"], mmap_mode="r+")
    column[5] = -1  # damaged on disk
    column.flush()
    del column
    with pytest.raises(ValueError, match="non-negative"):
        BudgetBatchSampler(fitbatch.SizeIndex.open(tmp_path / "idx", trust=False), 20, window=8, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="non-negative"):
        BudgetBatchSampler(fitbatch.SizeIndex.open(tmp_path / "idx", trust=False), 20, num_replicas=1, rank=0).plan()


def test_loss_sizes_as_an_array_with_windows():
    """It failed with numpy's "truth value of an array is ambiguous"."""
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 60, 500)
    loss = np.minimum(rng.integers(0, 30, 500), sizes)  # never above a sample's size
    samplers = ranks(sizes, 200, 2, window=64, block=8, loss_sizes=loss)
    lens, runs = run(samplers)
    totals = samplers[0].step_totals()
    assert lens == [len(r) for r in runs] and flat(runs) == list(range(500))
    assert totals.loss_units.sum() == loss.sum() and totals.units.sum() == sizes.sum()
    # per step, the loss tokens of the batches all ranks ran
    first = sum(loss[runs[r][0]].sum() for r in range(2))
    assert totals.loss_units[0] == first
    # and it is part of the state's digest
    state = samplers[0].state_dict(step=3)
    with pytest.raises(ValueError, match="sizes_digest"):
        ranks(sizes, 200, 2, window=64, block=8, loss_sizes=np.maximum(loss - 1, 0))[0].load_state_dict(state)


# ---------------------------------------------------------------- one class, every option at every window size


def test_one_class_and_the_deprecated_name():
    sizes = [3, 1, 4, 1, 5, 9, 2, 6]
    sampler = BudgetBatchSampler(sizes, 10, window=4, block=2, num_replicas=1, rank=0)
    assert type(sampler) is BudgetBatchSampler and sampler.window == 4
    assert type(BudgetBatchSampler(sizes, 10, num_replicas=1, rank=0)) is BudgetBatchSampler
    from fitbatch.sampler import WindowedBatchSampler

    with pytest.warns(DeprecationWarning, match=r"0\.3\.0.*BudgetBatchSampler\(sizes, budget, window=\.\.\.\)"):
        old = WindowedBatchSampler(sizes, 10, window=4, block=2, num_replicas=1, rank=0)
    assert isinstance(old, BudgetBatchSampler) and list(old) == list(sampler)
    # a state of one loads into the other
    fresh = BudgetBatchSampler(sizes, 10, window=4, block=2, num_replicas=1, rank=0)
    fresh.load_state_dict(old.state_dict(step=2))
    assert list(fresh) == list(sampler)[2:]


WHOLE = [
    {"drop_last": True},
    {"max_shapes": 3},
    {"budget": [200, 300]},
]


@pytest.mark.parametrize("option", WHOLE, ids=lambda o: next(iter(o)))
@pytest.mark.parametrize("window", [None, 16, 64, 10_000])
def test_options_of_the_whole_epoch_work_at_every_window_size(option, window):
    """drop_last, max_shapes and per-rank budgets mean something of the whole epoch: with them the epoch is one window."""
    sizes = np.random.default_rng(4).integers(1, 60, 300)
    option = dict(option)
    budget = option.pop("budget", 200)
    got = ranks(sizes, budget, 2, window=window, **option)
    want = ranks(sizes, budget, 2, window=None, **option)
    assert run(got) == run(want)
    state = got[0].state_dict(step=2)
    again = ranks(sizes, budget, 2, window=window, **option)
    for s in again:
        s.load_state_dict(state)
    assert [list(s) for s in again] == [r[2:] for r in run(want)[1]]


@pytest.mark.parametrize("oversized", ["single", "skip"])
@pytest.mark.parametrize("window", [16, 64])
def test_oversized_kinds_with_windows(oversized, window):
    sizes = np.random.default_rng(5).integers(1, 60, 300)
    sizes[::37] = 500
    samplers = ranks(sizes, 200, 3, window=window, block=4, cost="sum", oversized=oversized)
    lens, runs = run(samplers)
    assert lens == [len(r) for r in runs] and len(set(lens)) == 1
    skipped = samplers[0].plan().skipped.tolist()
    assert sorted(flat(runs) + skipped) == list(range(300))
    assert (oversized == "skip") == bool(skipped)


def test_a_single_window_is_the_unwindowed_epoch():
    """A window as large as the epoch is the epoch planned whole (identity order, the epoch's seed)."""
    sizes = np.random.default_rng(6).integers(1, 60, 300)
    for world in (1, 3):
        assert run(ranks(sizes, 200, world, window=10_000)) == run(ranks(sizes, 200, world, window=None))
