"""Steps: one step's sequences into capped, balanced micro-batches on every rank.

For trainers without epochs (RL post-training, online SFT mixtures) that receive one step's
sequences at a time and must split them over data-parallel ranks and micro-batches:

* :func:`partition`, :class:`Partition` (``_partition``): the whole step known on every rank;
* :func:`partition_local` (``_collective``): each rank holds its own sequences; one
  all-reduce agrees on the micro-batch count;
* :func:`cp_shard` (``_cp``): a packed micro-batch split over context-parallel ranks, document
  by document, head and tail chunk together.

>>> p = partition([900, 700, 400, 300, 200, 100], 1000, world=2)
>>> p.n_micro, p.step_tokens.tolist()
(2, [1600.0, 1000.0])
"""

from __future__ import annotations

from fitbatch.steps._collective import partition_local
from fitbatch.steps._cp import cp_shard
from fitbatch.steps._partition import OVERSIZED, Partition, partition

__all__ = ["OVERSIZED", "Partition", "cp_shard", "partition", "partition_local"]
