"""A drop-in for verl's sequence-length balancing (``verl.utils.seqlen_balancing``).

Change one import::

    # from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions, rearrange_micro_batches
    from fitbatch.integrations.verl import get_seqlen_balanced_partitions, rearrange_micro_batches

The two functions keep verl 0.9.1's signatures and return forms; the split is fitbatch's
(:func:`fitbatch.steps.partition`): ``max_token_len`` is a hard cap on each micro-batch's
effective tokens, balanced by verl's workload ``24576 * L + L**2``, with the micro-batch count
found in one pass (with a data-parallel group: one all-reduce for the count, none per retry).
The differences from verl (errors are ``ValueError`` where verl asserts; partitions may group the
sequences differently; with a data-parallel group the count may be lower than verl's, never
higher than the cap needs) are listed in ``docs/rl.md``. verl itself is not needed.

>>> parts = get_seqlen_balanced_partitions([5, 1, 4, 2, 3, 3], k_partitions=2, equal_size=True)
>>> parts, [sum([5, 1, 4, 2, 3, 3][i] for i in p) for p in parts]
([[0, 1, 5], [2, 3, 4]], [9, 9])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fitbatch.steps import partition, partition_local

__all__ = ["calculate_workload", "get_seqlen_balanced_partitions", "rearrange_micro_batches"]


def calculate_workload(seqlen_list: Any) -> Any:
    """verl's relative cost of a sequence of length ``L``: ``24576 * L + L**2`` (a 7B dense
    transformer's linear and attention FLOPs, up to a constant). Works on arrays and tensors.

    >>> calculate_workload(np.array([1024, 8192])).tolist()
    [26214400, 268435456]
    """
    return 24576 * seqlen_list + seqlen_list**2


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """``k_partitions`` lists of indices into ``seqlen_list`` with balanced sums, as verl's.

    Args:
        seqlen_list: a number per item (lengths, or workloads).
        k_partitions: how many partitions.
        equal_size: every partition has ``len(seqlen_list) / k_partitions`` items.

    Returns:
        ``k_partitions`` non-empty lists of indices, each sorted; every index in one of them.

    Raises:
        ValueError: fewer items than partitions, or ``equal_size`` with a count that
            ``k_partitions`` does not divide (verl: ``AssertionError``).

    >>> get_seqlen_balanced_partitions([8, 1, 1, 6, 2], 2, equal_size=False)
    [[0, 1], [2, 3, 4]]
    """
    values = np.asarray(seqlen_list, dtype=np.float64).ravel()
    k = int(k_partitions)
    if k < 1 or values.size < k:
        raise ValueError(f"number of items [{values.size}] < k_partitions [{k_partitions}]: need at least one item a partition")
    if equal_size and values.size % k:
        raise ValueError(f"equal_size=True needs len(seqlen_list) ({values.size}) divisible by k_partitions ({k})")
    if equal_size:
        return _equal_count_partitions(values, k)
    p = partition(values, float(values.sum()) + 1.0, world=k, min_micro=1, weights=values)  # no cap
    return [sorted(np.concatenate(p[r]).tolist()) for r in range(k)]


def _equal_count_partitions(values: np.ndarray, k: int) -> list[list[int]]:
    """Largest first, in rounds of ``k``: a round's i-th largest to the i-th lightest partition,
    so every partition gets one item a round. Imbalance: at most the largest item."""
    order = np.argsort(-values, kind="stable").reshape(-1, k)
    load = np.zeros(k)
    owner = np.empty(values.size, dtype=np.int64)
    for row in order:  # invariant: every partition holds one item of each earlier round
        lightest = np.argsort(load, kind="stable")
        owner[row] = lightest
        load[lightest] += values[row]
    return [np.flatnonzero(owner == p).tolist() for p in range(k)]


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
) -> tuple[list[Any], list[list[int]]]:
    """Split ``batch`` into micro-batches of at most ``max_token_len`` effective tokens, as verl's.

    Args:
        batch: a ``TensorDict`` or a dict of tensors with ``attention_mask`` ``(B, S)`` (the
            effective length of a row is its mask's sum) or a nested (jagged) ``input_ids``.
        max_token_len: the cap on each micro-batch's effective tokens.
        dp_group: a ``torch.distributed`` group whose ranks end with the same count.
        num_batches_divided_by: the count is a multiple of this (virtual pipeline stages).
        same_micro_num_in_dp: agree on the count over ``dp_group`` (if given and initialised).
        min_num_micro_batch: at least this many micro-batches.
        use_dynamic_bsz_balance: order the micro-batches heaviest in the middle, lightest at
            both ends (fewer pipeline bubbles), as verl does; otherwise heaviest first.
        force_group_size: each run of this many consecutive rows stays in one micro-batch.

    Returns:
        ``(micro_batches, indices)``: the micro-batches (of ``batch``'s type) and, for each,
        the sorted row indices it holds.

    Raises:
        ValueError: a row (or forced group) longer than ``max_token_len``, a batch size
            ``force_group_size`` does not divide, or more micro-batches than a rank has groups.

    >>> import torch
    >>> mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    >>> micro, idx = rearrange_micro_batches({"attention_mask": mask}, max_token_len=5)
    >>> idx, [int(m["attention_mask"].sum()) for m in micro]
    ([[2, 3], [0, 1]], [5, 5])
    """
    lengths, widest = _lengths(batch)
    if max_token_len < widest:
        raise ValueError(f"max_token_len must be greater than the sequence length. Got {max_token_len=} and {widest=}")
    n, size = lengths.size, int(force_group_size)
    if size < 1 or n % size:
        raise ValueError(f"Batch size {n} must be divisible by force_group_size {force_group_size}")
    groups = np.arange(n) // size
    longest_group = int(np.bincount(groups, lengths).max()) if n else 0
    kw: dict[str, Any] = {
        "weights": calculate_workload,
        "groups": groups,
        "micro_multiple": num_batches_divided_by or 1,
        "min_micro": min_num_micro_batch,
    }
    sync = same_micro_num_in_dp and dp_group is not None and _initialised()
    n_groups = n // size
    if sync:  # agree first on what makes any rank fail, so that all fail together
        longest_group, fewest = _max_over(dp_group, longest_group, -n_groups)
        n_groups = -fewest
    if longest_group > max_token_len:
        raise ValueError(
            "A forced group exceeds max_token_len and cannot be split. "
            f"Got max_group_token_len={longest_group} and max_token_len={max_token_len}."
        )
    if sync:
        p = partition_local(lengths, max_token_len, group=dp_group, **kw)
        parts = p[p.ranks[0]]
    else:
        p = partition(lengths, max_token_len, world=1, keep_groups="micro", **kw)
        parts = p[0]
    if p.n_micro > n_groups:
        raise ValueError(
            f"Cannot satisfy max_token_len with {p.n_micro} non-empty micro-batches: a rank has only "
            f"{n_groups} forced groups (lower min_num_micro_batch or num_batches_divided_by)"
        )
    idx = [part.tolist() for part in parts]  # heaviest first
    if use_dynamic_bsz_balance:  # light ones at both ends: [.., 4, 2, 0, 1, 3, ..]
        idx = idx[::2][::-1] + idx[1::2]
    return [_select(batch, i) for i in idx], idx


def _lengths(batch: Any) -> tuple[np.ndarray, int]:
    """Each row's effective tokens, and the widest row a micro-batch must hold."""
    ids = batch["input_ids"] if "input_ids" in batch.keys() else None
    if ids is not None and getattr(ids, "is_nested", False):
        lengths = ids.offsets().diff().cpu().numpy().astype(np.int64)
        return lengths, int(lengths.max()) if lengths.size else 0
    if "attention_mask" not in batch.keys():
        raise ValueError("batch needs an 'attention_mask' (B, S) or a nested 'input_ids' to measure the rows")
    mask = batch["attention_mask"]
    lengths = np.asarray(mask.sum(dim=1).cpu().numpy() if hasattr(mask, "cpu") else np.sum(mask, axis=1), dtype=np.int64)
    return lengths, int(mask.shape[-1])


def _select(batch: Any, rows: list[int]) -> Any:
    """The rows ``rows`` of every field (nested tensors row by row), in ``batch``'s type."""
    import torch

    index = torch.tensor(rows, dtype=torch.long)
    out: dict[str, Any] = {}
    for key in batch.keys():
        value = batch[key]
        if isinstance(value, torch.Tensor) and value.is_nested:
            parts = value.unbind()
            out[key] = torch.nested.as_nested_tensor([parts[i] for i in rows], layout=torch.jagged)
        elif isinstance(value, torch.Tensor):
            out[key] = value[index.to(value.device)]
        elif isinstance(value, np.ndarray):
            out[key] = value[rows]
        else:
            out[key] = value
    if isinstance(batch, dict):
        return out
    return type(batch)(out, batch_size=[len(rows)])  # a TensorDict


def _initialised() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - verl needs torch
        return False
    return bool(dist.is_available() and dist.is_initialized())


def _max_over(group: Any, *values: int) -> tuple[int, ...]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return tuple(int(x) for x in t)
