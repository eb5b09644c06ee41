"""What the compiled step kernels share (numba): the cost kinds, stable radix argsorts and a
binary search, as :mod:`fitbatch._kernels.steps` and :mod:`fitbatch._kernels.steps_refine` call
them (the same ties and values as numpy's stable sorts and ``searchsorted``).

Cost kinds: 0 sum (``total``), 1 padded (``count * longest``), 2 polynomial
(``fixed + count * (linear + longest * (per_token + quadratic * longest))``, ``params`` in that
order), as :class:`~fitbatch.costs.SumCost`, :class:`~fitbatch.costs.PaddedCost` and
:class:`~fitbatch.costs.PaddedPolynomial` evaluate 1-D sizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

# machine code cached next to this module (a fresh install compiles once, ~30 s of CPU on the
# shared 2-core VM; later processes load it in ~0.6 s); no GIL needed while a kernel runs
OPTS: dict[str, Any] = {"cache": True, "nogil": True}


@njit(**OPTS)
def _cost(kind: int, p: Any, c: float, lng: float, t: float) -> float:
    if kind == 0:
        return t
    if kind == 1:
        return c * lng
    return p[0] + c * (p[1] + lng * (p[2] + p[3] * lng))


@njit(**OPTS)
def _stable(key: Any) -> Any:
    """Positions of ``key`` (floats, no NaN) sorted ascending, ties by position: numpy's
    ``argsort(kind="stable")`` (a stable order is unique); insertion for short arrays, else a
    radix sort of unsigned integers in the same order (``-0.0`` counts as ``0.0``, as numpy
    compares them): whole numbers as themselves (``~(-x)`` if none is positive), else the
    floats' bits."""
    n = key.size
    ascending = True  # already in order (a constant key, the heaviest-first bins' steps): as it stands
    for i in range(1, n):
        if key[i] < key[i - 1]:
            ascending = False
            break
    if ascending:
        return np.arange(n)
    if n <= 32:
        out = np.arange(n)
        for i in range(1, n):
            x = out[i]
            kx = key[x]
            j = i - 1
            while j >= 0 and key[out[j]] > kx:
                out[j + 1] = out[j]
                j -= 1
            out[j + 1] = x
        return out
    lo, hi, whole = np.inf, -np.inf, True
    for i in range(n):
        v = key[i]
        lo, hi = min(lo, v), max(hi, v)
        whole = whole and v == np.floor(v)
    k = np.empty(n, dtype=np.uint64)
    if whole and lo >= 0 and hi < 2.0**63:
        for i in range(n):
            k[i] = np.uint64(key[i])
    elif whole and hi <= 0 and lo > -(2.0**63):
        for i in range(n):
            k[i] = ~np.uint64(-key[i])
    else:
        bits = (key + 0.0).view(np.uint64)  # + 0.0: -0.0 becomes 0.0
        sign = np.uint64(1) << np.uint64(63)
        for i in range(n):
            b = bits[i]
            k[i] = ~b if b & sign else b | sign
    return _radix(k)


@njit(**OPTS)
def _stable_spread(key: Any) -> Any:
    """:func:`_stable` of keys spread over their range (a deal round's loads, weights): each to one
    of ``n`` buckets of equal width (in order: a key's bucket never below a smaller key's), by
    position within one, then one insertion pass (an element moves only within its bucket, past
    larger keys: ties keep their positions). Where that takes more than ``SPREAD_WORK`` moves a
    key (uneven buckets), :func:`_stable` instead."""
    n = key.size
    if n <= 32:
        return _stable(key)
    lo, hi = key[0], key[0]
    for i in range(1, n):
        lo, hi = min(lo, key[i]), max(hi, key[i])
    if not (hi > lo and hi - lo < np.inf):
        return _stable(key)
    scale = n / (hi - lo)
    start = np.zeros(n + 1, dtype=np.int64)
    bucket = np.empty(n, dtype=np.int64)
    for i in range(n):
        b = min(np.int64((key[i] - lo) * scale), n - 1)
        bucket[i] = b
        start[b + 1] += 1
    for b in range(n):
        start[b + 1] += start[b]
    out = np.empty(n, dtype=np.int64)
    ks = np.empty(n)
    for i in range(n):
        b = bucket[i]
        at = start[b]
        start[b] = at + 1
        out[at], ks[at] = i, key[i]
    budget = SPREAD_WORK * n
    for i in range(1, n):  # invariant: out[:i] is the stable order of its keys
        kx = ks[i]
        if ks[i - 1] > kx:
            x = out[i]
            j = i - 1
            while j >= 0 and ks[j] > kx:
                ks[j + 1], out[j + 1] = ks[j], out[j]
                j -= 1
            ks[j + 1], out[j + 1] = kx, x
            budget -= i - j
            if budget < 0:
                return _stable(key)
    return out


#: :func:`_stable_spread`'s insertion moves, at most this many a key (else a sort costs less)
SPREAD_WORK = 8


@njit(**OPTS)
def _radix(k: Any) -> Any:
    """Positions of the unsigned keys ``k`` sorted ascending, ties by position (stable): a
    least-significant-byte radix sort, skipping the bytes every key shares."""
    n = k.size
    out = np.arange(n)
    if n == 0:
        return out
    every, some = k[0], k[0]  # the bits every key has, and those some key has
    for i in range(1, n):
        every &= k[i]
        some |= k[i]
    differ = every ^ some
    shifts = np.empty(8, dtype=np.int64)  # the bytes where keys differ (a byte they share: the pass keeps the order)
    nv = 0
    for byte in range(8):
        if (differ >> np.uint64(8 * byte)) & np.uint64(255):
            shifts[nv] = 8 * byte
            nv += 1
    count = np.zeros((nv, 257), dtype=np.int64)
    for i in range(n):
        x = k[i]
        for v in range(nv):
            count[v, ((x >> np.uint64(shifts[v])) & np.uint64(255)) + 1] += 1
    keys = k.copy()
    out2 = np.empty(n, dtype=np.int64)
    keys2 = np.empty(n, dtype=np.uint64)
    for v in range(nv):
        row = count[v]
        byte = shifts[v] // 8
        for d in range(256):
            row[d + 1] += row[d]
        shift = np.uint64(8 * byte)
        for i in range(n):
            x = keys[i]
            d = (x >> shift) & np.uint64(255)
            at = row[d]
            row[d] = at + 1
            out2[at] = out[i]
            keys2[at] = x
        out, out2 = out2, out
        keys, keys2 = keys2, keys
    return out


@njit(**OPTS)
def _smallest(key: Any, k: int) -> Any:
    """``_stable(key)[:k]``: the ``k`` smallest keys' positions in order, ties by position. For
    a few of many, one scan keeps them in a sorted buffer (a key enters only below the last)."""
    n = key.size
    k = min(k, n)
    if k > 32 or k * 8 > n:
        return _stable(key)[:k]
    buf = np.empty(k, dtype=np.int64)
    held = 0
    for i in range(n):
        v = key[i]
        if held < k:
            j = held
            held += 1
        elif v < key[buf[k - 1]]:
            j = k - 1
        else:
            continue
        while j > 0 and key[buf[j - 1]] > v:
            buf[j] = buf[j - 1]
            j -= 1
        buf[j] = i
    return buf


@njit(**OPTS)
def _then(order: Any, key: Any) -> Any:
    """``order`` stably re-sorted by ``key[order]`` (a lexsort's next, more significant key; float64
    keys: integer ones are passed as floats, one specialisation)."""
    return order[_stable(key[order])]


@njit(**OPTS)
def argsort(key: Any) -> Any:
    """``np.argsort(key, kind="stable")`` of a 1-D float64 array without NaN (the same positions)."""
    return _stable(key)


@njit(**OPTS)
def argsort_int(key: Any) -> Any:
    """``np.argsort(key, kind="stable")`` of a 1-D int64 array of values >= 0 (the same positions)."""
    return _radix(key.view(np.uint64))


@njit(**OPTS)
def _search(a: Any, v: float, lo: int, hi: int) -> int:
    """``np.searchsorted(a, v)`` (left) within ``a[lo:hi]`` (``a`` sorted)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo
