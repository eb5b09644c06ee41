"""fitbatch.compat.dpipe against deep-pipe's ``dpipe.batch_iter`` (test-only dependency ``compat-test``).

Combiners and transform wrappers are compared on hundreds of random inputs, pipelines on a few
deterministic sources (batches identical); ``sample`` draws from another generator than dpipe's
by design, so its contract (members only, weights respected, reproducible) is tested instead.
The seed tutorial runs with numpy data instead of MNIST and prints the documented shapes.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import re

import numpy as np
import pytest

from fitbatch.compat import dpipe as compat


def _dpipe():
    return pytest.importorskip("dpipe.batch_iter", reason="deep-pipe is not installed (pip install deep-pipe --no-deps + its light deps)")


def _random_batch(rng: np.random.Generator, same_shape: bool):
    k = int(rng.integers(1, 6))
    ndim = int(rng.integers(1, 4))
    base = rng.integers(1, 6, size=ndim)
    shapes = [base if same_shape else base + rng.integers(0, 4, size=ndim) for _ in range(k)]
    return [(rng.standard_normal(tuple(s)), int(rng.integers(0, 9))) for s in shapes]


def _same(a, b):
    assert type(a) is type(b) or (isinstance(a, tuple) and isinstance(b, tuple))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
        assert np.asarray(x).dtype == np.asarray(y).dtype


def test_combiners_identical_to_dpipe():
    bi = _dpipe()
    rng = np.random.default_rng(0)
    for _ in range(300):
        batch = _random_batch(rng, same_shape=True)
        _same(compat.combine_to_arrays(batch), bi.combine_to_arrays(batch))
        batch = _random_batch(rng, same_shape=False)
        _same(compat.combine_pad(batch), bi.combine_pad(batch))
        value, ratio = float(rng.integers(-3, 3)), float(rng.choice([0.0, 0.5, 1.0]))
        _same(compat.combine_pad(batch, value, ratio), bi.combine_pad(batch, value, ratio))


def test_unpack_args_and_apply_at_identical_to_dpipe():
    bi = _dpipe()
    rng = np.random.default_rng(1)
    for _ in range(200):
        xs = rng.integers(-9, 9, size=int(rng.integers(2, 6))).tolist()
        extra = int(rng.integers(1, 5))
        assert compat.unpack_args(lambda *a, k=0: sum(a) * k, k=extra)(xs) == bi.unpack_args(lambda *a, k=0: sum(a) * k, k=extra)(xs)
        index = int(rng.integers(-len(xs), len(xs)))
        assert compat.apply_at(index, np.multiply, extra)(xs) == bi.apply_at(index, np.multiply, extra)(xs)


@pytest.mark.parametrize("batch_size", [3, "should_add"])
def test_pipeline_batches_identical_to_dpipe(batch_size):
    bi = _dpipe()
    rng = np.random.default_rng(2)
    items = [(rng.standard_normal((2, int(n))), int(n)) for n in rng.integers(1, 9, size=23)]
    if batch_size == "should_add":
        def batch_size(seq, item):
            return sum(x.shape[-1] for x, _ in seq + [item]) <= 12

    def run(module):
        with module.Infinite(
            itertools.cycle(items), module.apply_at(0, np.multiply, 2), batch_size=batch_size,
            batches_per_epoch=4, combiner=module.combine_pad, padding_values=-1,
        ) as batches:
            return [list(batches()) for _ in range(3)]

    ours, theirs = run(compat), run(bi)
    assert len(ours) == len(theirs) == 3
    for epoch_ours, epoch_theirs in zip(ours, theirs, strict=True):
        for a, b in zip(epoch_ours, epoch_theirs, strict=True):
            _same(a, b)


def test_threads_pass_extra_arguments_like_dpipe():
    with compat.Infinite(range(6), compat.Threads(pow, 2, n_workers=2), batch_size=3, batches_per_epoch=2, combiner=list) as b:
        assert list(b()) == [[0, 1, 4], [9, 16, 25]]


def test_loky_runs_in_processes_with_extra_arguments():
    with compat.Infinite(range(4), compat.Loky(divmod, 3, n_workers=-1), batch_size=2, batches_per_epoch=2, combiner=list) as b:
        assert list(b()) == [[(0, 0), (0, 1)], [(0, 2), (1, 0)]]


def test_sample_contract():
    from itertools import islice

    draws = list(islice(compat.sample("abcd", [0, 1, 0, 3], random_state=5), 400))
    assert set(draws) == {"b", "d"} and draws.count("d") > draws.count("b")
    assert draws == list(islice(compat.sample("abcd", [0, 1, 0, 3], random_state=5), 400))
    rs = list(islice(compat.sample("abc", random_state=np.random.RandomState(0)), 20))
    assert rs == list(islice(compat.sample("abc", random_state=np.random.RandomState(0)), 20))
    assert compat.sample("abc").seed >= 0  # None: fresh entropy, kept for replay
    with pytest.raises(ValueError):
        compat.sample("ab", [-1, 1])  # dpipe: AssertionError


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_workers"):
        compat.Threads(abs, n_workers=0)
    with pytest.raises(ValueError, match="buffer_size"):
        compat.Threads(abs, buffer_size=0)
    with pytest.raises(TypeError, match="callable"):
        compat.Loky(3)


TUTORIAL = """
from fitbatch.compat.dpipe import Infinite, sample, unpack_args, apply_at, Threads, combine_pad
import numpy as np
import time

# numpy data instead of MNIST: (28, 28) images and their labels
rng = np.random.default_rng(0)
dataset = [(rng.integers(0, 255, (28, 28)).astype(np.uint8), int(rng.integers(0, 10))) for _ in range(100)]

def zoom(image, scale_factor):
    return np.kron(image, np.ones(scale_factor, dtype=image.dtype))

for x, y in sample(dataset):
    print(x.shape, y)
    break

batch_iter = Infinite(
    sample(dataset), # randomly sample from the dataset
    batch_size=30, batches_per_epoch=10,
)
for xs, ys in batch_iter():
    print(xs.shape, ys.shape)
for xs, ys in batch_iter():
    print(xs.shape, ys.shape)
batch_iter.close()

def zoom_image(image, label):
    return zoom(image, scale_factor=[2, 2]), label

batch_iter = Infinite(
    sample(dataset),
    unpack_args(zoom_image), # unpack the arguments before calling the function
    batch_size=30, batches_per_epoch=3)
with batch_iter:
    for xs, ys in batch_iter():
        print(xs.shape, ys.shape)

batch_iter = Infinite(
    sample(dataset),
    apply_at(0, zoom, scale_factor=[2, 2]),
    batch_size=30, batches_per_epoch=3)
with batch_iter:
    for xs, ys in batch_iter():
        print(xs.shape, ys.shape)

def do_stuff(x):
    time.sleep(0.1)
    return x ** 2,

start = time.perf_counter()
batch_iter = Infinite(range(10), do_stuff, batch_size=10, batches_per_epoch=1)
for value in batch_iter():
    pass
batch_iter.close()
SERIAL = time.perf_counter() - start

start = time.perf_counter()
batch_iter = Infinite(range(10), Threads(do_stuff, n_workers=2), batch_size=10, batches_per_epoch=1)
for value in batch_iter():
    pass
batch_iter.close()
THREADED = time.perf_counter() - start

images = [np.random.randn(10, 10, np.random.randint(2, 40)) for _ in range(100)]
labels = np.random.randint(0, 2, size=30)
batch_iter = Infinite(
    sample(list(zip(images, labels))),
    batch_size=5, batches_per_epoch=3,
    combiner=combine_pad
)
with batch_iter:
    for xs, ys in batch_iter():
        print(xs.shape, ys.shape)

def should_add(seq, item):
    count = 0
    for image, label in seq + [item]:
        count += image.shape[-1]
    return count <= 100

batch_iter = Infinite(
    sample(list(zip(images, labels))),
    batch_size=should_add, batches_per_epoch=3,
    combiner=combine_pad
)
with batch_iter:
    for xs, ys in batch_iter():
        print(xs.shape, ys.shape)
"""


def test_seed_tutorial_prints_the_documented_shapes():
    out = io.StringIO()
    ns: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(TUTORIAL, "dpipe-tutorial", "exec"), ns)
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"\(28, 28\) \d", lines[0])
    assert lines[1:21] == ["(30, 28, 28) (30,)"] * 20
    assert lines[21:27] == ["(30, 56, 56) (30,)"] * 6
    for line in lines[27:30]:
        assert re.fullmatch(r"\(5, 10, 10, \d+\) \(5,\)", line)
    for line in lines[30:33]:
        k, depth = re.fullmatch(r"\((\d+), 10, 10, (\d+)\) \(\1,\)", line).groups()
        assert int(k) >= 1 and int(depth) <= 100
    assert len(lines) == 33
    assert ns["THREADED"] < 0.8 * ns["SERIAL"]


def _add(a, b=0):
    return a + b


def test_every_combiner_and_wrapper_identical_to_dpipe():
    """The names beyond the pipeline: dpipe's zip combiners (any item that iterates), padding,
    the argument wrappers with extra arguments given at the call, and dpipe's keyword names."""
    bi = _dpipe()
    rng = np.random.default_rng(7)
    for _ in range(200):
        arrays = [rng.standard_normal(int(rng.integers(1, 4))) for _ in range(int(rng.integers(1, 5)))]
        same = [rng.standard_normal(3) for _ in range(int(rng.integers(1, 5)))]
        assert compat.combine_batches(inputs=same) == bi.combine_batches(inputs=same)  # arrays are zipped too
        _same(compat.combine_to_arrays(same), bi.combine_to_arrays(same))
        value, ratio = float(rng.integers(-3, 3)), float(rng.choice([0.0, 0.3, 0.5, 1.0]))
        np.testing.assert_array_equal(compat.pad_batch_equal(arrays, value, ratio), bi.pad_batch_equal(arrays, value, ratio))
        batch = _random_batch(rng, same_shape=False)
        _same(compat.combine_pad(inputs=batch, padding_values=np.min, ratio=ratio), bi.combine_pad(inputs=batch, padding_values=np.min, ratio=ratio))
        xs = rng.integers(-9, 9, size=int(rng.integers(2, 6))).tolist()
        k = int(rng.integers(1, 4))
        assert compat.unpack_args(func=lambda *a, k=0: sum(a) * k, k=k)(xs, 5) == bi.unpack_args(func=lambda *a, k=0: sum(a) * k, k=k)(xs, 5)
        assert compat.apply_at([0, -1], func=_add, b=k)(xs) == bi.apply_at([0, -1], func=_add, b=k)(xs)
        assert compat.multiply(np.multiply, k)(xs) == bi.multiply(np.multiply, k)(xs)
        assert compat.zip_apply(abs, str, np.negative)(xs[:3]) == bi.zip_apply(abs, str, np.negative)(xs[:3])
        assert compat.sample_args(round, ndigits=lambda k=k: k)(1.23456) == bi.sample_args(round, ndigits=lambda k=k: k)(1.23456)
    with pytest.raises(IndexError, match="out of bounds"):
        compat.apply_at(5, abs)([1, 2])
    with pytest.raises(ValueError, match="different lengths"):
        compat.combine_batches([(1, 2), (3,)])


def test_global_random_state_draws_identical_to_dpipe():
    bi = _dpipe()
    for seed in range(20):
        np.random.seed(seed)
        theirs = list(bi.expiration_pool(range(12), 3, 2, iterations=2))
        np.random.seed(seed)
        assert list(compat.expiration_pool(range(12), 3, 2, iterations=2)) == theirs
        np.random.seed(seed)
        theirs = [bi.random_apply(0.3, abs)(-seed - 1) for _ in range(30)]
        np.random.seed(seed)
        assert [compat.random_apply(0.3, abs)(-seed - 1) for _ in range(30)] == theirs


def test_wrap_pipeline_and_iterator_stages_identical_to_dpipe():
    bi = _dpipe()
    from dpipe.batch_iter.pipeline import wrap_pipeline as theirs_wrap

    from fitbatch.compat.dpipe.pipeline import wrap_pipeline

    def pairs(items, scale):
        items = iter(items)
        for first in items:
            yield first * scale, next(items, None)

    assert list(wrap_pipeline(range(9), compat.Iterator(pairs, 2), lambda p: p[0])) == list(theirs_wrap(range(9), bi.Iterator(pairs, 2), lambda p: p[0]))

    def run(module):
        with module.Infinite(itertools.cycle(range(7)), module.Iterator(pairs, scale=3), module.Threads(lambda p: p[0]),
                             batch_size=3, batches_per_epoch=4, combiner=list) as batches:
            return [list(batches()) for _ in range(2)]

    assert run(compat) == run(bi)


def test_documented_differences_of_the_pipeline():
    from fitbatch.compat.dpipe.pipeline import wrap_pipeline

    with pytest.raises(ZeroDivisionError):  # dpipe: pdp.StopEvent
        list(wrap_pipeline(range(3), compat.Threads(lambda x: 1 / x)))
    with compat.Infinite([1, 2, 3], batch_size=2, batches_per_epoch=3, combiner=list) as batches:
        assert list(batches()) == [[1, 2], [3, 1], [2, 3]]  # cycled; dpipe: [[1, 2], [3]]
    with pytest.raises(TypeError, match="combiner"):
        compat.Infinite([1], batch_size=1, batches_per_epoch=1, combiner=compat.Iterator(iter))


def test_closed_infinite_starts_again_and_iterator_workers_share_items():
    from fitbatch.compat.dpipe.pipeline import wrap_pipeline

    batches = compat.Infinite(itertools.count(), compat.ExpirationPool(4, 2), batch_size=4, batches_per_epoch=2, combiner=list)
    with batches:
        first = list(batches())
    assert len(first) == 2
    assert len(list(batches())) == 2  # dpipe builds a new pipeline after close
    batches.close()

    def double(items):
        for x in items:
            yield 2 * x

    assert sorted(wrap_pipeline(range(50), compat.Iterator(double, n_workers=3))) == list(range(0, 100, 2))
    with pytest.raises(ValueError, match="n_workers"):
        compat.Iterator(double, n_workers=0)
    with pytest.raises(ValueError, match="pool_size"):
        compat.ExpirationPool(0, 2)


def test_load_by_random_id_contract():
    from itertools import islice

    got = list(islice(compat.load_by_random_id(str.upper, len, ids=["a", "bb"], weights=[0, 1], random_state=1), 5))
    assert got == [("BB", 2)] * 5
    assert list(islice(compat.load_by_random_id(str, ids=[7], random_state=0), 2)) == ["7", "7"]
