"""``dpipe.batch_iter``'s API on :mod:`fitbatch.pipeline`.

Migrating: replace the package prefix ``dpipe.batch_iter`` by ``fitbatch.compat.dpipe``; the
modules ``pipeline``, ``sources``, ``utils`` and ``expiration_pool`` are here too (so
``from fitbatch.compat.dpipe.pipeline import wrap_pipeline`` works), with dpipe's signatures
and keyword names. Pipelines run on fitbatch's stage threads, bounded queues and worker pools.

Deliberate differences from deep-pipe 0.5.0 (bugs not reproduced):

* Errors in a stage reach the consumer as themselves (with a note naming the stage); dpipe
  raises ``pdp.StopEvent`` and can hang on a failing transform or at exit when a pipeline was
  not closed. ``close()`` stops every thread and worker process within seconds.
* :func:`sample` (and :func:`load_by_random_id`) draw from a numpy ``Generator`` keyed by the
  seed (``random_state``: an int, ``None`` for fresh entropy kept in the iterator's ``seed``,
  or a ``RandomState`` from which one seed is drawn), never from global state, so their draws
  differ from dpipe's for the same number. :func:`random_apply` and :func:`expiration_pool`
  draw from numpy's global state, as dpipe does.
* Invalid arguments raise ``ValueError``/``TypeError`` when the stage or wrapper is created
  (dpipe fails an ``assert``, or fails when it is first used).
* :class:`Infinite` cycles a re-iterable source (a list, a range) when it ends; dpipe ends the
  epoch early. A ``Threads``/``Loky`` combiner runs its function in the combiner thread; an
  ``Iterator`` combiner is refused (``TypeError``).
* ``Loky`` falls back to the standard library's processes when loky is not installed.
* ``batch_size`` may also be a :class:`fitbatch.pipeline.Budget` (batches that fit a memory
  budget); ints and ``should_add(batch, item)`` functions behave as in dpipe (an empty batch
  always takes the item).

>>> import numpy as np
>>> from fitbatch.compat.dpipe import Infinite, apply_at, sample
>>> data = [(np.zeros((2, 2)), 0), (np.ones((2, 2)), 1)]
>>> with Infinite(sample(data, random_state=0), apply_at(0, np.multiply, 3),
...               batch_size=4, batches_per_epoch=2) as batch_iter:
...     [(xs.shape, ys.shape) for xs, ys in batch_iter()]
[((4, 2, 2), (4,)), ((4, 2, 2), (4,))]
"""

from __future__ import annotations

from fitbatch.compat.dpipe.expiration_pool import ExpirationPool, expiration_pool
from fitbatch.compat.dpipe.pipeline import (
    Infinite,
    Iterator,
    Loky,
    Threads,
    combine_batches,
    combine_pad,
    combine_to_arrays,
)
from fitbatch.compat.dpipe.sources import load_by_random_id, sample
from fitbatch.compat.dpipe.utils import (
    apply_at,
    multiply,
    pad_batch_equal,
    random_apply,
    sample_args,
    unpack_args,
    zip_apply,
)

__all__ = [
    "ExpirationPool",
    "Infinite",
    "Iterator",
    "Loky",
    "Threads",
    "apply_at",
    "combine_batches",
    "combine_pad",
    "combine_to_arrays",
    "expiration_pool",
    "load_by_random_id",
    "multiply",
    "pad_batch_equal",
    "random_apply",
    "sample",
    "sample_args",
    "unpack_args",
    "zip_apply",
]
