"""fitbatch.compat.equibatch against equibatch itself (test-only dependency ``compat-test``).

Inside the original's valid domain (positive footprints, max_size >= 1, non-empty input) the
batches are identical; outside it the documented differences are tested. Without equibatch
installed, the differential tests are skipped and the seed document's example still runs.
"""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest

from fitbatch.compat.equibatch import EquiarealBatchSampler


def _original():
    return pytest.importorskip("equibatch", reason="equibatch is not installed (pip install equibatch)")


def _cases(n_cases: int, seed: int):
    """Random inputs inside the original's domain: positive sizes, limits >= 1."""
    rng = np.random.default_rng(seed)
    for case in range(n_cases):
        n = int(rng.integers(1, 60))
        integral = case % 3 != 2
        if integral:
            sizes = rng.integers(1, 40, size=n).tolist()
        else:
            sizes = (rng.random(n) * 40 + 1e-3).tolist()
        max_footprint = float(rng.integers(1, 120)) if integral else float(rng.random() * 120 + 0.5)
        max_size = int(rng.integers(1, 12))
        order = rng.permutation(n).tolist() if case % 2 else list(range(n))
        yield case, sizes, order, max_size, max_footprint


def test_same_batches_as_the_original_on_random_inputs():
    eq = _original()
    for case, sizes, order, max_size, budget in _cases(400, 0):
        ours = EquiarealBatchSampler(order, sizes.__getitem__, max_size, budget)
        theirs = eq.EquiarealBatchSampler(order, sizes.__getitem__, max_size, budget)
        expected = [b for b in iter(theirs)]  # list() would ask the original for len() and crash
        assert list(ours) == expected, f"case {case}"
        assert len(ours) == len(expected), f"case {case}"


def test_oversized_samples_get_a_batch_of_their_own_like_the_original():
    eq = _original()
    sizes = [3, 50, 4, 60, 70, 2]
    args = (range(len(sizes)), sizes.__getitem__, 10, 20)
    assert list(EquiarealBatchSampler(*args)) == list(iter(eq.EquiarealBatchSampler(*args)))
    assert list(EquiarealBatchSampler(*args)) == [[0], [1], [2], [3], [4], [5]]


def test_original_len_crashes_with_torch_ours_works():
    eq = _original()
    pytest.importorskip("torch")
    theirs = eq.EquiarealBatchSampler(range(3), lambda i: 1, 2, 10)
    with pytest.raises(AttributeError):
        len(theirs)
    with pytest.raises(AttributeError):
        list(theirs)
    ours = EquiarealBatchSampler(range(3), lambda i: 1, 2, 10)
    assert len(ours) == 2 and list(ours) == [[0, 1], [2]]


def test_dataloader_batches_like_the_sampler():
    torch = pytest.importorskip("torch")
    data = [torch.full((n,), n) for n in (3, 1, 4, 1, 5, 9, 2, 6)]
    sampler = EquiarealBatchSampler(range(len(data)), lambda i: len(data[i]), 3, 10)
    assert isinstance(sampler, torch.utils.data.BatchSampler)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=list)
    assert len(loader) == len(sampler) == 4
    assert [[int(t[0]) for t in b] for b in loader] == [[3, 1, 4], [1, 5], [9], [2, 6]]


def test_len_and_the_next_iteration_agree_for_a_random_sampler():
    torch = pytest.importorskip("torch")
    sizes = np.random.default_rng(1).integers(1, 30, size=200).tolist()
    gen = torch.Generator().manual_seed(0)
    sampler = EquiarealBatchSampler(torch.utils.data.RandomSampler(range(200), generator=gen), sizes.__getitem__, 8, 60)
    for _ in range(5):
        n = len(sampler)
        batches = list(sampler)
        assert len(batches) == n
        assert sorted(i for b in batches for i in b) == list(range(200))


def test_differences_outside_the_original_domain():
    eq = _original()
    # empty input: the original yields one empty batch
    assert list(iter(eq.EquiarealBatchSampler([], len, 3, 10))) == [[]]
    assert list(EquiarealBatchSampler([], len, 3, 10)) == [] and len(EquiarealBatchSampler([], len, 3, 10)) == 0
    # zero footprints: the original never closes the batch, ignoring max_size
    zeros = [0, 0, 0, 0, 0]
    assert list(iter(eq.EquiarealBatchSampler(range(5), zeros.__getitem__, 2, 10))) == [[0, 1, 2, 3, 4]]
    assert list(EquiarealBatchSampler(range(5), zeros.__getitem__, 2, 10)) == [[0, 1], [2, 3], [4]]
    # negative and NaN footprints: the original batches them; ours names the sample
    bad = [3, -2, 1, math.nan]
    assert list(iter(eq.EquiarealBatchSampler(range(4), bad.__getitem__, 5, 10))) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match=r"len_checker .* 2 bad: sample 1 \(size -2.0\), sample 3"):
        list(EquiarealBatchSampler(range(4), bad.__getitem__, 5, 10))


@pytest.mark.parametrize(
    ("max_size", "max_footprint", "error"),
    [(0, 10, ValueError), (-1, 10, ValueError), (2.5, 10, TypeError), ("3", 10, TypeError),
     (3, 0, ValueError), (3, -5, ValueError), (3, math.nan, ValueError), (3, None, TypeError)],
)
def test_limits_are_validated(max_size, max_footprint, error):
    with pytest.raises(error, match="max_size|max_footprint"):
        EquiarealBatchSampler(range(3), lambda i: 1, max_size, max_footprint)


def test_no_count_limit():
    for cap in (None, math.inf):
        assert list(EquiarealBatchSampler(range(6), lambda i: 1, cap, 4)) == [[0, 1, 2, 3], [4, 5]]
    assert list(EquiarealBatchSampler(range(3), lambda i: 1, 2.0, 10)) == [[0, 1], [2]]


def test_non_int_indices_are_passed_through():
    lengths = {"a": 3, "bb": 5, "c": 2}
    assert list(EquiarealBatchSampler(["a", "bb", "c"], lengths.__getitem__, 5, 8)) == [["a", "bb"], ["c"]]


def test_wrong_argument_types():
    with pytest.raises(TypeError, match="sampler"):
        EquiarealBatchSampler(5, len, 3, 10)
    with pytest.raises(TypeError, match="len_checker"):
        EquiarealBatchSampler(range(3), 7, 3, 10)
    with pytest.raises(TypeError, match="real numbers"):
        list(EquiarealBatchSampler(range(2), lambda i: "x", 3, 10))


SEED_EXAMPLE = """
from fitbatch.compat.equibatch import EquiarealBatchSampler

data = [
    'London',
    'Birmingham',
    'Glasgow',
    'Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch',
    'Liverpool',
    'Bristol',
    'Manchester'
]

batch_sampler = EquiarealBatchSampler(
    sampler = range(len(data)), # the order in which the dataset is traversed
    len_checker = lambda ix: len(data[ix]), # definition of "footprint of a sample"
    max_size = 10, # maximum number of samples in a batch
    max_footprint = 60 # maximum cumulative footprint of a batch
    )

for batch in batch_sampler:
    sample = [data[ix] for ix in batch]
    print(sample)
"""

SEED_PRINTOUT = """\
['London', 'Birmingham', 'Glasgow']
['Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch']
['Liverpool', 'Bristol', 'Manchester']
"""


def test_seed_document_example_prints_what_the_document_prints():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(SEED_EXAMPLE, "equibatch-readme", "exec"), {})
    assert out.getvalue() == SEED_PRINTOUT


def test_seed_document_dataloader_example():
    torch = pytest.importorskip("torch")
    ns: dict = {}
    exec(compile(SEED_EXAMPLE, "equibatch-readme", "exec"), ns)
    dataloader = torch.utils.data.DataLoader(dataset=ns["data"], batch_sampler=ns["batch_sampler"])
    assert [list(b) for b in dataloader] == [[ns["data"][i] for i in b] for b in [[0, 1, 2], [3], [4, 5, 6]]]
