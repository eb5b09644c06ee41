"""fitbatch.compat.bionemo against bionemo-size-aware-batching (test-only dependency ``compat-test``).

The sampler module of the original is compared side by side on random inputs inside its valid
domain (positive sizes, positive max_total_size); outside it the documented differences are
tested. The installed original (1.0.0) ships no ``memory_model`` module, and CUDA is not
available here: ``PolynomialRegression`` and ``collect_cuda_peak_alloc`` are checked against
the behaviour the seed document describes (a CUDA run is skipped without a GPU).
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import warnings

import numpy as np
import pytest

from fitbatch.compat import bionemo as compat

torch = pytest.importorskip("torch")


def _original():
    return pytest.importorskip(
        "bionemo.size_aware_batching.sampler",
        reason="bionemo-size-aware-batching is not installed (pip install bionemo-size-aware-batching --no-deps)",
    )


def _cases(n_cases: int, seed: int):
    """Random inputs inside the original's domain, oversized items included (both skip them)."""
    rng = np.random.default_rng(seed)
    for case in range(n_cases):
        n = int(rng.integers(0, 80))
        budget = int(rng.integers(1, 100))
        if case % 3 == 2:
            sizes = (rng.random(n) * budget * 0.7 + 1e-3).tolist()
        else:
            sizes = rng.integers(1, max(2, int(budget * 1.3)), size=n).tolist()
        yield case, sizes, budget


def _logs():
    infos: list[str] = []
    warns: list[str] = []
    return infos, warns, infos.append, warns.append


def test_size_aware_batching_same_batches_and_messages_as_the_original():
    orig = _original()
    for case, sizes, budget in _cases(300, 0):
        items = [(i, s) for i, s in enumerate(sizes)]
        i1, w1, info1, warn1 = _logs()
        i2, w2, info2, warn2 = _logs()
        ours = list(compat.size_aware_batching(items, lambda x: x[1], budget, info_logger=info1, warn_logger=warn1))
        theirs = list(orig.size_aware_batching(items, lambda x: x[1], budget, info_logger=info2, warn_logger=warn2))
        assert ours == theirs, f"case {case}"
        assert (i1, w1) == (i2, w2), f"case {case}"


def test_sampler_same_batches_as_the_original():
    orig = _original()
    rng = np.random.default_rng(1)
    for case, sizes, budget in _cases(300, 2):
        order = rng.permutation(len(sizes)).tolist()
        i1, w1, info1, warn1 = _logs()
        i2, w2, info2, warn2 = _logs()
        ours = compat.SizeAwareBatchSampler(order, sizes.__getitem__, budget, info1, warn1)
        theirs = orig.SizeAwareBatchSampler(order, sizes.__getitem__, budget, info2, warn2)
        assert list(ours) == list(theirs), f"case {case}"
        assert (i1, w1) == (i2, w2), f"case {case}"


def test_sampler_has_len_and_works_in_a_dataloader():
    data = [torch.arange(n) for n in (2, 2, 2, 2, 2, 7, 1)]
    sampler = compat.SizeAwareBatchSampler(torch.utils.data.SequentialSampler(data), lambda i: data[i].numel(), 4)
    assert isinstance(sampler, torch.utils.data.Sampler)
    assert len(sampler) == 3 and list(sampler) == [[0, 1], [2, 3], [4, 6]]
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=list)
    assert [len(b) for b in loader] == [2, 2, 2]


def test_generator_is_lazy_over_an_endless_source():
    import itertools

    gen = compat.size_aware_batching(itertools.count(1), lambda x: 1, 3)
    assert list(itertools.islice(gen, 2)) == [[1, 2, 3], [4, 5, 6]]


@pytest.mark.parametrize("bad", [0, -4, math.nan, math.inf, "10", True, None])
def test_non_positive_max_total_size_raises_value_error(bad):
    with pytest.raises(ValueError, match="max_total_size"):
        compat.size_aware_batching([1, 2], lambda x: x, bad)
    with pytest.raises(ValueError, match="max_total_size"):
        compat.SizeAwareBatchSampler([0, 1], lambda i: 1, bad)


def test_original_silently_accepts_a_non_positive_max_total_size():
    orig = _original()
    assert list(orig.size_aware_batching([1, 2], lambda x: x, 0)) == []
    assert list(orig.SizeAwareBatchSampler([0, 1], lambda i: 1, -3)) == []


def test_documented_type_errors():
    with pytest.raises(TypeError, match="sampler"):
        compat.SizeAwareBatchSampler("abc", lambda i: 1, 3)
    with pytest.raises(TypeError, match="sampler"):
        compat.SizeAwareBatchSampler(42, lambda i: 1, 3)
    with pytest.raises(TypeError, match="sizeof"):
        compat.SizeAwareBatchSampler([0, 1], 3, 3)
    with pytest.raises(TypeError, match="sizeof"):
        compat.size_aware_batching([0, 1], 3, 3)  # raised at the call, not at the first next()
    with pytest.raises(TypeError, match="collate_fn"):
        compat.size_aware_batching([0, 1], lambda x: 1, 3, collate_fn=5)


def test_sizeof_may_be_a_dictionary_or_a_sequence_as_documented():
    assert list(compat.SizeAwareBatchSampler(range(4), [2, 2, 3, 1], 4)) == [[0, 1], [2, 3]]
    assert list(compat.SizeAwareBatchSampler(range(3), {0: 3, 1: 3, 2: 1}, 4)) == [[0], [1, 2]]
    assert list(compat.size_aware_batching("abc", {"a": 2, "b": 2, "c": 1}, 3)) == [["a"], ["b", "c"]]


def test_bad_sizes_and_failing_sizeof():
    with pytest.raises(ValueError, match="non-negative"):
        list(compat.size_aware_batching([1, -2, 3], lambda x: x, 5))
    with pytest.raises(ValueError, match=r"sample 1 \(size -2.0\)"):
        list(compat.SizeAwareBatchSampler(range(3), [1, -2, 3], 5))
    with pytest.raises(RuntimeError, match="sizeof raises error at data=2"):
        list(compat.size_aware_batching([1, 2], lambda x: 1 / (x - 2), 5))


SAMPLER_EXAMPLE = """
import torch
from fitbatch.compat.bionemo import SizeAwareBatchSampler


# Define a sample dataset with torch.tensor
dataset = [torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6]),
           torch.tensor([7, 8]), torch.tensor([9, 10])]


# Define a function that returns the size of each element in the dataset.
def sizeof(index):
    return dataset[index].numel()


# Create a SizeAwareBatchSampler with a maximum total batch size of 10.
batch_sampler = SizeAwareBatchSampler(
    sampler=torch.utils.data.SequentialSampler(dataset),
    sizeof=sizeof,
    max_total_size=4
)


# Iterate over batches of indices that do not exceed the maximum total size.
print(list(batch_sampler))
"""

GENERATOR_EXAMPLE = """
import torch
from torch.utils.data import default_collate
from fitbatch.compat.bionemo import size_aware_batching

# Define a sample dataset with torch.tensor
dataset = [torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([5, 6]),
           torch.tensor([7, 8]), torch.tensor([9, 10])]

# Define a sizeof function that returns the size of each tensor
def sizeof(x):
    return x.numel()

# Create a generator with max_total_size=4 and default_collate_fn
gen = size_aware_batching(dataset, sizeof, 4, collate_fn=default_collate)
batches = list(gen)
print(batches)
"""


def _run(source: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "bionemo-readme", "exec"), {})
    return out.getvalue()


def test_seed_document_sampler_example():
    assert _run(SAMPLER_EXAMPLE) == "[[0, 1], [2, 3], [4]]\n"


def test_seed_document_generator_example():
    # the document prints the tensors on one line: torch's repr wraps them; compare the values
    printed = _run(GENERATOR_EXAMPLE)
    assert " ".join(printed.split()) == "[tensor([[1, 2], [3, 4]]), tensor([[5, 6], [7, 8]]), tensor([[ 9, 10]])]"


def test_collect_cuda_peak_alloc_refuses_a_non_cuda_device():
    with pytest.raises(ValueError, match="CUDA devices only"):
        compat.collect_cuda_peak_alloc([1, 2], lambda x: x, torch.device("cpu"))
    with pytest.raises(ValueError, match="CUDA devices only"):
        compat.collect_cuda_peak_alloc([1, 2], lambda x: x, "meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_collect_cuda_peak_alloc_measures_like_the_original():  # pragma: no cover - GPU only
    utils = pytest.importorskip("bionemo.size_aware_batching.utils")
    device = torch.device("cuda:0")

    def work(n):
        x = torch.empty(n * 1024, dtype=torch.float32, device=device)
        return x.numel()

    items = [1, 64, 256, 1024]
    feats, peaks = compat.collect_cuda_peak_alloc(items, work, device)
    feats0, peaks0 = utils.collect_cuda_peak_alloc(items, work, device)
    assert feats == feats0
    assert np.allclose(peaks, peaks0, rtol=0.05, atol=1 << 20)


def test_polynomial_regression_is_a_module_fit_and_forward():
    pr = compat.PolynomialRegression(2)
    assert isinstance(pr, torch.nn.Module)
    x = torch.arange(1.0, 30.0)
    y = 100 + 3 * x + 0.5 * x**2
    pr.fit(x, y)
    assert torch.allclose(pr(torch.tensor([10.0, 40.0])), torch.tensor([180.0, 1020.0], dtype=torch.float64))
    state = pr.state_dict()
    assert "coef" in state
    clone = compat.PolynomialRegression(2)
    clone.load_state_dict(state)
    assert torch.allclose(clone(x), pr(x))
    # planning with it: a cost model of the fitted polynomial
    assert pr.to_cost_model().predict([10.0], upper=False).round(6).tolist() == [180.0]


@pytest.mark.parametrize("degree", [-1, 1.5, "2", None])
def test_polynomial_regression_degree_value_error(degree):
    with pytest.raises(ValueError, match="degree"):
        compat.PolynomialRegression(degree)


def test_polynomial_regression_fit_documented_errors():
    pr = compat.PolynomialRegression(1)
    x = torch.arange(1.0, 6.0)
    with pytest.raises(TypeError, match="1D tensor"):
        pr.fit(x.reshape(1, -1), x)
    with pytest.raises(TypeError, match="1D tensor"):
        pr.fit([1.0, 2.0], x)
    with pytest.raises(ValueError, match="same number"):
        pr.fit(x, x[:3])
    with pytest.raises(TypeError, match="floating point"):
        pr.fit(torch.arange(1, 6), x)



def _original_utils():
    return pytest.importorskip("bionemo.size_aware_batching.utils", reason="bionemo-size-aware-batching is not installed")


def _bucket_cases(n_cases: int, seed: int):
    """Random sizes (ints and floats), boundaries, base samplers and generator seeds."""
    rng = np.random.default_rng(seed)
    for case in range(n_cases):
        n = int(rng.integers(1, 50))
        sizes = torch.tensor(rng.integers(0, 40, n))
        if case % 3 == 2:
            sizes = sizes + torch.rand(n, generator=torch.Generator().manual_seed(case))
        k = int(rng.integers(1, 5))
        bounds = torch.tensor(sorted(rng.choice(np.arange(-5, 45), k + 1, replace=False).tolist()))
        yield case, sizes, bounds, k, bool(case % 2), int(rng.integers(0, 10**6)), rng


def test_bucket_batch_sampler_same_batches_as_the_original():
    orig = _original()
    checked = 0
    for case, sizes, bounds, k, shuffle, seed, rng in _bucket_cases(120, 3):
        if case % 2:
            base = {"base_batch_sampler_class": torch.utils.data.BatchSampler,
                    "base_batch_sampler_shared_kwargs": {"drop_last": case % 4 == 1},
                    "base_batch_sampler_individual_kwargs": {"batch_size": rng.integers(1, 6, k).tolist()}}
            ours_base = base
        else:
            costs = (sizes.double() + 1).tolist()
            base = {"base_batch_sampler_class": orig.SizeAwareBatchSampler,
                    "base_batch_sampler_shared_kwargs": {"sizeof": costs.__getitem__},
                    "base_batch_sampler_individual_kwargs": {"max_total_size": rng.integers(1, 60, k).tolist()}}
            ours_base = {**base, "base_batch_sampler_class": compat.SizeAwareBatchSampler}

        def make(module, kwargs, sizes=sizes, bounds=bounds, shuffle=shuffle, seed=seed):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return module.BucketBatchSampler(sizes, bounds, shuffle=shuffle, generator=torch.Generator().manual_seed(seed), **kwargs)

        try:
            theirs = make(orig, base)
        except (RuntimeError, ValueError) as error:  # no element in a bucket: both refuse alike
            with pytest.raises(type(error), match=re.escape(str(error)[:40])):
                make(compat, ours_base)
            continue
        ours = make(compat, ours_base)
        assert ours.bucket_element_indices == theirs.bucket_element_indices, f"case {case}"
        assert torch.equal(ours.bucket_sizes, theirs.bucket_sizes) and ours.num_samples == theirs.num_samples
        for _ in range(3):
            batches = list(theirs)
            assert len(ours) == len(batches), f"case {case}"  # len() draws the iteration that follows
            assert list(ours) == batches, f"case {case}"
        assert ours.plan().n_samples == sum(len(b) for b in list(ours))
        checked += 1
    assert checked > 80


def test_create_buckets_same_as_the_original():
    utils = _original_utils()
    rng = np.random.default_rng(4)
    for case in range(600):
        sizes = torch.tensor(rng.integers(0, int(rng.integers(1, 200)), int(rng.integers(1, 80))))
        if case % 4 == 3:
            sizes = sizes.to(torch.int32)
        width, count = int(rng.integers(1, 30)), int(rng.integers(1, 30))
        ours, theirs = compat.create_buckets(sizes, width, count), utils.create_buckets(sizes, width, count)
        assert torch.equal(ours.bucket_boundaries, theirs.bucket_boundaries), f"case {case}"
        assert torch.equal(ours.bucket_sizes, theirs.bucket_sizes), f"case {case}"
        assert ours.bucket_sizes.dtype == theirs.bucket_sizes.dtype == torch.int64


class _MapStyle(torch.utils.data.Dataset):
    """Only __len__ and __getitem__: a for loop reads it through the sequence protocol."""

    def __init__(self, values):
        self.values = values

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        return self.values[i]


def test_map_style_dataset_read_like_the_original():
    data = _MapStyle([3, 9, 4, 1, 12, 2, 2])
    ours = list(compat.size_aware_batching(data, lambda x: x, 8))
    assert ours == list(compat.size_aware_batching(list(data.values), lambda x: x, 8)) == [[3, 4, 1], [2, 2]]
    with contextlib.suppress(pytest.skip.Exception):
        assert ours == list(_original().size_aware_batching(data, lambda x: x, 8))


def test_validation_order_and_messages_of_the_original():
    sampler = torch.utils.data.SequentialSampler(range(3))
    with pytest.raises(ValueError, match="max_total_size should be int or float"):
        compat.SizeAwareBatchSampler(sampler, -1, {})  # the budget is checked before sizeof
    with pytest.raises(TypeError, match="'>' not supported between instances of 'str' and 'int'"):
        list(compat.SizeAwareBatchSampler(sampler, str, 1))
    with pytest.raises(TypeError, match="sizeof must be a callable"):
        compat.SizeAwareBatchSampler(sampler, " invalid", 0)  # sizeof before the positive budget
    with contextlib.suppress(pytest.skip.Exception):
        orig = _original()
        for args in [(sampler, -1, {}), (sampler, " invalid", 0)]:
            with pytest.raises(Exception) as theirs:
                orig.SizeAwareBatchSampler(*args)
            with pytest.raises(theirs.type):
                compat.SizeAwareBatchSampler(*args)


def test_bucket_batch_sampler_plan_and_len_are_the_next_iteration():
    sizes = torch.arange(30)
    sampler = compat.BucketBatchSampler(
        sizes, torch.tensor([0, 10, 20, 30]), compat.SizeAwareBatchSampler,
        {"sizeof": lambda i: i + 1}, {"max_total_size": [12, 40, 60]}, generator=torch.Generator().manual_seed(0),
    )
    n, plan = len(sampler), sampler.plan()
    batches = list(sampler)
    assert n == len(plan) == len(batches)
    assert sorted(i for b in batches for i in b) == list(range(30))
    assert plan.costs.tolist() == [float(sum(i for i in b)) for b in batches]  # sum of sizes
