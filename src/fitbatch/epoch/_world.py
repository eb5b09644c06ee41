"""The data-parallel world: who is running, and the decisions every rank must share.

``world_info`` reads ``(num_replicas, rank)`` from the arguments or an initialised
``torch.distributed``; ``shared_world`` says whether a collective can be used;
``shared_seed`` makes ``seed=None`` one collective draw. torch is imported only inside them.

>>> world_info(4, 1)
(4, 1)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fitbatch import _rng
from fitbatch._validate import positive_int


def world_info(num_replicas: int | None = None, rank: int | None = None) -> tuple[int, int]:
    """``(num_replicas, rank)``: as given, else from an initialised ``torch.distributed``, else (1, 0).

    >>> world_info(8, 3)
    (8, 3)
    >>> world_info(2, 2)
    Traceback (most recent call last):
    ...
    ValueError: rank must be an int in [0, 2), got 2
    """
    if num_replicas is None or rank is None:
        detected = (1, 0)
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                detected = (dist.get_world_size(), dist.get_rank())
        except ImportError:
            pass
        num_replicas = detected[0] if num_replicas is None else num_replicas
        rank = detected[1] if rank is None else rank
    world = int(positive_int("num_replicas", num_replicas) or 1)
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world:
        raise ValueError(f"rank must be an int in [0, {world}), got {rank!r}")
    return world, int(rank)


def shared_seed(seed: Any, world: int) -> Any:
    """The seed every rank plans with: ``seed`` itself, unless it is ``None`` on several ranks.

    ``seed=None`` draws fresh entropy, which differs on every rank: their plans would disagree
    (samples repeated and lost). Under an initialised ``torch.distributed`` of ``world`` ranks
    rank 0's draw is broadcast (a collective call: every rank must build its sampler); without
    one it is refused.

    >>> shared_seed(None, 1) is None, shared_seed(7, 8)
    (True, 7)
    >>> shared_seed(None, 2)
    Traceback (most recent call last):
    ...
    ValueError: seed=None draws another seed on each of the 2 ranks, whose plans would then disagree (samples repeated and lost); pass seed=<int>, the same on every rank, or build the sampler after torch.distributed.init_process_group (rank 0's draw is then shared)
    """
    if seed is not None or world == 1:
        return seed
    if not shared_world(world):
        raise ValueError(
            f"seed=None draws another seed on each of the {world} ranks, whose plans would then disagree "
            "(samples repeated and lost); pass seed=<int>, the same on every rank, or build the sampler "
            "after torch.distributed.init_process_group (rank 0's draw is then shared)"
        )
    import torch.distributed as dist

    drawn = [_rng.resolve_seed(None)]
    dist.broadcast_object_list(drawn, src=0)
    return int(drawn[0])


def shared_world(world: int) -> bool:
    """Whether an initialised ``torch.distributed`` of ``world`` ranks can share a census."""
    if world == 1:
        return False
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - without torch
        return False
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() == world)


__all__ = ["shared_seed", "shared_world", "world_info"]
