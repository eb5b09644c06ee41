"""fitbatch.compat.aistore against aistore's DynamicBatchSampler (test-only dependency ``compat-test``).

The original only needs ``data_source.get_obj_list()`` returning objects with ``name`` and
``props_cached.size``, so a small in-memory stand-in of an AIS dataset drives both side by side
(no AIS cluster). Inside the original's valid domain (positive sizes; no oversized sample when
``allow_oversized_samples=True``; no last batch filled exactly to the saturation factor) the
batches are identical; the documented differences outside it are tested.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from fitbatch.compat.aistore import DynamicBatchSampler, object_sizes

torch = pytest.importorskip("torch")


def _original():
    mod = pytest.importorskip(
        "aistore.pytorch.dynamic_sampler",
        reason="aistore is not installed (pip install aistore --no-deps, plus its light dependencies)",
    )
    return mod.DynamicBatchSampler


class FakeAISDataset:
    """What DynamicBatchSampler reads from an AISBaseMapDataset: objects with cached sizes."""

    def __init__(self, sizes):
        self._objs = [SimpleNamespace(name=f"obj-{i}", props_cached=SimpleNamespace(size=s)) for i, s in enumerate(sizes)]

    def get_obj_list(self):
        return self._objs

    def __len__(self):
        return len(self._objs)


def _cases(n_cases: int, seed: int):
    rng = np.random.default_rng(seed)
    for case in range(n_cases):
        n = int(rng.integers(0, 70))
        budget = int(rng.integers(10, 5000))
        oversized = case % 2 == 0
        high = int(budget * 1.4) if oversized else budget
        sizes = rng.integers(1, max(2, high), size=n).tolist()
        if case % 5 == 4:  # fractional sizes and budget
            sizes = (rng.random(n) * high + 0.01).tolist()
        yield case, sizes, budget, oversized, float(rng.random())


def test_same_batches_as_the_original_on_random_inputs():
    Original = _original()
    checked = 0
    for case, sizes, budget, oversized, saturation in _cases(400, 0):
        for drop_last in (False, True):
            for allow in (False, True):
                if allow and oversized and any(s > budget for s in sizes):
                    continue  # outside the domain: tested below
                kwargs = dict(drop_last=drop_last, allow_oversized_samples=allow, saturation_factor=saturation)
                theirs = list(Original(FakeAISDataset(sizes), budget, **kwargs))
                ours = DynamicBatchSampler(FakeAISDataset(sizes), budget, **kwargs)
                assert list(ours) == theirs, f"case {case} {kwargs}"
                assert len(ours) == len(theirs), f"case {case} {kwargs}"
                checked += 1
    assert checked > 1000


def test_a_sizes_sequence_is_a_data_source():
    sizes = [400, 300, 900, 2000, 200]
    assert list(DynamicBatchSampler(sizes, 1000)) == list(DynamicBatchSampler(FakeAISDataset(sizes), 1000))
    assert list(DynamicBatchSampler(np.array(sizes), 1000)) == [[0, 1], [2], [4]]
    assert object_sizes(FakeAISDataset([5, 6])) == [5, 6]
    with pytest.raises(TypeError, match="data_source"):
        DynamicBatchSampler(42, 1000)
    with pytest.raises(TypeError, match="byte sizes"):
        DynamicBatchSampler(["a", "b"], 1000)


def test_len_counts_batches_the_original_counts_samples():
    Original = _original()
    sizes = [400, 300, 900, 100]
    assert len(Original(FakeAISDataset(sizes), 1000)) == 4
    ours = DynamicBatchSampler(FakeAISDataset(sizes), 1000)
    assert len(ours) == len(list(ours)) == 2
    loader = torch.utils.data.DataLoader(list(range(4)), batch_sampler=ours)
    assert len(loader) == 2
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


def test_drop_last_keeps_a_batch_filled_exactly_to_the_saturation_factor():
    Original = _original()
    sizes = [600, 300, 800]  # last batch: 800 of 1000 = exactly 0.8
    assert list(Original(FakeAISDataset(sizes), 1000, drop_last=True)) == [[0, 1]]
    ours = DynamicBatchSampler(FakeAISDataset(sizes), 1000, drop_last=True)
    assert list(ours) == [[0, 1], [2]]
    sizes = [600, 300, 700]  # 0.7: dropped by both, and counted here
    assert list(Original(FakeAISDataset(sizes), 1000, drop_last=True)) == [[0, 1]]
    ours = DynamicBatchSampler(FakeAISDataset(sizes), 1000, drop_last=True)
    assert list(ours) == [[0, 1]]
    assert ours.plan().stats().dropped == 1


def test_oversized_samples_skipped_like_the_original_and_counted():
    Original = _original()
    sizes = [300, 5000, 300, 300]
    assert list(Original(FakeAISDataset(sizes), 1000)) == [[0, 2, 3]]
    ours = DynamicBatchSampler(FakeAISDataset(sizes), 1000)
    assert list(ours) == [[0, 2, 3]]
    assert ours.plan().stats().skipped == 1


def test_allowed_oversized_sample_closes_the_open_batch():
    Original = _original()
    sizes = [300, 5000, 300, 300]
    # the original yields the big one at once and keeps filling the batch open before it
    assert list(Original(FakeAISDataset(sizes), 1000, allow_oversized_samples=True)) == [[1], [0, 2, 3]]
    ours = DynamicBatchSampler(FakeAISDataset(sizes), 1000, allow_oversized_samples=True)
    assert list(ours) == [[0], [1], [2, 3]]


def test_zero_byte_objects_are_batched():
    Original = _original()
    sizes = [0, 500, 0, 600]
    assert list(Original(FakeAISDataset(sizes), 1000)) == [[1], [3]]
    assert list(DynamicBatchSampler(FakeAISDataset(sizes), 1000)) == [[0, 1, 2], [3]]


def test_seedable_shuffle():
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 400, size=300).tolist()
    a = DynamicBatchSampler(sizes, 1000, shuffle=True, seed=7)
    b = DynamicBatchSampler(sizes, 1000, shuffle=True, seed=7)
    first = list(a)
    assert first == list(b)  # the same (seed, epoch): the same batches
    assert sorted(i for batch in first for i in batch) == list(range(300))
    # without set_epoch, as code written for the original runs, each iteration reshuffles (the
    # next epoch), reproducibly; set_epoch takes over from then on
    again = list(a)
    assert again != first and again == list(b)
    a.set_epoch(0)
    assert list(a) == first == list(a)
    a.set_epoch(1)
    assert list(a) == again
    assert list(DynamicBatchSampler(sizes, 1000, shuffle=True, seed=8)) != first
    # the shuffled batches are the original's greedy over the shuffled order
    Original = _original()
    order = [i for batch in first for i in batch]
    theirs = list(Original(FakeAISDataset([sizes[i] for i in order]), 1000))
    assert [[order[p] for p in batch] for batch in theirs] == first


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"max_batch_size": 0}, ValueError), ({"max_batch_size": -1}, ValueError), ({"max_batch_size": math.nan}, ValueError),
     ({"saturation_factor": 1.5}, ValueError), ({"saturation_factor": -0.1}, ValueError),
     ({"drop_last": "yes"}, TypeError), ({"shuffle": 1}, TypeError)],
)
def test_invalid_arguments(kwargs, error):
    args = {"max_batch_size": 1000, **kwargs}
    with pytest.raises(error):
        DynamicBatchSampler([1, 2, 3], **args)


def test_negative_sizes_are_refused():
    with pytest.raises(ValueError, match="non-negative"):
        DynamicBatchSampler(FakeAISDataset([3, -1]), 10)


def test_is_a_torch_sampler():
    assert isinstance(DynamicBatchSampler([1], 10), torch.utils.data.Sampler)
