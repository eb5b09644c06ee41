"""fitbatch.steps.cp_shard: a packed batch split over context-parallel ranks, proven exact.

The proof: a tiny random attention layer (embedding, q/k/v projections, rotary-free) computes
causal varlen attention on the unsharded row; each CP rank computes its queries' attention over
the keys/values gathered from every CP rank, masked by document and position only (what the
shards carry). Every real token's output matches within 1e-5, for random documents and CP sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitbatch.collate import make_varlen_collate
from fitbatch.steps import cp_shard, partition

DIM = 8


def tiny_attention(seed: int, vocab: int = 50):
    """q, k, v of each token from a random embedding and projections (float64)."""
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(vocab, DIM))
    wq, wk, wv = (rng.normal(size=(DIM, DIM)) / np.sqrt(DIM) for _ in range(3))

    def qkv(ids: np.ndarray, pos: np.ndarray):
        x = emb[ids] + 0.1 * np.sin(pos[:, None] * (1.0 + np.arange(DIM)))  # positions matter
        return x @ wq, x @ wk, x @ wv

    return qkv


def attend(q, k, v, allowed):
    scores = np.where(allowed, q @ k.T / np.sqrt(DIM), -np.inf)
    scores -= scores.max(axis=1, keepdims=True)
    w = np.exp(scores)
    return (w / w.sum(axis=1, keepdims=True)) @ v


@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(1, 4), st.integers(0, 2**16))
def test_sharded_attention_equals_unsharded(lengths, cp, seed) -> None:
    rng = np.random.default_rng(seed)
    samples = [{"input_ids": rng.integers(1, 50, n)} for n in lengths]
    batch = make_varlen_collate(return_tensors="np")(samples)
    qkv = tiny_attention(seed)
    ids, pos, doc = batch["input_ids"][0], batch["position_ids"][0], batch["seq_idx"][0]
    q, k, v = qkv(ids, pos)
    full = attend(q, k, v, (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None]))

    shards = [cp_shard(batch, r, cp) for r in range(cp)]
    gathered = [qkv(s["input_ids"][0], s["position_ids"][0]) for s in shards]
    k_all = np.concatenate([g[1] for g in gathered])
    v_all = np.concatenate([g[2] for g in gathered])
    pos_all = np.concatenate([s["position_ids"][0] for s in shards])
    doc_all = np.concatenate([s["seq_idx"][0] for s in shards])
    seen = []
    for s, (q_r, _, _) in zip(shards, gathered):
        p_r, d_r, index = s["position_ids"][0], s["seq_idx"][0], s["cp_index"]
        out = attend(q_r, k_all, v_all, (d_r[:, None] == doc_all[None, :]) & (pos_all[None, :] <= p_r[:, None]))
        real = index >= 0
        np.testing.assert_allclose(out[real], full[index[real]], atol=1e-5, rtol=0)
        seen.append(index[real])
        # every document padded to a multiple of 2*cp, two equal chunks per rank
        local = np.diff(s["cu_seq_lens"])
        padded = -(-np.array(lengths) // (2 * cp)) * 2
        np.testing.assert_array_equal(local, padded)
        assert s["max_length"] == local.max()
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(sum(lengths)))
    # the shifted labels are the unsharded row's next-token labels
    nxt = np.where(np.r_[doc[1:] == doc[:-1], False], np.r_[batch["labels"][0][1:], -100], -100)
    for s in shards:
        real = s["cp_index"] >= 0
        np.testing.assert_array_equal(s["shift_labels"][0][real], nxt[s["cp_index"][real]])
        assert np.all(s["labels"][0][~real] == -100) and np.all(s["input_ids"][0][~real] == 0)


def test_the_head_and_tail_chunk_go_to_one_rank() -> None:
    batch = {"input_ids": np.arange(1, 9)[None], "cu_seq_lens": np.array([0, 8])}
    got = [cp_shard(batch, r, 2)["position_ids"][0].tolist() for r in range(2)]
    assert got == [[0, 1, 6, 7], [2, 3, 4, 5]]


def test_torch_in_torch_out() -> None:
    torch = pytest.importorskip("torch")
    batch = make_varlen_collate()([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}])
    out = cp_shard(batch, 1, 2)
    assert isinstance(out["input_ids"], torch.Tensor) and out["input_ids"].tolist() == [[6, 7, 0, 0]]
    assert out["cu_seq_lens"].dtype == torch.int32 and out["cu_seq_lens"].tolist() == [0, 2, 4]
    assert out["position_ids"].tolist() == [[1, 2, 1, 2]] and out["shift_labels"].tolist() == [[7, -100, -100, -100]]


def test_partition_counts_the_padded_lengths() -> None:
    p = partition([5, 5, 5, 5], 16, world=1, cp_size=2)  # each counts 8: two per micro-batch
    assert p.n_micro == 2 and p.step_tokens.tolist() == [10.0, 10.0]
    assert partition([5, 5, 5, 5], 16, world=1).n_micro == 2  # 20 tokens: 2 micro-batches either way
    assert partition([5, 5, 5], 15, world=1, cp_size=2).n_micro == 3  # 8 + 8 > 15


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cp_rank": 2, "cp_size": 2}, ValueError, r"cp_rank must be in \[0, cp_size=2\)"),
        ({"cp_rank": 0, "cp_size": 0}, ValueError, "cp_size must be >= 1"),
        ({"cp_rank": -1, "cp_size": 2}, ValueError, "cp_rank must be >= 0"),
        ({"cp_rank": 0.0, "cp_size": 2}, TypeError, "cp_rank must be an int"),
    ],
)
def test_bad_ranks_are_refused(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        cp_shard({"input_ids": np.ones((1, 4), int), "cu_seq_lens": np.array([0, 4])}, **kwargs)


def test_bad_batches_are_refused() -> None:
    with pytest.raises(ValueError, match="batch has no 'input_ids'"):
        cp_shard({}, 0, 1)
    with pytest.raises(ValueError, match="cu_seq_lens must rise from 0 to the 4 tokens"):
        cp_shard({"input_ids": np.ones((1, 4), int), "cu_seq_lens": np.array([0, 3])}, 0, 1)
