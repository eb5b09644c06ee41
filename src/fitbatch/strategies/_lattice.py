"""Lattice orders: each level's samples laid out so that last epoch's batch partners part.

``pooled`` batches consecutive samples of each level's order. In a random order two samples
that shared a batch of ``k`` in one epoch share one again in the next with a chance of about
``k / n`` (a level of ``n`` samples), whatever the epochs before did. A lattice order spreads
them instead:

- every sample gets a rank ``r`` in the size keys, the same every epoch (equal keys in an order
  drawn once per seed), so the samples of a level hold a run of ranks;
- epoch ``e`` lays the samples out by ``(a_e * r + b_e) mod M``, ``M`` the least prime at or above
  the sample count, ``a_e`` a multiplier and ``b_e`` an offset drawn for the epoch.

Two samples of a level whose ranks differ by ``d`` are close in epoch ``e``'s layout when
``a_e * d`` is small modulo ``M``. They meet again in ``e + 1`` only when ``d``, ``a_e * d`` and
``a_{e+1} * d`` are all small: a vector of the lattice ``{(d, a_e d, a_{e+1} d) mod M}`` in the
box of the level's rank span and its batch window (the same width in both epochs). Such a box of
volume ``V`` holds the vector ``(d, u, v)`` for some shape exactly when
``|d| * max(|u|_M, |v|_M)**2 <= V`` (``|x|_M``: the distance to the nearest multiple of ``M``, at
least 1). The least of that over ``d != 0`` is the pair's figure of merit (:func:`merit`): a
large one leaves no vector in any box of smaller volume, whatever its shape (long and narrow for
levels of many small samples, short for levels of a few large ones). Where a level holds fewer
than ``k**2`` samples no layout avoids every repeat, and random order is already about as good.

Multipliers come without a chain, so any epoch costs at most three searches (memoised per
process): epochs ``0 mod 4`` draw theirs; epochs ``2 mod 4`` take the best of
:data:`CANDIDATES` draws against their neighbours ``e - 2`` and ``e + 2``; odd epochs the best
against ``e - 1`` and ``e + 1``. Every consecutive pair of epochs is searched, and so is every
second pair of even epochs.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.typing import NDArray

from fitbatch import _rng

IntArray = NDArray[np.int64]

# multipliers drawn per searched epoch; the best of them against the epoch's two neighbours is kept
CANDIDATES = 64
# every candidate's merit is first bounded over the differences 1..HEAD (most fail there)
HEAD = 256
# sample counts above this keep a random order inside levels: from 100,000 samples the random
# order already repeats 2-5x fewer pairs than lhotse's sampler on every set measured
# (BENCHMARKS.md), and the multiplier search grows with the count
MAX_SAMPLES = 1 << 16


def applies(randomness: object, few: bool, shuffle: bool, n: int) -> bool:
    """Whether a plan lays its levels out on the lattice: ``randomness="auto"``, shuffled, an
    epoch of many batches (not few-batch levels) and at most :data:`MAX_SAMPLES` samples.

    A number for ``randomness`` keeps a random order, so that the rate lands where asked.

    >>> applies("auto", False, True, 20_000), applies(0.1, False, True, 20_000), applies("auto", True, True, 500)
    (True, False, False)
    """
    return randomness == "auto" and not few and shuffle and n <= MAX_SAMPLES


def ranked(keys: NDArray[np.uint16], seed: int) -> IntArray:
    """The positions in the order of their rank: by size key, equal keys in an order drawn once
    per seed (keyed on epoch 0: the ranks stay the same from epoch to epoch).

    >>> ranked(np.array([3, 1, 2, 1], dtype=np.uint16), seed=0)[2:].tolist()
    [2, 0]
    """
    ties = _rng.generator(seed, 0, "lattice ranks").permutation(keys.size)
    return ties[np.argsort(keys[ties], kind="stable")]


def lattice_order(
    keys: NDArray[np.uint16], seed: int, epoch: int, by_rank: IntArray | None = None
) -> IntArray:
    """Positions ``0..n-1`` in epoch ``epoch``'s lattice layout over the size ``keys``
    (``by_rank``: :func:`ranked`, when the caller keeps it).

    A stable sort of the result by level keeps each level's samples in this layout.

    >>> keys = np.array([3, 1, 2, 1, 3, 2, 2, 1], dtype=np.uint16)
    >>> order = lattice_order(keys, seed=0, epoch=1)
    >>> sorted(order.tolist()) == list(range(8))
    True
    >>> bool((lattice_order(keys, 0, 1) == order).all()), bool((lattice_order(keys, 0, 2) == order).all())
    (True, False)
    """
    n = keys.size
    by_rank = ranked(keys, seed) if by_rank is None else by_rank
    modulus = prime_at_least(max(n, 5))
    a = multiplier(seed, epoch, modulus)
    b = offset(seed, epoch, modulus)
    slots = np.arange(n, dtype=np.int64)
    slots *= a
    slots += b
    slots %= modulus
    laid = np.full(modulus, -1, dtype=np.int64)
    laid[slots] = by_rank  # a is invertible modulo a prime: the slots are distinct
    return laid[laid >= 0]


@functools.lru_cache(maxsize=1024)
def offset(seed: int, epoch: int, modulus: int) -> int:
    """Epoch ``epoch``'s offset modulo ``modulus`` (kept per process, as the multipliers are).

    >>> 0 <= offset(3, 1, 10007) < 10007
    True
    """
    return int(_rng.generator(seed, epoch, "lattice offset").integers(modulus))


@functools.lru_cache(maxsize=1024)
def multiplier(seed: int, epoch: int, modulus: int) -> int:
    """Epoch ``epoch``'s multiplier modulo the prime ``modulus`` (see the module docstring).

    >>> m = 10007
    >>> a = [multiplier(3, e, m) for e in range(4)]
    >>> all(0 < x < m for x in a), a == [multiplier(3, e, m) for e in range(4)]
    (True, True)
    >>> a[1] == best_multiplier(_rng.generator(3, 1, "lattice multiplier").integers(1, m, size=CANDIDATES), [a[0], a[2]], m)
    True
    """
    if epoch % 4 == 0:
        return int(_rng.generator(seed, epoch, "lattice multiplier").integers(1, modulus))
    step = 2 if epoch % 2 == 0 else 1
    partners = [multiplier(seed, epoch - step, modulus), multiplier(seed, epoch + step, modulus)]
    candidates = _rng.generator(seed, epoch, "lattice multiplier").integers(1, modulus, size=CANDIDATES)
    return best_multiplier(candidates, partners, modulus)


def best_multiplier(candidates: IntArray, partners: list[int], modulus: int) -> int:
    """The candidate of the greatest :func:`merit` against every partner (the first of equals).

    Each candidate's merit over the differences up to :data:`HEAD` bounds its merit from above,
    so candidates are finished in the order of that bound until none can beat the best.

    >>> c = np.array([2, 5, 3001, 4000, 6180], dtype=np.int64)
    >>> full = merit(c, [1234], 10007)
    >>> best_multiplier(c, [1234], 10007) == int(c[np.argmax(full)])
    True
    """
    head = np.arange(1, min(HEAD, modulus // 2) + 1, dtype=np.int64)
    bound = merit(candidates, partners, modulus, head)
    best, best_merit = int(candidates[0]), -1.0
    for i in np.argsort(-bound, kind="stable").tolist():
        if bound[i] <= best_merit:
            break
        m = float(merit(candidates[i : i + 1], partners, modulus)[0])
        if m > best_merit:
            best, best_merit = int(candidates[i]), m
    return best


def merit(
    candidates: IntArray, partners: list[int], modulus: int, differences: IntArray | None = None
) -> NDArray[np.float64]:
    """For each candidate ``a``, the least ``|d| * max(|a d|_M, |p d|_M)**2`` over the partners
    ``p`` and the ``differences`` ``d`` (default: all, ``1..M // 2``), over ``M**2``.

    >>> float(merit(np.array([1]), [1], 11)[0]) == 1 / 121   # d = 1 is short in every coordinate
    True
    """
    d = np.arange(1, modulus // 2 + 1, dtype=np.int64) if differences is None else differences
    cand = _distance(np.asarray(candidates, dtype=np.int64)[:, None] * d, modulus)
    least = np.full(cand.shape[0], np.inf)
    for p in partners:
        wider = np.maximum(cand, _distance(p * d, modulus))
        wider *= wider
        wider *= d
        np.minimum(least, wider.min(axis=1), out=least)
    return least / float(modulus) ** 2


def _distance(x: NDArray[np.int64], modulus: int) -> NDArray[np.float64]:
    """``|x|_M``: the distance to the nearest multiple of ``modulus``, at least 1 (as floats)."""
    r = x % modulus
    return np.maximum(np.minimum(r, modulus - r), 1).astype(np.float64)


@functools.lru_cache(maxsize=64)
def prime_at_least(n: int) -> int:
    """The least prime ``>= n``.

    >>> [prime_at_least(k) for k in (2, 8, 14, 65536)]
    [2, 11, 17, 65537]
    """
    candidate = max(int(n), 2)
    while True:
        if candidate < 4 or all(candidate % f for f in range(2, int(candidate**0.5) + 1)):
            return candidate
        candidate += 1
