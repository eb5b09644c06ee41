"""Padding-free collate, its masks and bounded shapes: exact outputs, transformers' convention,
invariants for arbitrary lengths (hypothesis), errors. The model proofs are in
test_varlen_models.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import load_lengths
from hypothesis import given
from hypothesis import strategies as st

from fitbatch import make_varlen_collate, varlen_collate
from fitbatch.collate import block_causal_mask, document_block_mask, pick_shape

LENGTHS = st.lists(st.integers(1, 12), min_size=1, max_size=8)
SHAPES = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 16)), min_size=1, max_size=5)


def _samples(lengths, labels=False, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ids = rng.integers(1, 100, n)
        out.append({"input_ids": ids, "labels": ids + 1000} if labels else {"input_ids": ids})
    return out


def test_exact_torch_output():
    out = varlen_collate([{"input_ids": [5, 6, 7]}, {"input_ids": torch.tensor([8, 9])}])
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert out["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert out["seq_idx"].tolist() == [[0, 0, 0, 1, 1]]
    assert out["cu_seq_lens_q"].tolist() == out["cu_seq_lens_k"].tolist() == [0, 3, 5]
    assert out["max_length_q"] == out["max_length_k"] == 3
    assert out["input_ids"].dtype == out["labels"].dtype == out["position_ids"].dtype == torch.int64
    assert out["seq_idx"].dtype == out["cu_seq_lens_q"].dtype == torch.int32
    assert isinstance(out["max_length_q"], int) and "attention_mask" not in out


def test_given_labels_keep_all_but_each_first():
    out = make_varlen_collate(return_tensors="np")(
        [{"input_ids": [1, 2], "labels": [7, 8]}, {"input_ids": [3], "labels": [9]}]
    )
    assert out["labels"].tolist() == [[-100, 8, -100]]
    out = make_varlen_collate(return_tensors="np", separator=False, label_pad=-1)(
        [{"input_ids": [1, 2], "labels": [7, 8]}, {"input_ids": [3], "labels": [9]}]
    )
    assert out["labels"].tolist() == [[7, 8, 9]]


@pytest.mark.parametrize("labels", [False, True])
def test_matches_transformers_data_collator_with_flattening(labels):
    from transformers import DataCollatorWithFlattening

    lengths = load_lengths("functions")[:12]
    samples = [{k: v.tolist() for k, v in s.items()} for s in _samples(lengths, labels=labels)]
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(
        samples, return_tensors="pt"
    )
    ours = varlen_collate(samples)
    assert sorted(theirs) == sorted(ours)
    for key, value in theirs.items():
        if isinstance(value, int):
            assert ours[key] == value, key
        else:
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key


def test_keep_fields_are_concatenated_and_others_dropped():
    samples = [
        {"input_ids": [1, 2], "token_type_ids": [0, 1], "attention_mask": [1, 1], "id": 4},
        {"input_ids": [3], "token_type_ids": [1], "attention_mask": [1], "id": 5},
    ]
    out = make_varlen_collate(return_tensors="np", keep_fields=["token_type_ids"])(samples)
    assert out["token_type_ids"].tolist() == [[0, 1, 1]]
    assert sorted(out) == sorted(
        [
            "input_ids",
            "labels",
            "position_ids",
            "seq_idx",
            "token_type_ids",
            "cu_seq_lens_q",
            "cu_seq_lens_k",
            "max_length_q",
            "max_length_k",
        ]
    )


def test_causal_mask_is_float_min_outside_blocks():
    out = make_varlen_collate(causal_mask=True, dtype=torch.bfloat16)(
        [{"input_ids": [1, 2]}, {"input_ids": [3]}]
    )
    mask = out["attention_mask"]
    low = torch.finfo(torch.bfloat16).min
    assert mask.shape == (1, 1, 3, 3) and mask.dtype == torch.bfloat16
    assert mask[0, 0].tolist() == [[0, low, low], [0, 0, low], [low, low, 0]]


def test_shapes_pad_with_one_padding_sequence():
    # 2 samples, longest 3 -> (2, 4) is the smallest length >= 3 with rows >= 2: T = 8
    collate = make_varlen_collate(
        return_tensors="np", pad_token_id=0, shapes=[[4, 2], [2, 4], [1, 8], [2, 4]]
    )
    out = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert out["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, -100, -100]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert out["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, 2, 2]]
    assert out["cu_seq_lens_q"].tolist() == [0, 3, 5, 8] and out["max_length_q"] == 3
    # fills (2, 4) exactly: no padding sequence
    exact = collate([{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5, 6, 7, 8]}])
    assert exact["cu_seq_lens_q"].tolist() == [0, 4, 8]
    with pytest.raises(ValueError, match="no allowed shape fits a batch of 3 rows"):
        collate([{"input_ids": [1] * 5}] * 3)


@pytest.mark.parametrize(
    ("kwargs", "batch", "error", "match"),
    [
        ({}, [], ValueError, "empty batch"),
        ({}, [{"ids": [1]}], ValueError, r"sample 0 has no 'input_ids' \(got \['ids'\]\)"),
        ({}, [[1, 2]], ValueError, "sample 0 has no 'input_ids' .got list"),
        ({}, [{"input_ids": [1, 2]}, {"input_ids": []}], ValueError, "sample 1 has no tokens"),
        ({}, [{"input_ids": [[1, 2]]}], ValueError, "1-D sequence of ints"),
        ({}, [{"input_ids": [1.5]}], ValueError, "1-D sequence of ints"),
        (
            {},
            [{"input_ids": [1, 2], "labels": [1]}],
            ValueError,
            r"sample 0: 'labels' has \(1,\) positions but 'input_ids' has 2",
        ),
        (
            {},
            [{"input_ids": [1], "labels": [1]}, {"input_ids": [2]}],
            ValueError,
            "sample 1 has no 'labels'",
        ),
        ({"return_tensors": "tf"}, None, ValueError, "return_tensors must be one of"),
        ({"return_tensors": "np", "causal_mask": True}, None, ValueError, "return_tensors='pt'"),
        ({"dtype": torch.float16}, None, ValueError, "causal_mask=True"),
        ({"keep_fields": "labels"}, None, ValueError, "keep_fields"),
        ({"keep_fields": ["position_ids"]}, None, ValueError, "keep_fields"),
        ({"pad_token_id": None}, None, TypeError, "pad_token_id must be an int"),
        ({"shapes": [1, 2]}, None, ValueError, r"\(k, 2\)"),
        ({"shapes": [[0, 2]]}, None, ValueError, "ints >= 1"),
    ],
)
def test_errors_name_the_problem(kwargs, batch, error, match):
    with pytest.raises(error, match=match):
        make_varlen_collate(**kwargs)(batch)


@given(lengths=LENGTHS, shapes=st.none() | SHAPES)
def test_boundaries_are_consistent(lengths, shapes):
    n, longest = len(lengths), max(lengths)
    fits = shapes is not None and any(r >= n and m >= longest for r, m in shapes)
    collate = make_varlen_collate(return_tensors="np", shapes=shapes if fits else None)
    out = collate(_samples(lengths))
    cu, pos, seq = out["cu_seq_lens_q"], out["position_ids"][0], out["seq_idx"][0]
    segments = np.diff(cu)
    assert cu[0] == 0 and cu[-1] == pos.size == out["input_ids"].shape[1]
    assert segments[:n].tolist() == lengths and (segments > 0).all()
    assert len(segments) in (n, n + 1) and out["max_length_q"] == segments.max()
    # each segment: its own index, positions 0..len-1
    for s, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        assert (seq[a:b] == s).all() and pos[a:b].tolist() == list(range(b - a))
    assert (out["labels"][0][cu[:-1]] == -100).all()
    if fits:
        assert (pos.size,) == (int(np.prod(pick_shape(shapes, n, longest))),)
        assert (out["labels"][0][cu[n] :] == -100).all()
    else:
        assert pos.size == sum(lengths)


@given(lengths=LENGTHS)
def test_mask_is_exactly_block_diagonal_causal(lengths):
    seq = np.repeat(np.arange(len(lengths)), lengths)
    allowed = (block_causal_mask(seq)[0, 0] == 0).numpy()
    T = seq.size
    expected = [[seq[i] == seq[j] and j <= i for j in range(T)] for i in range(T)]
    assert allowed.tolist() == expected


@given(shapes=SHAPES, rows=st.integers(0, 7), length=st.integers(0, 17))
def test_pick_shape_picks_the_smallest_fitting(shapes, rows, length):
    fitting = sorted((m, r) for r, m in shapes if r >= rows and m >= length)
    if not fitting:
        with pytest.raises(ValueError, match="no allowed shape fits"):
            pick_shape(shapes, rows, length)
        return
    r, m = pick_shape(shapes, rows, length)
    assert (r, m) in shapes and r >= rows and m >= length
    assert (m, r) == fitting[0]


def test_pick_shape_errors():
    with pytest.raises(ValueError, match="rows must be an int >= 0"):
        pick_shape([[1, 2]], -1, 2)
    with pytest.raises(ValueError, match="non-empty"):
        pick_shape(np.zeros((0, 2), dtype=int), 1, 2)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_block_mask_matches_the_dense_mask():
    from torch.nn.attention.flex_attention import flex_attention

    lengths = load_lengths("functions")[:5]  # 33, 16, 16, 31, 13: 109 tokens
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.as_tensor(lengths))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, seq.numel(), 8, generator=g) for _ in range(3))
    dense = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=block_causal_mask(seq)
    )
    flex = flex_attention(q, k, v, block_mask=document_block_mask(seq, block_size=32))
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)
    full = document_block_mask(seq, causal=False, block_size=32)
    encoder = flex_attention(q, k, v, block_mask=full)
    # non-causal: a token also sees the later tokens of its sample
    assert not torch.allclose(encoder, dense, atol=1e-3)


def test_masks_reject_bad_seq_idx():
    with pytest.raises(ValueError, match="seq_idx must be integer"):
        block_causal_mask(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="floating torch dtype"):
        block_causal_mask([0, 0], dtype=torch.int64)
