"""Shared test setup: a seeded hypothesis profile, the tests folder on sys.path, real data."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"
if str(TESTS) not in sys.path:  # `import contracts`, `import reference` from any test module
    sys.path.insert(0, str(TESTS))

# Derandomized: a failure replays from the log, and the suite's run time is stable (STYLE 14).
settings.register_profile(
    "fitbatch",
    max_examples=40,
    deadline=None,
    derandomize=True,
    print_blob=True,
    database=None,  # nothing written into the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# A deeper search on demand (not in CI): FITBATCH_HYPOTHESIS=hunt, random examples, HUNT_EXAMPLES
# of them (default 300) per property (a test's own max_examples still wins).
settings.register_profile(
    "hunt",
    parent=settings.get_profile("fitbatch"),
    max_examples=int(os.environ.get("HUNT_EXAMPLES", "300")),
    derandomize=False,
)
settings.load_profile(os.environ.get("FITBATCH_HYPOTHESIS", "fitbatch"))

# No ahead-of-time cache of the compiled loops (fitbatch._kernels.aot) unless a test asks for one:
# a plan that loads numba's JIT would start building it in the background (a minute of CPU),
# and one built earlier in ~/.cache would stand in for the numba loops the tests compare.
# Subprocesses inherit it; tests/test_aot.py builds its own cache in a tmp folder.
os.environ.setdefault("FITBATCH_AOT", "0")


def load_lengths(name: str) -> np.ndarray:
    """A real length set copied into tests/data (see /work/shared/data/README.md)."""
    return np.load(DATA / f"cpython_stdlib_{name}.npy")


@pytest.fixture(scope="session")
def pytokens() -> np.ndarray:
    """Tokens per .py file of the CPython 3.11.7 stdlib (1,759 files, long-tailed)."""
    return load_lengths("pytokens")


@pytest.fixture(scope="session")
def functions() -> np.ndarray:
    """Tokens per function of the same stdlib (58,754 functions)."""
    return load_lengths("functions")


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for a module (two shared cores: spinning threads cost 10x)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """cli.main configures logging for its process (a handler, a de-duplicating filter on every
    root handler, the root level): undo it, so in-process runs leave later tests' logs alone."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    filters = {h: list(h.filters) for h in handlers}
    yield
    for handler in list(root.handlers):
        if handler not in filters:
            root.removeHandler(handler)
    for handler, kept in filters.items():
        handler.filters[:] = kept
    root.setLevel(level)
