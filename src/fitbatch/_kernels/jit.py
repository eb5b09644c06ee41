"""Optional compiled greedy loops and layout sorts (the ``fast`` extra: numba).

The in-order greedy has no numpy formulation that is cheap for short batches: numpy pays a
Python step per batch (the walk over batch ends) or a few numpy calls per chunk (the lock-step
scan). With numba installed, :func:`greedy` and :func:`prefix_sum_starts` run the same
arithmetic as a compiled per-sample loop and return the same starts; without it (or with the
environment variable ``FITBATCH_JIT=0``) they return ``None`` and callers use numpy. The
same holds for sum-cost packing's first-fit loop (:func:`first_fit_in_place`) and for the stable
sorts that lay out shuffled epochs (:func:`shuffle_by_level`, :func:`shuffle_in_pools`:
counting and radix sorts, and a stable sort has one result, so the order is numpy's).

Only the built-in cost models over 1-D sizes are compiled (:class:`~fitbatch.costs.SumCost`,
:class:`~fitbatch.costs.PaddedCost`, :class:`~fitbatch.costs.PaddedPolynomial`, exactly those
classes: a subclass may change ``evaluate``), and :class:`~fitbatch.costs.Limits` over rows
whose every column has one of them. numba starts loading in a background thread once a process
has planned ``LOAD_AT`` samples in ``LOAD_PLANS`` plans or more, after the plan that passed both
(:func:`planning`): small plans and a single plan never pay for the import, and a first plan of
a million samples neither waits for it nor shares the processor with it (a plan is the same
either way). A call of
``WAIT_AT`` samples or more, and sum-cost first fit from ``FIRST_FIT_AT`` (a Python loop there),
wait for it, for the import only: a loop compiles on its first call (about a second each, the
background thread compiles the others meanwhile) and numba caches the machine code next to the
module, so later processes load it. A plan never depends on when the background load
finishes: loops whose result could differ from numpy's in the last rounding (running sums of
fractional sizes) use the compiled form only once it was asked for at a point fixed by the work
(``WAIT_AT``, ``wait``, ``FITBATCH_JIT=1``, numba imported by the program).

An ahead-of-time cache of the same loops (:mod:`fitbatch._kernels.aot`: extension modules built
with ``numba.pycc`` once per install and key) is imported instead where it is built: in
milliseconds and without numba, so it counts as loaded from the first call of the process (the
thresholds above only hide numba's import). A process that loaded numba's JIT starts building it
in a background process after its plan; ``FITBATCH_AOT=0`` turns it off. The thresholds and the
rule above for the last rounding apply to it unchanged, and a call its exports do not fit (an
unexpected dtype) goes to numba: a plan is the same with it, with numba's JIT and in numpy.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.costs import CostModel, Limits, PaddedCost, PaddedPolynomial, SumCost

logger = logging.getLogger(__name__)

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

# Samples planned in this process before numba starts loading in the background, after the plan
# that passed it: importing it and loading the cached machine code takes about a second of CPU
# once (measured 1.14 s for a first 1M-sample sequential plan against 0.24 s in numpy), which
# no plan waits for; a process that plans a small set every epoch (20k samples: 13 epochs) has
# the compiled loops from then on (20k samples, CPU time on the shared sets: sequential 7-11 ms
# in numpy, 2-3 ms compiled; packed with the sum cost 17-31 ms, 3-5 ms; pooled 14-18, 9-13 ms).
LOAD_AT = 1 << 18
# ... over this many plans at least: a process that plans once (a first plan of 1M samples) never
# pays for the import, which would also share the processor with whatever follows the plan
# (materialising 1.6M batches took 0.06-0.16 s instead of 0.03 beside it); one that plans again
# loads it after its second plan
LOAD_PLANS = 2
# ... a plan of this many samples waits for it (its numpy loops take longer than the load)
WAIT_AT = 1 << 22
# ... and first-fit packing, about 2 us per sample in Python, waits for it from this many samples
# in one call (its Python loop there takes about as long as loading numba's cached machine code,
# ~1 s once)
FIRST_FIT_AT = 1 << 18

# the compiled shuffles from this many positions hold one array of n int64 (32-bit positions in
# its halves, read through: ~1.6x the time), below it two of uint64 (packed, read in sequence)
COMPACT_AT = 1 << 21

_module: ModuleType | None = None
_tried = False  # the load finished (with or without the module)
_work = 0
_lock = threading.Lock()
_thread: threading.Thread | None = None
_eager = False  # asked for at a point fixed by the work (not by the background thread's timing)
_planning = 0  # plans under way in this process (the background load starts after them)
_wanted = False  # LOAD_AT passed while planning: load once the plan is done
_plans = 0  # plans finished in this process (outermost planning() blocks)
# loops a plan ran in numpy because numba had no machine code for them yet (a fresh install):
# compiled in the background once the plan is done (name -> a call that compiles it)
_later: dict[str, Callable[[ModuleType], Any]] = {}
_compiling: set[str] = set()  # ... and those whose background compile has started
_compile_thread: threading.Thread | None = None
_aot_looked = False  # the ahead-of-time cache was looked for (once per process)
_build_wanted = False  # numba's JIT was loaded: build the ahead-of-time cache after the plan
_NO_FORCE = np.zeros(0, dtype=np.bool_)
_NO_ORDER = np.zeros(0, dtype=np.int64)


def enabled() -> bool:
    """Whether the compiled loops can be used (numba importable, ``FITBATCH_JIT`` not ``0``).

    Loads them now if they were not loaded yet.
    """
    return _mode() != "off" and _load() is not None


def _mode() -> str:
    value = os.environ.get("FITBATCH_JIT", "auto").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off"
    return "always" if value in ("1", "true", "yes", "on", "always") else "auto"


def _load() -> ModuleType | None:
    """Load the compiled loops now (waiting for a background load under way)."""
    global _module, _tried
    with _lock:
        if not _tried:
            _module = _import()
            _tried = True
    return _module


def _import() -> ModuleType | None:
    if importlib.util.find_spec("numba") is None:
        logger.debug("numba is not installed: the greedy loops run in numpy")
        return None
    ahead = _aot_load("compiled")
    if ahead is not None:
        return ahead
    _want_build()
    try:
        from fitbatch._kernels import compiled as _jit_kernels

        _probe(_jit_kernels)
    except Exception as exc:  # noqa: BLE001 - a numba that does not fit this numpy, no cache directory, ...
        logger.warning("numba is installed but its loops could not be compiled (%s: %s); using numpy", type(exc).__name__, exc)
        return None
    return _jit_kernels


def _load_in_background() -> None:
    """Start loading the compiled loops in a daemon thread (once)."""
    global _thread
    if _thread is not None:  # started: the lock is the loader's until it is done
        return
    with _lock:
        if _thread is None and not _tried:
            _thread = threading.Thread(target=_load_and_warm, name="fitbatch-numba", daemon=True)
            _thread.start()


@contextlib.contextmanager
def planning(counted: bool = True) -> Iterator[None]:
    """Around one plan: a background load the plan asks for starts when it is done, so that
    the first large plan of a process runs alone (its result does not depend on it).
    ``counted=False``: part of a plan (its measures), not one more of the ``LOAD_PLANS``.

    >>> with planning():
    ...     pass
    """
    global _planning, _wanted, _plans
    _planning += 1
    try:
        yield
    finally:
        _planning -= 1
        if not _planning and counted:
            _plans += 1
        if _wanted and not _planning and _plans >= LOAD_PLANS:
            _wanted = False
            _load_in_background()
        if _later and not _planning:
            _compile_in_background()
        if _build_wanted and not _planning:
            _want_build()


def loading() -> bool:
    """Whether the background load is under way (started, not finished).

    >>> loading() in (True, False)
    True
    """
    return _thread is not None and not _tried


def settle() -> ModuleType | None:
    """Wait for a background load under way (if any); the compiled module, or ``None``.

    >>> settle() is None or settle() is not None
    True
    """
    thread = _thread
    if thread is not None:
        thread.join()
    return _module


def _probe(module: ModuleType) -> None:
    """Compile (or load from numba's cache) one small loop: numba works with this numpy and
    can cache here; the other loops compile on first use or in the background."""
    module.all_integral(np.ones(1))


def _load_and_warm() -> None:
    """The background load: the module (under the lock: a plan that needs it waits for the
    import only), then every loop compiled or loaded from numba's cache, outside the lock.

    A plan that runs meanwhile uses the loops that are ready and compiles the one it calls
    (numba's compiler lock serialises the two), so a synchronous load (``WAIT_AT``) pays
    only for the loops it uses: on a fresh install, two of them for a histogram packing, not
    all of them."""
    module = _load()
    if module is not None:
        try:
            _warm(module)
        except Exception as exc:  # noqa: BLE001 - the loops compile again on first use
            logger.debug("warming the compiled loops failed (%s: %s)", type(exc).__name__, exc)


def _warm(module: ModuleType) -> None:
    """Compile (or load from numba's cache) every loop now (in the background thread), so
    that a long stream does not pay the compiler's time and memory at some later batch."""
    one, params = np.ones(2), np.zeros(4)
    module.greedy(one, 1.0, 0, params, np.inf, _NO_FORCE, False, 0.0, 0.0, 0.0, _NO_ORDER, False)
    module.prefix_sum_starts(one, 1.0, 2)
    rows = np.ones((2, 1))
    module.greedy_rows(rows, 1.0, np.zeros(1, np.int64), np.zeros((1, 4)), one[:1], np.inf, _NO_FORCE, False, 0.0, one[:1] * 0, one[:1] * 0)
    module.run_totals(one, np.array([0, 2], dtype=np.int64), 0, params, 1.0, 0, 0.0, 0.0, 0)
    module.all_integral(one)
    ints = np.zeros(1, np.int64)
    module.walk_runs(ints, ints + 1, np.ones(1, np.bool_), ints + 1, ints + 1, ints + 1)
    module.batch_reduce(one, _NO_ORDER, False, np.array([0, 2], dtype=np.int64))
    module.first_fit_in_place(one.copy(), np.arange(2), np.zeros(1, np.int64), 1.0, 2, np.empty(2, np.int32))
    module.first_fit_in_place(np.ones(2, np.uint16), np.arange(2), np.zeros(1, np.int64), 1.0, 2, np.empty(2, np.int32))
    draws = np.zeros(2, np.uint16)
    module.shuffle_by_level(draws, draws, 0)
    module.shuffle_by_level(draws, np.zeros(2, np.int64), 0)
    module.shuffle_in_pools(draws, draws, 1, draws[:0])
    module.shuffle_by_level_wide(draws, draws, 0)
    module.shuffle_by_level_wide(draws, np.zeros(2, np.int64), 0)
    module.shuffle_in_pools_wide(draws, draws, 1, draws[:0])


def _cached(module: ModuleType, name: str, compile_it: Callable[[ModuleType], Any]) -> bool:
    """Whether the loop ``name`` has machine code in this process or in numba's cache. If not
    (a fresh install: a second or more of compiling), ``compile_it`` is kept for the background
    compile after the plan (:func:`planning`) and the caller runs numpy this time; only loops
    whose numpy form gives the same result call this (the stable sorts, exact reductions).
    With ``FITBATCH_JIT=1`` a loop is always compiled when called."""
    kernel = getattr(module, name)
    if kernel.signatures or _mode() == "always":  # FITBATCH_JIT=1: compiled now, as asked
        return True
    try:
        cached = bool(kernel._cache._cache_file._load_index())  # numba's own check (index and source stamp)
    except Exception:  # noqa: BLE001 - another numba's layout: compile on first use, as before
        return True
    if not cached and name not in _compiling:
        _later.setdefault(name, compile_it)
    return cached


def _compile_in_background() -> None:
    """Compile the loops :func:`_cached` set aside, in a daemon thread (numba's compiler lock
    serialises it with a plan that compiles a loop meanwhile)."""
    module = _module
    todo = list(_later.items())
    _later.clear()
    _compiling.update(name for name, _ in todo)
    if module is None or not todo:
        return

    def run() -> None:
        for name, compile_it in todo:
            try:
                compile_it(module)
            except Exception as exc:  # noqa: BLE001 - compiles again on first use
                logger.debug("compiling %s failed (%s: %s)", name, type(exc).__name__, exc)

    global _compile_thread
    _compile_thread = threading.Thread(target=run, name="fitbatch-numba-compile", daemon=True)
    _compile_thread.start()


_companions: dict[str, ModuleType | None] = {}  # further modules of loops, loaded (None: could not be)
_companion_threads: dict[str, threading.Thread] = {}
_companion_lock = threading.Lock()  # starting a thread (held for moments)
# one per module, held through its import and warm-up (a fresh install's compile: seconds), so
# loading one module never waits for another's compile
_companion_loads: dict[str, threading.Lock] = {}


def companion(name: str, warm: Callable[[ModuleType], Any] | None = None, *, now: bool = False) -> ModuleType | None:
    """A further module of compiled loops, ``fitbatch._kernels.<name>`` (numba), once loaded.

    The one loader of every compiled module beside :mod:`fitbatch._kernels.compiled`:
    ``FITBATCH_JIT=0`` never loads it; ``now`` (or ``FITBATCH_JIT=1``, or numba imported by
    the program itself) imports it and runs ``warm`` (each loop once: numba's cached machine
    code, or compiling on a fresh install) in the calling thread; otherwise a daemon thread does
    that and the caller gets ``None`` (its numpy form, with the same result) until it is done.
    A call never waits for a background load under way.

    >>> companion("no_such_module", now=True) is None
    True
    """
    mode = _mode()
    if mode == "off":
        return None
    if name in _companions:
        return _companions[name]
    if name in _companion_threads:  # under way: its thread holds the module's lock until it is done
        return None
    ahead = _aot_load(name)
    if ahead is not None:  # built ahead of time: milliseconds, at once
        _companions[name] = ahead
        return ahead
    if now or mode == "always" or _numba_imported_by_program():
        return _load_companion(name, warm)
    with _companion_lock:
        if name not in _companion_threads and name not in _companions:
            if importlib.util.find_spec("numba") is None:
                _companions[name] = None
                return None
            thread = threading.Thread(target=_load_companion, args=(name, warm), name=f"fitbatch-numba-{name}", daemon=True)
            _companion_threads[name] = thread
            thread.start()
    return None


def settle_companion(name: str) -> ModuleType | None:
    """Wait for the background load of :func:`companion` ``name`` (if under way); the module or ``None``.

    >>> settle_companion("no_such_module") is None
    True
    """
    thread = _companion_threads.get(name)
    if thread is not None:
        thread.join()
    return _companions.get(name)


def _numba_imported_by_program() -> bool:
    """numba is imported, and not by one of fitbatch's own background loads."""
    aot = sys.modules.get("fitbatch._kernels.aot")
    fell_back = aot is not None and bool(getattr(aot, "fell_back", ()))  # imported for a call no export fits
    return "numba" in sys.modules and _thread is None and not _companion_threads and not fell_back


def _load_companion(name: str, warm: Callable[[ModuleType], Any] | None) -> ModuleType | None:
    with _companion_lock:
        load = _companion_loads.setdefault(name, threading.Lock())
    with load:
        if name in _companions:
            return _companions[name]
        module: ModuleType | None = None
        if importlib.util.find_spec("numba") is not None:
            try:
                ahead = _aot_load(name)
                if ahead is not None:
                    _companions[name] = ahead
                    return ahead
                module = importlib.import_module(f"fitbatch._kernels.{name}")
                if warm is not None:
                    warm(module)
                _want_build()
            except Exception as exc:  # noqa: BLE001 - a numba that does not fit this numpy, ...
                logger.warning("the compiled loops of %s could not be loaded (%s: %s); using numpy", name, type(exc).__name__, exc)
                module = None
        _companions[name] = module
        return module


def _aot_load(name: str) -> ModuleType | None:
    """The ahead-of-time module of ``fitbatch._kernels.<name>`` where it is built (and works), else ``None``."""
    try:
        from fitbatch._kernels import aot

        module = aot.load(name)
        if module is not None and name == "compiled":
            _probe(module)
    except Exception as exc:  # noqa: BLE001 - numba's JIT (or numpy) instead, never a wrong result
        logger.debug("the ahead-of-time loops of %s are not usable (%s: %s)", name, type(exc).__name__, exc)
        return None
    return module


def _from_aot() -> None:
    """Load the compiled loops now where the ahead-of-time module is built (looked for once): it
    loads in milliseconds, so it is there from the first call (no background load). :func:`_load`
    takes it (its import looks for the same cached module first)."""
    global _aot_looked
    _aot_looked = True
    if _aot_load("compiled") is not None:
        _load()


def _want_build() -> None:
    """numba's JIT was loaded (no ahead-of-time cache): build the cache in a background process,
    after the plan under way (if any), so that later processes import it instead."""
    global _build_wanted
    if _planning:
        _build_wanted = True
        return
    _build_wanted = False
    try:
        from fitbatch._kernels import aot

        aot.build_in_background()
    except Exception as exc:  # noqa: BLE001 - no cache: numba's JIT next time too
        logger.debug("the ahead-of-time build could not start (%s: %s)", type(exc).__name__, exc)


def _kernels(work: int, wait: bool = False) -> ModuleType | None:
    """The compiled module if loaded (``work`` more samples planned now; ``None``: use numpy).

    Past ``LOAD_AT`` samples planned in this process it starts loading in the background; a
    call of ``WAIT_AT`` samples or more (or ``wait``) waits for it. ``FITBATCH_JIT=1`` loads it
    at the first call, ``FITBATCH_JIT=0`` never; numba already imported by the program (not by
    the background load) also loads it at once.
    """
    global _work, _eager
    mode = _mode()
    if mode == "off":
        return None
    _work += work
    if mode == "always" or wait or work >= WAIT_AT or (_thread is None and "numba" in sys.modules):
        _eager = True
        return _load()
    if not _tried and not _aot_looked:
        _from_aot()
    if _tried:
        return _module
    if _work >= LOAD_AT:
        global _wanted
        # during a plan: after the plan that makes LOAD_PLANS; work outside plans (streams) loads it now
        if _planning:
            _wanted = True
        else:
            _load_in_background()
    return None


def _uncount(work: int) -> None:
    """Take back ``work`` samples counted by a call that found no compiled loops and is retried."""
    global _work
    if _mode() != "off":
        _work -= work


def _exact(module: ModuleType | None, sizes: FloatArray, sums: bool) -> ModuleType | None:
    """``module`` for a loop whose result may differ from numpy's in the last rounding (running
    sums of fractional sizes: ``sums`` and sizes not all whole) only when it was asked for at a
    point fixed by the work: a plan does not depend on when the background load finished."""
    if module is None or _eager or not sums:
        return module
    return module if sizes.ndim == 1 and module.all_integral(np.ascontiguousarray(sizes, dtype=np.float64)) else None


def _cost_params(cost: CostModel) -> tuple[int, FloatArray] | None:
    kind = type(cost)
    if kind is SumCost:
        return 0, np.zeros(4)
    if kind is PaddedCost:
        return 1, np.zeros(4)
    if kind is PaddedPolynomial:
        p: Any = cost
        return 2, np.array([p.fixed, p.linear, p.per_token, p.quadratic], dtype=np.float64)
    return None


def greedy(
    sizes: FloatArray,
    budget: float,
    cost: CostModel,
    cap: float,
    force: NDArray[np.bool_] | None,
    count: int,
    max_size: Any,
    sum_size: Any,
    order: IntArray | None = None,
) -> tuple[IntArray, tuple[int, float, float]] | None:
    """Greedy starts in order and the open batch at the end, or ``None`` when not compiled.

    With ``order`` (1-D sizes only) the sequence is ``sizes[order]``, read through the order
    (no gathered copy of the sizes).
    """
    if sizes.ndim != 1:
        if order is not None:
            return None
        return _greedy_rows(sizes, budget, cost, cap, force, count, max_size, sum_size)
    params = _cost_params(cost)
    n = sizes.shape[0] if order is None else order.shape[0]
    module = _kernels(n) if params is not None else None
    module = _exact(module, sizes, type(cost) is not PaddedCost)
    if module is None or params is None:
        if order is not None and params is not None:
            _uncount(n)  # the caller gathers the sizes and asks again: these samples count once
        return None
    values = np.ascontiguousarray(sizes, dtype=np.float64)
    flags = _NO_FORCE if force is None else np.ascontiguousarray(force, dtype=np.bool_)
    index = _NO_ORDER if order is None else np.ascontiguousarray(order, dtype=np.int64)
    starts, c, m, s = module.greedy(
        values, float(budget), params[0], params[1], float(cap), flags, force is not None,
        float(count), float(max_size), float(sum_size), index, order is not None,
    )
    return starts, (int(c), m, s)


def _greedy_rows(
    sizes: FloatArray, budget: float, cost: CostModel, cap: float, force: Any, count: int, max_size: Any, sum_size: Any
) -> tuple[IntArray, tuple[int, Any, Any]] | None:
    """:func:`greedy` over ``(n, D)`` rows for :class:`Limits` of built-in column costs."""
    columns = [_cost_params(c) for c in cost.costs] if type(cost) is Limits else [None]
    module = _kernels(sizes.shape[0]) if None not in columns else None
    if module is not None and not _eager and not all(type(c) is PaddedCost for c in getattr(cost, "costs", ())):
        whole = bool(np.all(sizes == np.floor(sizes)))
        module = module if whole else None
    if module is None or type(cost) is not Limits:
        return None
    kinds = np.array([c[0] for c in columns if c is not None], dtype=np.int64)
    params = np.array([c[1] for c in columns if c is not None], dtype=np.float64)
    flags = _NO_FORCE if force is None else np.ascontiguousarray(force, dtype=np.bool_)
    starts, c, m, s = module.greedy_rows(
        np.ascontiguousarray(sizes, dtype=np.float64), float(budget), kinds, params,
        np.asarray(cost.budgets, dtype=np.float64), float(cap), flags, force is not None, float(count),
        np.asarray(max_size, dtype=np.float64).reshape(-1), np.asarray(sum_size, dtype=np.float64).reshape(-1),
    )
    return starts, (int(c), m, s)


def prefix_sum_starts(sizes: FloatArray, budget: float, room: int) -> IntArray | None:
    """:func:`fitbatch._kernels.batches.sum_starts` compiled, or ``None`` when not compiled."""
    module = _exact(_kernels(sizes.shape[0]), sizes, True)
    if module is None:
        return None
    result: IntArray = module.prefix_sum_starts(np.ascontiguousarray(sizes, dtype=np.float64), float(budget), int(room))
    return result


def first_fit_in_place(
    sizes: NDArray[Any], positions: IntArray, seg_starts: IntArray, budget: float, cap: int
) -> IntArray | None:
    """:func:`fitbatch._kernels.packing.first_fit_laid` compiled: ``sizes`` (contiguous float64,
    or whole sizes as contiguous uint16) and ``positions`` (contiguous int64) rearranged in place
    into batch order, and the batch starts; ``None`` when not compiled.

    Its Python loop costs microseconds per sample, so numba is loaded for it from ``FIRST_FIT_AT``
    samples on, not only after ``LOAD_AT``.
    """
    module = _kernels(sizes.shape[0], wait=sizes.shape[0] >= FIRST_FIT_AT)
    if module is None:
        return None
    n = sizes.shape[0]
    seg_starts = np.ascontiguousarray(seg_starts, dtype=np.int64)
    # each position's batch within its segment: a buffer as long as the longest segment
    longest = int(np.diff(seg_starts, append=n).max(initial=0)) if n else 0
    batch = np.empty(longest, dtype=np.int32 if longest < 1 << 31 else np.int64)
    starts: IntArray = module.first_fit_in_place(sizes, positions, seg_starts, float(budget), int(cap), batch)
    return starts


def shuffle_by_level(draws: NDArray[np.uint16], level: NDArray[Any], top: int) -> IntArray | None:
    """Positions stably sorted by ``draws``, then stably by ``top - level`` (compiled counting
    and radix sorts), or ``None`` when not compiled (or ``top`` not below ``2**16``, or ``2**32`` positions or more)."""
    module = _kernels(draws.shape[0]) if 0 <= top < 1 << 16 and draws.shape[0] < 1 << 32 else None
    if module is None:
        return None
    if level.dtype != np.uint16:
        level = level.astype(np.int64, copy=False)
    name = "shuffle_by_level" if draws.shape[0] >= COMPACT_AT else "shuffle_by_level_wide"
    kind = level.dtype
    if not _cached(module, name, lambda m: getattr(m, name)(np.zeros(2, np.uint16), np.zeros(2, kind), 0)):
        return None
    result: IntArray = getattr(module, name)(np.ascontiguousarray(draws), np.ascontiguousarray(level), int(top))
    return result


def shuffle_in_pools(
    draws: NDArray[np.uint16], keys: NDArray[np.uint16], pool: int, laid_keys: NDArray[np.uint16] | None = None
) -> IntArray | None:
    """Positions stably sorted by ``draws``, cut into pools of ``pool``, each stably sorted by
    descending ``keys`` (compiled counting and radix sorts), or ``None`` when not compiled
    (or ``2**32`` positions or more). ``laid_keys`` (contiguous, of n) receives the keys in
    that order, written as the positions are."""
    n = draws.shape[0]
    module = _kernels(n) if n < 1 << 32 and keys.dtype == np.uint16 else None
    if module is None:
        return None
    laid = np.zeros(0, np.uint16) if laid_keys is None else laid_keys
    name = "shuffle_in_pools" if n >= COMPACT_AT else "shuffle_in_pools_wide"
    draws16 = np.zeros(2, np.uint16)
    if not _cached(module, name, lambda m: getattr(m, name)(draws16, draws16, 1, draws16[:0])):
        return None
    result: IntArray = getattr(module, name)(np.ascontiguousarray(draws), np.ascontiguousarray(keys), int(min(pool, max(n, 1))), laid)
    return result


def batch_reduce(sizes: FloatArray, order: IntArray | None, offsets: IntArray) -> tuple[FloatArray, FloatArray] | None:
    """Max and sum of each batch of ``sizes[order]`` (``order=None``: ``sizes``) cut at
    ``offsets``, whole-number 1-D sizes only, read in place; ``None`` when not compiled or
    when numpy's pairwise sums could differ (a sum of 2**53 or more, -0.0, an empty batch)."""
    module = _kernels(0) if sizes.ndim == 1 else None
    if module is None or not _cached(module, "batch_reduce", _compile_batch_reduce):
        return None
    index = _NO_ORDER if order is None else np.ascontiguousarray(order, dtype=np.int64)
    mx, sm, exact = module.batch_reduce(
        np.ascontiguousarray(sizes, dtype=np.float64), index, order is not None, np.ascontiguousarray(offsets, dtype=np.int64)
    )
    return (mx, sm) if exact else None


def _compile_batch_reduce(module: ModuleType) -> None:
    module.batch_reduce(np.ones(2), _NO_ORDER, False, np.array([0, 2], dtype=np.int64))


def walk_runs(
    cuts: IntArray, run_end: IntArray, is_seg: NDArray[np.bool_], seg_end: IntArray, tab: IntArray, cut_tab: IntArray
) -> IntArray | None:
    """:func:`fitbatch._kernels.batches._walk_table`'s walk compiled (integer steps: the same
    starts), or ``None`` when not compiled."""
    module = _kernels(0)
    if module is None:
        return None
    result: IntArray = module.walk_runs(
        *(np.ascontiguousarray(a, dtype=np.int64) for a in (cuts, run_end)), np.ascontiguousarray(is_seg, dtype=np.bool_),
        *(np.ascontiguousarray(a, dtype=np.int64) for a in (seg_end, tab, cut_tab)),
    )
    return result


def all_integral(sizes: FloatArray) -> bool:
    """Whether every size is a whole number (one compiled pass; numpy's floor and compare else)."""
    module = _kernels(0) if sizes.ndim == 1 else None
    if module is None:
        return bool(np.all(sizes == np.floor(sizes)))
    return bool(module.all_integral(np.ascontiguousarray(sizes, dtype=np.float64)))


def run_totals(
    sizes: FloatArray, cuts: IntArray, cost: CostModel, budget: float, base: tuple[int, int, float, float, int]
) -> tuple[IntArray, FloatArray, FloatArray, IntArray] | None:
    """Running (items, real units, padded units, batches over budget) after each batch
    ``sizes[cuts[b]:cuts[b + 1]]`` added to ``base`` (a stream's totals), or ``None``."""
    params = _cost_params(cost)
    module = _exact(_kernels(0), sizes, True) if params is not None and sizes.ndim == 1 else None
    if module is None or params is None:
        return None
    _, e0, r0, p0, o0 = base
    result: tuple[IntArray, FloatArray, FloatArray, IntArray] = module.run_totals(
        np.ascontiguousarray(sizes, dtype=np.float64), cuts, params[0], params[1], float(budget),
        int(e0), float(r0), float(p0), int(o0),
    )
    return result
