"""deep-pipe's own ``tests/batch_iter`` suite, reproduced against ``fitbatch.compat.dpipe``.

The cases of ``tests/batch_iter/test_expiration_pool.py``, ``test_pipeline.py`` and
``test_sources.py`` in neuro-ml/deep_pipe (deep-pipe 0.5.0): same inputs, same assertions,
written for this project; nothing is fetched at run time. The imports are dpipe's with the
package prefix replaced (``dpipe.batch_iter`` -> ``fitbatch.compat.dpipe``). The expected
difference is a strict xfail naming its line in docs/migrating.md.
"""

from __future__ import annotations

import time
from collections import Counter
from itertools import islice, repeat

import numpy as np
import pytest

from fitbatch.compat.dpipe import (
    Infinite,
    Loky,
    Threads,
    combine_to_arrays,
    expiration_pool,
    sample,
)
from fitbatch.compat.dpipe.pipeline import wrap_pipeline

pytest.importorskip("loky", reason="Loky stages need loky (the pipeline extra)")


# --- test_expiration_pool.py ------------------------------------------------------------------


def test_expiration_pool_repetitions():
    drawn = list(expiration_pool(list(range(10)), 2, 4))
    assert all(count == 4 for count in Counter(drawn).values())


def test_expiration_pool_size():
    for _ in range(10):
        pool = expiration_pool(list(range(100)), 10, 2)
        assert max(next(pool) for _ in range(10)) < 10


# --- test_pipeline.py: wrap_pipeline ---------------------------------------------------------


def test_wrapper():
    last = -1
    for i, item in enumerate(wrap_pipeline(range(100), lambda x: x**2)):
        assert item == i**2
        last = i
    assert last == 99


def _seconds(pipeline):
    start = time.time()
    for _ in pipeline:
        pass
    return time.time() - start


def test_parallel():
    n, nap = 10, 0.5
    serial = _seconds(wrap_pipeline(range(n), lambda x: time.sleep(nap)))
    threaded = _seconds(wrap_pipeline(range(n), Threads(lambda x: time.sleep(nap), n_workers=2)))
    assert abs(threaded - serial / 2) < nap
    processes = _seconds(wrap_pipeline(range(n), Loky(lambda x: time.sleep(nap), n_workers=2)))
    # The one change to upstream's assertions: starting two worker processes takes ~0.6 s on a
    # 2-core machine (dpipe 0.5.0's own Loky measured 3.0-3.3 s here, failing the bare bound),
    # so the start-up of a pool, timed on a run without naps, is not counted.
    start_up = _seconds(wrap_pipeline(range(2), Loky(abs, n_workers=2)))
    assert abs(processes - start_up - serial / 2) < nap


def test_loky():
    source = list(range(100))
    squares = Counter(x**2 for x in source)
    assert Counter(wrap_pipeline(source, Loky(lambda x: x**2, n_workers=2))) == squares
    # the first pool is gone: a new one starts
    assert Counter(wrap_pipeline(range(100), Loky(lambda x: x**2, n_workers=2))) == squares
    # two process stages in a row
    items = list(wrap_pipeline(range(100), Loky(lambda x: x**2, n_workers=2), Loky(lambda x: x**2, n_workers=2)))
    assert Counter(items) == Counter(x**4 for x in source)
    assert len(items) == 100


def test_premature_stop():
    for stage in (Threads, Loky):
        with wrap_pipeline(range(10), stage(lambda x: x**2, n_workers=2)) as pipeline:
            for _ in pipeline:
                break


@pytest.mark.xfail(
    strict=True,
    reason="docs/migrating.md: A failing stage raises in the consumer with its own type (dpipe: pdp.StopEvent).",
)
def test_loky_exceptions():
    stop_event = pytest.importorskip("pdp", reason="pdp names dpipe's error").StopEvent

    def raiser(x):
        raise ZeroDivisionError

    with pytest.raises(stop_event):  # in the source
        list(wrap_pipeline(map(raiser, range(10))))
    for stage in (Threads, Loky):
        with pytest.raises(stop_event):
            list(wrap_pipeline(range(10), stage(raiser, n_workers=2)))


# --- test_pipeline.py: Infinite --------------------------------------------------------------


def pipeline(source, iters=1, transformers=(), batch_size=1, combiner=combine_to_arrays):
    return Infinite(source, *transformers, batch_size=batch_size, batches_per_epoch=iters, buffer_size=1, combiner=combiner)


def test_elements():
    assert ((1,), (2,)) == list(pipeline(repeat([1, 2]), 1)())[0]


def test_batch_size():
    for size in (1, 5, 10):
        assert len(list(pipeline(repeat([1]), batch_size=size)())[0][0]) == size
    for bad in (0.5, [1]):
        with pytest.raises(TypeError):
            with pipeline([1], batch_size=bad):
                pass

    def max_three(chunk, item):
        return sum(map(len, chunk + [item])) <= 3

    with pipeline([[1, 2], [1], [1], [1], [1], [1, 2, 3], [1, 2], [1]], 4, batch_size=max_three, combiner=list) as p:
        for batch in p():
            assert sum(map(len, batch)) == 3


def test_iters():
    for n in (1, 5, 10, 100, 450):
        assert len(list(pipeline(repeat([1]), n)())) == n


def test_enter():
    with pipeline(repeat([1]), 1) as p:
        assert len(list(p())) == 1


def test_multiple_iter():
    p = pipeline(repeat([1]), 1)
    for _ in range(3):
        assert len(list(p())) == 1
    p.close()


def test_del():
    p = pipeline(repeat([1]), 1)
    assert len(list(p())) == 1
    del p


# --- test_sources.py -------------------------------------------------------------------------


def test_sample():
    sequence, n = [[0], [1]], 100_000

    def mean(weights=None):
        return sum(x[0] for x in islice(sample(sequence, weights), n)) / n

    assert mean([0, 1]) == 1
    assert mean([1, 0]) == 0
    np.testing.assert_almost_equal(mean(), 0.5, decimal=2)
    np.testing.assert_almost_equal(mean([1, 4]), 0.8, decimal=2)


def _numpy_choice(sequence, weights):
    while True:
        yield sequence[np.random.choice(len(sequence), p=weights)]


def _shares(sequence, weights, draw, n):
    """(share of each item in n draws, seconds taken)."""
    start = time.time()
    shares = dict.fromkeys(sequence, 0.0)
    for item in islice(draw(sequence, weights), n):
        shares[item] += 1 / n
    return shares, time.time() - start


def test_sample_n_numpy():
    ids, prob, n = ["0", "1", "2", "3"], [0.15, 0.35, 0.15, 0.35], 100_000
    ours, ours_seconds = _shares(ids, prob, sample, n)
    numpy, numpy_seconds = _shares(ids, prob, _numpy_choice, n)
    for item, p in zip(ids, prob):
        np.testing.assert_almost_equal(ours[item], p, decimal=2)
        np.testing.assert_almost_equal(numpy[item], p, decimal=2)
    np.testing.assert_array_less(ours_seconds, numpy_seconds)  # faster than np.random.choice

    ours, ours_seconds = _shares(ids, None, sample, n)
    numpy, numpy_seconds = _shares(ids, None, _numpy_choice, n)
    for item in ids:
        np.testing.assert_almost_equal(ours[item], numpy[item], decimal=2)
    np.testing.assert_array_less(ours_seconds, numpy_seconds)
