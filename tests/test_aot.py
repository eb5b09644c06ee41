"""The ahead-of-time cache of the compiled loops (``fitbatch._kernels.aot``) gives numba's and numpy's results.

One cache is built per session into a tmp folder (``python -m fitbatch._kernels.aot_build``, as a
user would at install time); plans and partitions are compared with its loops, numba's JIT and
numpy, in this process (the modules swapped in :mod:`fitbatch._kernels.jit`) and in fresh
processes (where the cache is found as a user's process finds it, and numba is never imported).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from contracts import jit_mode

from fitbatch._kernels import aot
from fitbatch._kernels import jit as _jit
from fitbatch.steps import partition

numba = pytest.importorskip("numba", reason="the fast extra (numba) is not installed")

TESTS = Path(__file__).resolve().parent

# every strategy, padded and sum costs, whole and fractional sizes, a few epochs, and sum-cost
# packing on the length histogram (the pattern layout loops); run here and in fresh processes
PLANS = """
import hashlib
import numpy as np
import fitbatch

def plans_digest(n):
    rng = np.random.default_rng(7)
    ints = np.clip(np.ceil(rng.lognormal(5.0, 1.0, n)), 1, 4000)
    h = hashlib.sha256()
    for sizes in (ints, ints * 0.75 + 0.125):
        for strategy in ("sequential", "sorted", "pooled", "buckets", "packed"):
            for cost in ("padded", "sum"):
                for epoch in range(3):
                    plan = fitbatch.plan_batches(sizes, 8192, cost=cost, strategy=strategy, epoch=epoch)
                    for a in (plan.order, plan.offsets):
                        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    hist = np.clip(np.ceil(np.random.default_rng(1).lognormal(3.5, 0.8, 70_000)), 1, 128).astype(np.int64)
    for epoch in range(2):
        plan = fitbatch.plan_batches(hist, 128, cost="sum", strategy="packed", epoch=epoch)
        for a in (plan.order, plan.offsets, plan.counts):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return h.hexdigest()
"""
N = 60_000

FRESH = PLANS + """
import json, sys
from fitbatch._kernels import aot, jit
from fitbatch.steps import partition
digest = plans_digest({n})
p = partition(np.arange(1, 3001) % 500 + 1, 4096.0, world=8, cost="sum")
print(json.dumps({{"digest": digest, "numba": "numba" in sys.modules, "module": getattr(jit._module, "__name__", None),
                  "steps": getattr(jit._companions.get("steps"), "__name__", None), "fell_back": sorted(aot.fell_back),
                  "partition": hashlib.sha256(p.order.tobytes() + p.offsets.tobytes()).hexdigest()}}))
"""


def _exec_plans() -> Any:
    scope: dict[str, Any] = {}
    exec(PLANS, scope)  # noqa: S102 - the same source the fresh processes run
    return scope["plans_digest"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache root (``FITBATCH_CACHE_DIR``) with this install's cache built, as a user builds it
    (``fitbatch compile``)."""
    from numba.pycc.platform import Toolchain

    try:
        Toolchain()
    except Exception as exc:  # noqa: BLE001 - only a machine without a C compiler (CI has one)
        pytest.skip(f"numba.pycc finds no C compiler here ({exc}); the cache cannot be built")
    root = tmp_path_factory.mktemp("fitbatch-cache")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "fitbatch", "compile"],  # as the install notes say
                         env={**os.environ, "FITBATCH_CACHE_DIR": str(root)}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    built = list((root / "aot").glob("*/manifest.json"))
    assert len(built) == 1, list((root / "aot").iterdir())
    manifest = json.loads(built[0].read_text())
    sys.stderr.write(f"\n[aot] built in {time.perf_counter() - start:.1f} s: {sorted(manifest['modules'])}\n")
    return root


@pytest.fixture(scope="module")
def ahead(cache: Path) -> dict[str, ModuleType]:
    """The cache's three modules, loaded in this process."""
    with _env(FITBATCH_AOT="1", FITBATCH_CACHE_DIR=str(cache)):
        aot._loaded.clear()
        modules = {name: aot.load(name) for name in aot.MODULES}
    assert all(m is not None for m in modules.values()), modules
    return modules  # type: ignore[return-value]


@contextlib.contextmanager
def _env(**values: str | None) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _loops(modules: dict[str, ModuleType]) -> Iterator[None]:
    """``FITBATCH_JIT=1`` with these modules as the compiled loops (and companions)."""
    saved = (_jit._module, _jit._tried, _jit._eager, _jit._aot_looked, dict(_jit._companions))
    _jit._module, _jit._tried, _jit._aot_looked = modules["compiled"], True, True
    _jit._companions.clear()
    _jit._companions.update({k: v for k, v in modules.items() if k != "compiled"})
    try:
        with jit_mode("1"):
            yield
    finally:
        _jit._module, _jit._tried, _jit._eager, _jit._aot_looked = saved[:4]
        _jit._companions.clear()
        _jit._companions.update(saved[4])


def _jit_modules() -> dict[str, ModuleType]:
    return {name: importlib.import_module(f"fitbatch._kernels.{name}") for name in aot.MODULES}


def _fresh(code: str, **env: str) -> dict[str, Any]:
    run_env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_every_kernel_the_loader_uses_is_exported(cache: Path) -> None:
    manifest = json.loads(next((cache / "aot").glob("*/manifest.json")).read_text())
    for name in aot.MODULES:
        source = importlib.import_module(f"fitbatch._kernels.{name}")
        public = {k for k, v in vars(source).items() if not k.startswith("_") and hasattr(v, "py_func")}
        assert set(manifest["modules"][name]["kernels"]) == public, name


def test_plans_are_the_same_with_the_cache_numba_and_numpy(ahead: dict[str, ModuleType]) -> None:
    """Eager (``FITBATCH_JIT=1``): the cache's loops against numba's, fractional sums included
    (numpy: the fresh-process test below, where the rule for the last rounding applies)."""
    plans_digest = _exec_plans()
    with _loops(_jit_modules()):
        jitted = plans_digest(N)
    aot.fell_back.clear()
    with _loops(ahead):
        ahead_of_time = plans_digest(N)
    assert not aot.fell_back  # every call found its export
    assert ahead_of_time == jitted


def test_the_exports_are_called(ahead: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch) -> None:
    called: set[str] = set()
    for name, module in ahead.items():
        for kernel in [k for k in vars(module) if not k.startswith("_")]:
            shim = getattr(module, kernel)

            def counted(*args: Any, _shim: Any = shim, _name: str = f"{name}.{kernel}") -> Any:
                called.add(_name)
                return _shim(*args)

            counted.signatures = shim.signatures  # type: ignore[attr-defined]
            monkeypatch.setattr(module, kernel, counted)
    with _loops(ahead):
        _exec_plans()(20_000)
        partition(np.arange(1, 3001) % 500 + 1, 4096.0, world=8, cost="sum")
    assert {"compiled.greedy", "compiled.first_fit_in_place", "compiled_histogram.lay_out_sequence",
            "steps.partition_pool"} <= called, sorted(called)


def test_partitions_are_pinned_with_the_cache(ahead: dict[str, ModuleType]) -> None:
    from test_steps_compiled import DIGEST, _digest

    aot.fell_back.clear()
    with _loops(ahead):
        assert _digest() == DIGEST
    assert not aot.fell_back


def test_a_fresh_process_plans_with_the_cache_and_without_numba(cache: Path) -> None:
    """Found as a user's process finds it: the first plan uses it, numba is never imported,
    and the plans are numpy's (the rule for the last rounding holds as with numba's JIT)."""
    got = _fresh(FRESH.format(n=N), FITBATCH_CACHE_DIR=str(cache), FITBATCH_AOT="1")
    assert got["numba"] is False
    assert got["module"] == "fitbatch._kernels.aot.compiled"
    assert got["steps"] == "fitbatch._kernels.aot.steps"
    assert got["fell_back"] == []
    plain = _fresh(FRESH.format(n=N), FITBATCH_JIT="0")
    assert got["digest"] == plain["digest"]
    assert got["partition"] == plain["partition"]


def test_a_corrupt_module_falls_back_to_numba(cache: Path, tmp_path: Path) -> None:
    copy = tmp_path / "aot"
    shutil.copytree(cache / "aot", copy)
    (so,) = next(copy.iterdir()).glob(f"{aot.PREFIX}compiled.*")
    so.write_bytes(b"not an extension module")
    got = _fresh(FRESH.format(n=20_000), FITBATCH_CACHE_DIR=str(tmp_path), FITBATCH_AOT="1", FITBATCH_JIT="1")
    assert got["module"] == "fitbatch._kernels.compiled"  # numba's JIT
    assert got["steps"] == "fitbatch._kernels.aot.steps"  # the intact module still loads
    plain = _fresh(FRESH.format(n=20_000), FITBATCH_JIT="1", FITBATCH_AOT="0")
    assert got["digest"] == plain["digest"]


def test_arguments_no_export_fits_go_to_numba(ahead: dict[str, ModuleType]) -> None:
    """A dtype, layout or read-only array the exports were not built for runs numba's
    dispatcher (never machine code built for other types)."""
    aot.fell_back.clear()
    module = ahead["compiled"]
    assert module.all_integral(np.ones(3)) is True
    assert not aot.fell_back
    assert module.all_integral(np.array([1.0, 2.5], dtype=np.float32)) is False
    assert module.all_integral(np.ones(6)[::2]) is True  # not contiguous
    assert aot.fell_back == {"all_integral"}
    aot.fell_back.clear()


def test_read_only_arrays_find_the_read_only_exports(ahead: dict[str, ModuleType]) -> None:
    """Where a loop never writes its arrays a read-only variant is exported (read-only sizes
    from np.load(mmap_mode="r")); where it writes one (in-place first fit) there is none."""
    frozen = np.ones(3)
    frozen.flags.writeable = False
    aot.fell_back.clear()
    assert ahead["compiled"].all_integral(frozen) is True
    assert not aot.fell_back
    shims = ahead["compiled"]
    assert len(shims.greedy.signatures) == 2
    assert len(shims.first_fit_in_place.signatures) == 2  # float64 sizes, and whole sizes as 16-bit keys


def test_off_switches(cache: Path) -> None:
    aot._loaded.clear()
    try:
        with _env(FITBATCH_CACHE_DIR=str(cache), FITBATCH_AOT="0"):
            assert aot.load("compiled") is None
        with _env(FITBATCH_CACHE_DIR=str(cache), FITBATCH_AOT="1", FITBATCH_JIT="0"):
            assert aot.load("compiled") is None
            assert _jit.companion("steps") is None
    finally:
        aot._loaded.clear()


def test_a_missing_compiler_leaves_no_cache(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "fitbatch._kernels.aot_build", "--quiet", "--dir", str(tmp_path / "k")],
                         env={**os.environ, "CC": str(tmp_path / "no-such-cc")}, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "compiler" in out.stderr
    assert list(tmp_path.iterdir()) == []  # no folder, no temporary folder, no lock left


def test_a_held_lock_means_another_process_builds(tmp_path: Path) -> None:
    (tmp_path / "k.lock").write_text("1")
    assert aot.build(tmp_path / "k") is None
    assert not (tmp_path / "k").exists()


def test_a_process_that_loads_numba_starts_the_build_after_its_plan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    started: list[list[str]] = []

    class Popen:
        pid = 0

        def __init__(self, args: list[str], **kw: Any) -> None:
            assert kw["start_new_session"] is True
            started.append(args)

    monkeypatch.setattr(subprocess, "Popen", Popen)
    monkeypatch.setattr(aot, "_spawned", [])
    with _env(FITBATCH_CACHE_DIR=str(tmp_path), FITBATCH_AOT="1"):
        with _jit.planning():
            _jit._want_build()  # as _import does when it loads numba's JIT
            assert started == []  # not during the plan
        assert started == [[sys.executable, "-m", "fitbatch._kernels.aot_build", "--quiet"]]
        _jit._want_build()
        assert len(started) == 1  # once per process
    with _env(FITBATCH_CACHE_DIR=str(tmp_path), FITBATCH_AOT="0"):
        monkeypatch.setattr(aot, "_spawned", [])
        assert aot.build_in_background() is False


def test_the_key_follows_every_kernel_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop may call one in another module of the package: editing any module makes a new key."""
    import shutil

    copy = tmp_path / "_kernels"
    shutil.copytree(Path(aot.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(Path(aot.__file__).parents[1] / "__init__.py", tmp_path / "__init__.py")
    monkeypatch.setattr(aot, "_HERE", copy)
    before = aot._compute_key()
    assert before is not None
    (copy / "greedy.py").write_text((copy / "greedy.py").read_text() + "\n# edited\n")
    after = aot._compute_key()
    assert after is not None and after != before
    assert after.rsplit("-", 1)[0] == before.rsplit("-", 1)[0]  # the same versions and platform
