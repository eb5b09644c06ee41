"""Real example data with no download: token lengths of the running Python's standard library."""

from __future__ import annotations

import ast
import logging
import os
import sysconfig
import tokenize
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)


def stdlib_files(include_tests: bool = False) -> list[Path]:
    """The standard library's ``.py`` files, sorted (``site-packages`` and ``test/`` excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if "site-packages" in rel or (not include_tests and rel[0] in ("test", "idlelib", "lib2to3")):
            continue
        out.append(path)
    return out


def _function_lengths(path: Path) -> list[int]:
    """Tokens per function of one file (tokens starting on the function's lines)."""
    try:
        source = path.read_bytes()
        with open(path, "rb") as fh:
            lines = [t.start[0] for t in tokenize.tokenize(fh.readline) if t.type not in (tokenize.ENCODING, tokenize.ENDMARKER)]
        tree = ast.parse(source)
    except (SyntaxError, tokenize.TokenError, UnicodeDecodeError, ValueError):
        return []
    starts = np.asarray(lines, dtype=np.int64)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            lo = np.searchsorted(starts, node.lineno, side="left")
            hi = np.searchsorted(starts, node.end_lineno, side="right")
            out.append(int(hi - lo))
    return out


def stdlib_function_lengths(workers: int | None = None, limit: int | None = None) -> np.ndarray:
    """Token count of every function of the standard library (sizes for the demo)."""
    files = stdlib_files()[:limit]
    workers = workers or min(4, os.cpu_count() or 1)
    if workers > 1 and len(files) > 50:
        with ProcessPoolExecutor(workers) as pool:
            parts = list(pool.map(_function_lengths, files, chunksize=16))
    else:
        parts = [_function_lengths(p) for p in files]
    lengths = np.asarray([n for part in parts for n in part if n > 0], dtype=np.int64)
    logger.info("tokenised %d standard-library files: %d functions", len(files), lengths.size)
    return lengths
