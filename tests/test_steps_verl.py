"""fitbatch.integrations.verl: verl's seqlen_balancing functions, with verl's signatures.

The cases of verl's own CPU tests of these functions (tests/utils/test_seqlen_balancing.py of
verl 0.9.1: a random padded batch rearranged and restored; two data-parallel ranks with
different batches agreeing on the count, with and without ``min_num_micro_batch``), written
here as our own, plus the cap that verl PR #7553 made strict, forced groups and the
pipeline-stage multiple. verl is not installed: nothing here imports it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from contracts import run_processes
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from fitbatch.integrations.verl import (  # noqa: E402
    calculate_workload,
    get_seqlen_balanced_partitions,
    rearrange_micro_batches,
)

WORKER = Path(__file__).resolve().parent / "distributed" / "verl_worker.py"
sys.path.insert(0, str(WORKER.parent))
from verl_worker import random_mask  # noqa: E402

from fitbatch.steps import partition  # noqa: E402


def padded_batch(rows: int = 20, width: int = 100, seed: int = 0) -> dict:
    ids = torch.randint(0, 10, (rows, width), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": random_mask(rows, width, seed)}


def restore(micros, idx, key="input_ids"):
    flat = [i for part in idx for i in part]
    inverse = torch.empty(len(flat), dtype=torch.long)
    inverse[torch.tensor(flat)] = torch.arange(len(flat))
    return torch.cat([m[key] for m in micros])[inverse]


# --------------------------------------------------------------------------- rearrange_micro_batches


def test_rearranged_batch_restores_and_respects_the_cap() -> None:
    """verl's test_seqlen_balancing / test_dynamic_batch: rearrange, concatenate, invert."""
    batch = padded_batch()
    micros, idx = rearrange_micro_batches(batch, max_token_len=300)
    for key in batch:
        torch.testing.assert_close(restore(micros, idx, key), batch[key])
    lengths = batch["attention_mask"].sum(dim=1)
    assert all(int(lengths[i].sum()) <= 300 for i in idx) and all(i == sorted(i) for i in idx)
    assert len(micros) >= math.ceil(int(lengths.sum()) / 300)


def test_a_tensordict_in_tensordicts_out() -> None:
    tensordict = pytest.importorskip("tensordict")
    batch = tensordict.TensorDict(padded_batch(), batch_size=[20])
    micros, idx = rearrange_micro_batches(batch, max_token_len=300)
    assert all(type(m) is type(batch) and m.batch_size[0] == len(i) for m, i in zip(micros, idx))
    flat = torch.cat(micros)  # TensorDicts concatenate: verl's own restore
    flat_idx = torch.tensor([i for part in idx for i in part])
    inverse = torch.empty_like(flat_idx)
    inverse[flat_idx] = torch.arange(flat_idx.numel())
    torch.testing.assert_close(flat[inverse]["input_ids"], batch["input_ids"])


def test_nested_input_ids_are_measured_by_their_offsets() -> None:
    rows = [torch.arange(n) for n in (5, 3, 6, 2, 4)]
    batch = {"input_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}
    micros, idx = rearrange_micro_batches(batch, max_token_len=8, use_dynamic_bsz_balance=False)
    lengths = [5, 3, 6, 2, 4]
    assert all(sum(lengths[i] for i in part) <= 8 for part in idx) and len(idx) == 3
    for m, part in zip(micros, idx):
        assert [t.tolist() for t in m["input_ids"].unbind()] == [rows[i].tolist() for i in part]


@given(st.lists(st.integers(1, 64), min_size=1, max_size=60), st.integers(64, 300), st.integers(1, 4),
       st.one_of(st.none(), st.integers(1, 8)), st.booleans())
def test_the_cap_holds_and_every_row_is_kept(lengths, cap, divided_by, min_mb, balance) -> None:
    mask = (torch.arange(64)[None, :] < torch.tensor(lengths)[:, None]).long()
    if min_mb is not None and max(min_mb, divided_by) > len(lengths):
        with pytest.raises(ValueError, match="forced groups"):
            rearrange_micro_batches({"attention_mask": mask}, cap, num_batches_divided_by=divided_by,
                                    min_num_micro_batch=min_mb, use_dynamic_bsz_balance=balance)
        return
    try:
        micros, idx = rearrange_micro_batches({"attention_mask": mask}, cap, num_batches_divided_by=divided_by,
                                              min_num_micro_batch=min_mb, use_dynamic_bsz_balance=balance)
    except ValueError as exc:  # a multiple of divided_by above the row count: verl raises too
        assert "forced groups" in str(exc) and divided_by > 1
        return
    assert sorted(i for part in idx for i in part) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in part) <= cap for part in idx)
    assert len(idx) % divided_by == 0 and len(idx) >= (min_mb or 1)
    assert all(part for part in idx), "no empty micro-batch, as verl"


def test_the_cap_is_strict() -> None:
    """verl PR #7553's case: lengths [7] * 8 under a cap of 8 (KK with ceil(56 / 8) = 7 bins paired two)."""
    mask = torch.ones(8, 7, dtype=torch.long)
    micros, idx = rearrange_micro_batches({"attention_mask": mask}, max_token_len=8)
    assert len(idx) == 8 and all(len(part) == 1 for part in idx)


def test_balanced_order_puts_light_micro_batches_at_both_ends() -> None:
    mask = (torch.arange(100)[None, :] < torch.tensor([90, 80, 70, 60, 50, 40, 30, 20])[:, None]).long()
    _, idx = rearrange_micro_batches({"attention_mask": mask}, max_token_len=100)
    work = [sum(int(calculate_workload(torch.tensor(int(mask[i].sum())))) for i in part) for part in idx]
    peak = int(np.argmax(work))
    assert all(work[i] <= work[i + 1] for i in range(peak)) and all(work[i] >= work[i + 1] for i in range(peak, len(work) - 1))


def test_forced_groups_stay_together() -> None:
    lengths = [30, 10, 20, 20, 50, 5, 15, 15]
    mask = (torch.arange(64)[None, :] < torch.tensor(lengths)[:, None]).long()
    micros, idx = rearrange_micro_batches({"attention_mask": mask}, max_token_len=64, force_group_size=2)
    for part in idx:
        assert all(part[k + 1] == part[k] + 1 and part[k] % 2 == 0 for k in range(0, len(part), 2))
        assert sum(lengths[i] for i in part) <= 64
    with pytest.raises(ValueError, match="A forced group exceeds max_token_len"):
        rearrange_micro_batches({"attention_mask": mask}, max_token_len=64, force_group_size=4)
    with pytest.raises(ValueError, match="divisible by force_group_size 3"):
        rearrange_micro_batches({"attention_mask": mask}, max_token_len=64, force_group_size=3)


def test_a_row_wider_than_the_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="max_token_len must be greater than the sequence length"):
        rearrange_micro_batches(padded_batch(), max_token_len=99)


# --------------------------------------------------------------------------- two real ranks


def run(tmp_path: Path, same: bool, min_mb: int | None) -> list[dict]:
    out = tmp_path / f"{int(same)}-{min_mb}"
    out.mkdir()
    store = f"file://{out / 'store'}"
    run_processes([[sys.executable, str(WORKER), "--init", store, "--world", "2", "--rank", str(r), "--out", str(out),
                    "--same", str(int(same)), "--min-mb", str(min_mb or 0)] for r in range(2)], timeout=120)
    return [json.loads((out / f"verl-rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize(("same", "min_mb"), [(False, 4), (True, None)])
def test_two_ranks_as_verl_tests_them(tmp_path, same, min_mb) -> None:
    """verl's test_seqlen_balancing_distributed_params: 20 and 25 rows, cap 300. verl's test
    expects each rank's ``min(rows, ceil(tokens / 300))`` (or ``min_num_micro_batch``), the
    count before the cap is checked; a rank whose rows do not pack that tightly (rank 1's 25
    rows fill 6 micro-batches to 95 %, which neither this split nor first-fit-decreasing does)
    gets the count its rows pack into, as verl 0.9.1's retries give it."""
    runs = run(tmp_path, same, min_mb)
    local = [min(len(r["lengths"]), math.ceil(sum(r["lengths"]) / 300)) for r in runs]
    own = [partition(np.array(r["lengths"]), 300, world=1, weights=calculate_workload, min_micro=min_mb).n_micro
           for r in runs]
    for r, natural, needed in zip(runs, local, own):
        assert r["restored"] and all(t <= 300 for t in r["tokens"])
        assert needed <= max(natural, min_mb or 0) + 1
        if not same:
            assert len(r["idx"]) == needed
    if same:
        assert len(runs[0]["idx"]) == len(runs[1]["idx"]) == max(own)


# --------------------------------------------------------------------------- get_seqlen_balanced_partitions


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=200), st.integers(1, 16), st.booleans())
def test_partitions_cover_every_index_once_and_are_sorted(values, k, equal) -> None:
    if len(values) < k or (equal and len(values) % k):
        with pytest.raises(ValueError):
            get_seqlen_balanced_partitions(values, k, equal)
        return
    parts = get_seqlen_balanced_partitions(values, k, equal)
    assert len(parts) == k and all(p and p == sorted(p) for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(len(values)))
    sums = [sum(values[i] for i in p) for p in parts]
    assert max(sums) - min(sums) <= max(values)  # greedy largest-first: at most one item apart
    if equal:
        assert {len(p) for p in parts} == {len(values) // k}


def test_partitions_balance_exactly_when_they_can() -> None:
    assert get_seqlen_balanced_partitions([8, 1, 1, 6, 2], 2, equal_size=False) == [[0, 1], [2, 3, 4]]
    assert get_seqlen_balanced_partitions([5, 1, 4, 2, 3, 3], 2, equal_size=True) == [[0, 1, 5], [2, 3, 4]]
