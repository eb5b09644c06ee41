"""An ahead-of-time cache of the compiled loops: extension modules that load without numba.

With the ``fast`` extra, :mod:`fitbatch._kernels.jit` loads the numba loops of
:mod:`fitbatch._kernels.compiled`, :mod:`fitbatch._kernels.compiled_histogram` and
:mod:`fitbatch._kernels.steps`; even from numba's on-disk cache a process pays 0.6-1.2 s for
that (importing numba, initialising its target, loading the machine code) before its first
compiled call. This module compiles the same loops once, ahead of time, with
:mod:`numba.pycc`, into one extension module per kernel module, which a later process imports
in milliseconds without importing numba. ``numba.pycc`` is deprecated upstream: where it is gone
(or fails) the build fails and the loader uses numba's JIT as before.

What is exported is read from the dispatchers, not from a list kept here: the builder
(:mod:`fitbatch._kernels.aot_build`, a separate process) runs the loader's warm-up calls and a
small workload of plans, packings and partitions under ``FITBATCH_JIT=1``, then exports every
signature numba compiled for each public kernel (``name__0``, ``name__1``, ...). The loaded
module holds, per kernel, a small shim that checks the argument types against those signatures
(dtype, dimensions, layout, writable) and calls the matching export; a call no signature
matches (an unexpected dtype or layout) goes to the numba dispatcher instead (imported then),
never to machine code built for other types. The machine code comes from the same loops through
the same compiler, so a plan or partition is the same with this cache, with numba's JIT, and in
numpy (``FITBATCH_JIT=0``).

The cache lives in ``$FITBATCH_CACHE_DIR/aot/<key>/`` (else ``$XDG_CACHE_HOME/fitbatch/aot``,
else ``~/.cache/fitbatch/aot``), ``<key>`` naming the fitbatch, numba and numpy versions, the
Python and platform tags and a hash of the kernel sources and the loader, so a changed kernel or
an upgraded numba builds a new one (old folders stay: delete them at will). A process that had
to load numba's JIT starts a build in a background process after its plan (``nice``, its own
session; an ``O_EXCL`` lock file so the ranks of a node build it once);
``python -m fitbatch._kernels.aot_build`` builds it now, at install time (``--print-path``: the
folder). ``FITBATCH_AOT=0`` turns the cache off (neither loaded nor built), ``FITBATCH_JIT=0``
every compiled loop. The machine code is for a generic CPU of the platform (pycc's default), so
a cache folder shared by unlike nodes still runs.

>>> isinstance(key(), (str, type(None)))
True
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import re
import sys
import sysconfig
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: the kernel modules (``fitbatch._kernels.<name>``) compiled ahead of time
MODULES = ("compiled", "compiled_histogram", "steps")
#: extension module names are ``PREFIX + name``
PREFIX = "fitbatch_aot_"
MANIFEST = "manifest.json"
#: a lock file older than this (seconds) is a build that died: taken over
STALE_LOCK = 1800.0

_HERE = Path(__file__).resolve().parent
_key: list[str | None] = []  # computed once per process
_loaded: dict[str, types.ModuleType | None] = {}
_load_lock = threading.Lock()
_spawned: list[Any] = []  # the background build started by this process
#: kernels whose calls went to numba's dispatcher (no export matched); numba was imported for them
fell_back: set[str] = set()


def enabled() -> bool:
    """Whether the cache may be used: ``FITBATCH_AOT`` and ``FITBATCH_JIT`` are not ``0``.

    >>> enabled() in (True, False)
    True
    """
    off = ("0", "false", "no", "off")
    return (os.environ.get("FITBATCH_AOT", "1").strip().lower() not in off
            and os.environ.get("FITBATCH_JIT", "auto").strip().lower() not in off)


def cache_root() -> Path:
    """The folder that holds one subfolder per cache key.

    >>> cache_root().name
    'aot'
    """
    base = os.environ.get("FITBATCH_CACHE_DIR")
    if base:
        return Path(base).expanduser() / "aot"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "fitbatch" / "aot"


def key() -> str | None:
    """The cache key of this install (``None`` without numba: the ``fast`` extra builds the cache).

    Versions of fitbatch, numba and numpy, the interpreter's tag, the platform, and a hash of
    every module of :mod:`fitbatch._kernels` (the loops, the loader's warm-up calls, the
    builder) and numba's version file: read from files, nothing imported.
    """
    if not _key:
        _key.append(_compute_key())
    return _key[0]


def _compute_key() -> str | None:
    spec = importlib.util.find_spec("numba")
    if spec is None or spec.origin is None:
        return None
    h = hashlib.sha256()
    try:
        numba_version = (Path(spec.origin).parent / "_version.py").read_bytes()
        # every module of the kernels' package (a compiled loop may call one in another module)
        for path in sorted(_HERE.glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    except OSError:
        return None
    h.update(numba_version)
    found = re.search(rb'"version": "([^"]+)"', numba_version)
    numba = found.group(1).decode() if found else "unknown"
    init = (_HERE.parent / "__init__.py").read_text()  # (importing fitbatch here would be a cycle)
    version = re.search(r'__version__ = "([^"]+)"', init)
    tag = f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}".replace(os.sep, "_")
    return f"{version.group(1) if version else 'unknown'}-numba{numba}-numpy{np.__version__}-{tag}-{h.hexdigest()[:16]}"


def directory() -> Path | None:
    """The cache folder of this install's key (whether built or not), or ``None`` without numba."""
    k = key()
    return None if k is None else cache_root() / k


def available() -> bool:
    """Whether the cache of this key is built (its manifest is there)."""
    d = directory()
    return d is not None and (d / MANIFEST).is_file()


def load(name: str) -> types.ModuleType | None:
    """The ahead-of-time module of ``fitbatch._kernels.<name>`` (a module of shims with the
    kernels' names), or ``None``: disabled, not built, or it failed to load (logged at debug)."""
    if not enabled():
        return None
    with _load_lock:
        if name not in _loaded:
            _loaded[name] = _load(name)
        return _loaded[name]


def _load(name: str) -> types.ModuleType | None:
    d = directory()
    if d is None or not (d / MANIFEST).is_file():
        return None
    try:
        manifest = json.loads((d / MANIFEST).read_text())
        entry = manifest["modules"][name]
        ext = _import_extension(PREFIX + name, d / entry["file"])
        return _shims(name, ext, entry["kernels"])
    except Exception as exc:  # noqa: BLE001 - a corrupt or foreign file: numba's JIT instead
        logger.debug("the ahead-of-time loops of %s could not be loaded from %s (%s: %s); using numba", name, d, type(exc).__name__, exc)
        return None


def _import_extension(module_name: str, path: Path) -> types.ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(module_name, str(path))
    spec = importlib.util.spec_from_file_location(module_name, str(path), loader=loader)
    if spec is None:
        raise ImportError(f"no module spec for {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


# numba's type names of the arguments a shim can check -> (dtype or scalar kind)
_SCALARS = {"int64": "(type({a}) is int or type({a}) is _np.int64)",
            "float64": "(type({a}) is float or type({a}) is _np.float64)",
            "bool": "(type({a}) is bool or type({a}) is _np.bool_)"}
_DTYPES = {"float64", "float32", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool"}


def _spec_of(t: Any) -> dict[str, Any] | None:
    """A JSON-able description of one numba argument type, or ``None`` where a shim could not check it."""
    from numba.core import types as nt

    if isinstance(t, nt.Array):
        dtype = str(t.dtype)
        if dtype not in _DTYPES or t.layout not in ("C", "F", "A"):
            return None
        return {"array": dtype, "ndim": t.ndim, "layout": t.layout, "readonly": not t.mutable, "aligned": t.aligned}
    name = "bool" if isinstance(t, nt.Boolean) else str(t)
    return {"scalar": name} if name in _SCALARS else None


def _check(a: str, spec: dict[str, Any]) -> str:
    """Python source that is true when argument ``a`` has exactly the type ``spec`` (numba's typeof)."""
    if "scalar" in spec:
        return _SCALARS[spec["scalar"]].format(a=a)
    parts = [f"type({a}) is _nd", f"({a}.dtype is _dt[{spec['array']!r}] or {a}.dtype == _dt[{spec['array']!r}])", f"{a}.ndim == {spec['ndim']}"]
    layout = spec["layout"]
    if layout == "C":
        parts.append(f"{a}.flags.c_contiguous")
    elif layout == "F":  # numba types a C-and-F-contiguous array as C
        parts.append(f"{a}.flags.f_contiguous and not {a}.flags.c_contiguous")
    if not spec["readonly"]:  # (a read-only parameter takes a writable array too: the loop never writes it)
        parts.append(f"{a}.flags.writeable")
    if spec["aligned"]:
        parts.append(f"{a}.flags.aligned")
    return "(" + " and ".join(parts) + ")"


def _shims(name: str, ext: types.ModuleType, kernels: dict[str, list[list[Any]]]) -> types.ModuleType:
    """A module with one function per kernel: the export whose signature the arguments match,
    else the numba dispatcher (imported then, logged at debug)."""
    module = types.ModuleType(f"fitbatch._kernels.aot.{name}", f"ahead-of-time loops of fitbatch._kernels.{name}")
    dtypes = {d: np.dtype(d) for d in _DTYPES}
    for kernel, exports in kernels.items():
        arity = {len(specs) for _, specs in exports}
        if len(arity) != 1:
            continue
        args = ", ".join(f"a{i}" for i in range(arity.pop()))
        lines = [f"def {kernel}({args}):"]
        scope: dict[str, Any] = {"_nd": np.ndarray, "_np": np, "_dt": dtypes, "_fallback": _fallback(name, kernel)}
        for i, (export, specs) in enumerate(exports):
            scope[f"_e{i}"] = getattr(ext, export)
            cond = " and ".join(_check(f"a{j}", s) for j, s in enumerate(specs)) or "True"
            lines.append(f"    if {cond}:\n        return _e{i}({args})")
        lines.append(f"    return _fallback({args})")
        exec("\n".join(lines), scope)  # noqa: S102 - source built here from the manifest's type names
        shim = scope[kernel]
        shim.signatures = tuple(export for export, _ in exports)  # jit._cached: machine code is here
        shim.__module__ = module.__name__
        setattr(module, kernel, shim)
    return module


def _fallback(name: str, kernel: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if kernel not in fell_back:
            logger.debug("%s.%s: no ahead-of-time export for these argument types; numba's JIT compiles it", name, kernel)
            fell_back.add(kernel)
        module = importlib.import_module(f"fitbatch._kernels.{name}")
        return getattr(module, kernel)(*args)

    return call


# --- building -----------------------------------------------------------------------------


def build(target: Path | None = None, workload: Callable[[], Any] | None = None) -> Path | None:
    """Build the cache of this key now, in a fresh process with ``FITBATCH_JIT=1`` and
    ``FITBATCH_AOT=0`` after running ``workload`` (as :mod:`fitbatch._kernels.aot_build` runs
    it: it imports numba and compiles); the folder, or ``None`` where another process holds the lock. Raises where the build fails.

    ``target`` defaults to :func:`directory`. Built in a temporary folder beside it and renamed
    into place, so a reader sees all of it or none.
    """
    import shutil
    import tempfile

    target = target if target is not None else directory()
    if target is None:
        raise RuntimeError("numba is not installed: install the fast extra (pip install 'fitbatch[fast]')")
    if (target / MANIFEST).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f"{target.name}.lock") as mine:
        if not mine:
            return None
        if (target / MANIFEST).is_file():
            return target
        for left in target.parent.glob(f".{target.name}.*"):  # a killed build's (the lock is ours)
            shutil.rmtree(left, ignore_errors=True)
        start = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            from numba.pycc.platform import Toolchain

            Toolchain()  # no C compiler: fail now, before the workload compiles anything
            if workload is not None:
                workload()
            manifest = _compile_all(tmp)
            manifest["seconds"] = round(time.perf_counter() - start, 1)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
            tmp.chmod(0o755)  # (mkdtemp's 0700: readable like the rest of the cache)
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        logger.info("built the ahead-of-time loops in %s (%.1f s)", target, time.perf_counter() - start)
        return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[bool]:
    """An ``O_EXCL`` lock file (taken over when older than ``STALE_LOCK``): yields whether it is ours."""
    fd = -1
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime > STALE_LOCK:
                    path.unlink()
                    continue
            except OSError:
                continue
            break
    if fd < 0:
        yield False
        return
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield True
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def _compile_all(out: Path) -> dict[str, Any]:
    """One extension module per kernel module in ``out``, exporting every signature numba
    compiled in this process for each public kernel; the manifest (what is exported, what not)."""
    import importlib

    from numba.core.registry import CPUDispatcher
    from numba.pycc import CC

    manifest: dict[str, Any] = {"key": out.name, "modules": {}, "skipped": {}}
    for name in MODULES:
        source = importlib.import_module(f"fitbatch._kernels.{name}")
        cc = CC(PREFIX + name, source_module=source)
        cc.output_dir = str(out)
        cc.verbose = False
        kernels: dict[str, list[list[Any]]] = {}
        for kernel, dispatcher in sorted(vars(source).items()):
            if kernel.startswith("_") or not isinstance(dispatcher, CPUDispatcher):
                continue
            _read_only_variants(dispatcher)
            exports: list[list[Any]] = []
            for i, sig in enumerate(dispatcher.nopython_signatures):
                specs = [_spec_of(t) for t in sig.args]
                if any(s is None for s in specs):
                    manifest["skipped"][f"{name}.{kernel}{sig}"] = "argument types a shim cannot check"
                    continue
                export = f"{kernel}__{i}"
                cc.export(export, sig)(dispatcher.py_func)
                exports.append([export, specs])
            if exports:
                kernels[kernel] = exports
            else:
                manifest["skipped"][f"{name}.{kernel}"] = "never called by the workload"
        if not kernels:
            continue
        cc.compile()
        files = [p.name for p in out.iterdir() if p.name.startswith(PREFIX + name + ".") and p.suffix in (".so", ".pyd")]
        if not files:
            raise RuntimeError(f"pycc wrote no extension module for {name}")
        manifest["modules"][name] = {"file": files[0], "kernels": kernels}
    return manifest


def _read_only_variants(dispatcher: Any) -> None:
    """Compile each signature again with every array read-only where numba accepts it (its
    typing rejects a loop that writes one): a user's read-only sizes (``np.load(mmap_mode="r")``)
    then find an export (the shim passes writable arrays to those parameters too)."""
    from numba.core import types as nt

    for sig in list(dispatcher.nopython_signatures):
        args = tuple(t.copy(readonly=True) if isinstance(t, nt.Array) and t.mutable else t for t in sig.args)
        if args == tuple(sig.args) or args in dispatcher.overloads:
            continue
        try:
            dispatcher.compile(args)
        except Exception:  # noqa: BLE001, S112 - the loop writes an argument: no read-only variant
            continue


def build_in_background() -> bool:
    """Start ``python -m fitbatch._kernels.aot_build`` in a detached, low-priority process
    (once per process; nothing when disabled, built, or another process holds the lock).
    Whether one was started."""
    import subprocess

    if _spawned or not enabled():
        return False
    d = directory()
    if d is None or (d / MANIFEST).is_file() or (d.parent / f"{d.name}.lock").exists():
        return False
    try:
        popen = subprocess.Popen(
            [sys.executable, "-m", "fitbatch._kernels.aot_build", "--quiet"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
            preexec_fn=_lower_priority if os.name == "posix" else None,  # noqa: PLW1509 - nice only
        )
    except OSError as exc:
        logger.debug("could not start the ahead-of-time build (%s: %s)", type(exc).__name__, exc)
        return False
    _spawned.append(popen)
    # reaped when it ends (no zombie left while this process runs on)
    threading.Thread(target=popen.wait, name="fitbatch-aot-build", daemon=True).start()
    logger.debug("building the ahead-of-time loops in the background (pid %d) into %s", popen.pid, d)
    return True


def _lower_priority() -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(OSError):
        os.nice(19)
