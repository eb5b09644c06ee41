"""The only place where (seed, epoch, purpose, rank) become a numpy ``Generator``.

Random streams are keyed, never derived by arithmetic: the spawn key of a ``SeedSequence`` is
``(epoch, purpose[, extra...])``, so epoch 3 of seed 7 never collides with epoch 4 of seed 6, and
the global plan never depends on the rank or the world size.
"""

from __future__ import annotations

import numbers
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

# numpy.random (~13 ms of imports: bit generators, secrets, hashlib) loads with the first
# generator or SeedSequence, not with ``import fitbatch``: a plan that draws nothing never loads it
if TYPE_CHECKING:
    SeedLike = int | np.random.SeedSequence | None
else:

    def __getattr__(name: str) -> Any:
        if name == "SeedLike":  # built on first use (it names numpy.random.SeedSequence)
            global SeedLike
            SeedLike = int | np.random.SeedSequence | None
            return SeedLike
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Purposes are hashed to stable ints so adding a purpose never shifts another's stream.
_PURPOSE_CACHE: dict[str, int] = {}


def _purpose_id(purpose: str) -> int:
    if purpose not in _PURPOSE_CACHE:
        _PURPOSE_CACHE[purpose] = zlib.crc32(purpose.encode())
    return _PURPOSE_CACHE[purpose]


def resolve_seed(seed: SeedLike) -> int:
    """Turn a seed into the int entropy that state dicts store.

    ``None`` draws fresh entropy once; the drawn value is returned so the run stays
    reproducible from its saved state.

    Args:
        seed: an int >= 0, a root ``numpy.random.SeedSequence``, or ``None``.

    Returns:
        The int entropy.

    Raises:
        TypeError: for anything else (bools included).
        ValueError: a negative int, or a spawned ``SeedSequence``.

    >>> resolve_seed(7), resolve_seed(np.random.SeedSequence(7))
    (7, 7)
    >>> drawn = resolve_seed(None)
    >>> int(generator(drawn, 0, "shuffle").integers(100)) == int(generator(drawn, 0, "shuffle").integers(100))
    True
    >>> resolve_seed(-1)
    Traceback (most recent call last):
    ...
    ValueError: seed must be >= 0, got -1
    """
    if seed is None:
        return int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed!r}")
        return int(seed)
    if isinstance(seed, np.random.SeedSequence):
        if seed.spawn_key:
            raise ValueError("seed must be a root SeedSequence (empty spawn_key)")
        return int(seed.entropy)  # type: ignore[arg-type]
    raise TypeError(f"seed must be an int, a numpy SeedSequence or None, got {seed!r}")


def generator(seed: int, epoch: int, purpose: str, *extra: int) -> np.random.Generator:
    """A generator for one (seed, epoch, purpose, *extra) key.

    >>> a = generator(0, 1, "shuffle").integers(1 << 30)
    >>> b = generator(0, 1, "shuffle").integers(1 << 30)
    >>> bool(a == b), bool(a == generator(0, 2, "shuffle").integers(1 << 30))
    (True, False)
    """
    key = (int(epoch), _purpose_id(purpose), *(int(x) for x in extra))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))
