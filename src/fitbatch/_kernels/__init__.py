"""The planning kernels: ordered sizes and a budget in, int64 batch boundaries out.

Private: nothing here is public API. Arrays and scalars in, arrays out; no torch, no options
objects. ``batches`` (the dispatch: greedy cuts in any order, closed-form descending counts,
per-batch measures), ``greedy`` (the in-order greedy walked, chunked or lifted), ``packing``
(first-fit-decreasing), ``sorting`` (keys and orders), ``jit`` with ``compiled`` (the numba
loops, loaded only when numba is installed and ``FITBATCH_JIT`` allows it).
"""
