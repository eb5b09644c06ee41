"""Collates at their edges (issue 37): one set of field rules for every dict collate (fields are
the union over the batch), padding values honoured, masks guarded, any iterable a batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fitbatch.collate import (
    block_causal_mask,
    document_block_mask,
    make_hf_collate,
    make_varlen_collate,
    pad_collate,
)

torch = pytest.importorskip("torch")

HF = make_hf_collate(0, return_tensors="np")
VARLEN = make_varlen_collate(return_tensors="np")
COLLATES = {"hf": HF, "varlen": VARLEN}


@pytest.mark.parametrize("name", list(COLLATES))
def test_labels_of_a_later_sample_are_never_dropped_or_replaced(name: str) -> None:
    """Sample 0 without labels, sample 1 with its prompt masked: varlen gave the prompt a loss
    (labels = input_ids), the HF collate dropped labels; the reverse order raised."""
    batch = [{"input_ids": [5, 6]}, {"input_ids": [7, 8, 9], "labels": [-100, -100, 9]}]
    for order in (batch, batch[::-1]):
        with pytest.raises(ValueError, match=r"has no 'labels', which sample \d has: a field must be in every sample"):
            COLLATES[name](order)


def test_a_field_of_a_later_sample_only_is_refused() -> None:
    with pytest.raises(ValueError, match=r"sample 0 has no 'token_type_ids', which sample 1 has"):
        HF([{"input_ids": [1]}, {"input_ids": [2], "token_type_ids": [0]}])


BAD = [
    ({"input_ids": [1, 2], "labels": ["a", "b"]}, r"sample 0: 'labels' holds <U1 values; fields hold numbers"),
    ({"input_ids": [1, 2], "labels": [[1, 2], [3, 4]]}, r"sample 0: 'labels' must be a 1-D sequence of ints"),
    ({"input_ids": [1.0, 2.0]}, r"sample 0: 'input_ids' must be a 1-D sequence of ints \(token ids\), got shape \(2,\) float64"),
    ({"input_ids": [1, 2], "labels": None}, r"sample 0: 'labels' is None: give it a value, or leave the field out"),
    ({"input_ids": None}, r"sample 0: 'input_ids' is None"),
    ({"input_ids": [1, 2], "labels": [1, 2, 3]}, r"sample 0: 'labels' has \(3,\) positions but 'input_ids' has 2"),
    ({"input_ids": [[1], [2, 3]]}, r"sample 0: 'input_ids' is not a rectangular array"),
]


@pytest.mark.parametrize("name", list(COLLATES))
@pytest.mark.parametrize(("sample", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_bad_fields_are_named(name: str, sample: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        COLLATES[name]([dict(sample), sample])


@pytest.mark.parametrize(("mask", "message"), [
    ([1, 1], r"sample 1: 'attention_mask' has shape \(2,\) but 'input_ids' has 3 tokens"),
    ([1, 2, 1], r"sample 1: 'attention_mask' must hold 0 and 1 only"),
    ([[1, 1, 1]], r"'attention_mask' has shape \(1, 3\)"),
])
def test_hf_attention_mask_must_cover_input_ids(mask: list[Any], message: str) -> None:
    """A shorter attention_mask was padded with 0: real tokens masked out."""
    with pytest.raises(ValueError, match=message):
        HF([{"input_ids": [1], "attention_mask": [1]}, {"input_ids": [1, 2, 3], "attention_mask": mask}])


def test_hf_scalar_labels_stay_per_sample() -> None:
    out = HF([{"input_ids": [1, 2], "labels": 3}, {"input_ids": [4], "labels": 0}])
    assert out["labels"].tolist() == [3, 0]
    with pytest.raises(ValueError, match=r"sample 1: 'labels' is a sequence but sample 0's is a scalar"):
        HF([{"input_ids": [1, 2], "labels": 3}, {"input_ids": [4], "labels": [4]}])


def test_pad_values_are_honoured_for_labels_and_input_ids() -> None:
    """pad_values={'labels': -1} was ignored (-100 written)."""
    collate = make_hf_collate(0, pad_values={"labels": -1, "score": 9}, return_tensors="np")
    out = collate([{"input_ids": [5, 6], "labels": [5, 6], "score": [1, 1]}, {"input_ids": [7], "labels": [7], "score": [2]}])
    assert out["labels"].tolist() == [[5, 6], [7, -1]] and out["score"].tolist() == [[1, 1], [2, 9]]
    same = make_hf_collate(3, pad_values={"input_ids": 3}, return_tensors="np")
    assert same([{"input_ids": [5, 6]}, {"input_ids": [7]}])["input_ids"].tolist() == [[5, 6], [7, 3]]
    with pytest.raises(ValueError, match=r"pad_values\['input_ids'\]=5 disagrees with pad_token_id=0: give one"):
        make_hf_collate(0, pad_values={"input_ids": 5})
    with pytest.raises(ValueError, match=r"pad_values\['labels'\]=-1 disagrees with label_pad=-7"):
        make_hf_collate(0, label_pad=-7, pad_values={"labels": -1})
    with pytest.raises(ValueError, match=r"pad_values\['attention_mask'\] must be 0"):
        make_hf_collate(0, pad_values={"attention_mask": 1})
    with pytest.raises(TypeError, match=r"pad_values\['labels'\] must be an int"):
        make_hf_collate(0, pad_values={"labels": 0.5})


def test_document_block_mask_block_size_must_be_positive() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"block_size must be an int >= 1"):
            document_block_mask([0, 0, 1], block_size=bad)


def test_a_dense_causal_mask_is_refused_above_its_limit() -> None:
    """causal_mask=True built a T x T mask with no guard (T = 40,000: 6.4 GB in 41 s)."""
    with pytest.raises(ValueError, match=r"a dense \(40000, 40000\) attention mask needs 6\.0 GiB .*document_block_mask"):
        block_causal_mask(np.zeros(40_000, np.int64))
    collate = make_varlen_collate(causal_mask=True)
    with pytest.raises(ValueError, match=r"max_tokens=16384"):
        collate([{"input_ids": np.ones(9000, np.int64)}, {"input_ids": np.ones(9000, np.int64)}])
    small = make_varlen_collate(causal_mask=True, max_mask_tokens=8)
    with pytest.raises(ValueError, match=r"max_tokens=8"):
        small([{"input_ids": [1] * 5}, {"input_ids": [2] * 4}])
    assert tuple(small([{"input_ids": [1] * 5}, {"input_ids": [2] * 3}])["attention_mask"].shape) == (1, 1, 8, 8)
    assert block_causal_mask(np.zeros(20, np.int64), max_tokens=None).shape == (1, 1, 20, 20)
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1 or None"):
        make_varlen_collate(causal_mask=True, max_mask_tokens=0)


def test_any_iterable_is_a_batch() -> None:
    """A varlen collate over a generator said "has no len()"."""
    samples = [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}]
    assert VARLEN(s for s in samples)["input_ids"].tolist() == VARLEN(samples)["input_ids"].tolist()
    assert HF(iter(samples))["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert pad_collate(np.asarray(s["input_ids"]) for s in samples).lengths.tolist() == [3, 2]
    for collate in (HF, VARLEN, pad_collate):
        with pytest.raises(ValueError, match="cannot collate an empty batch"):
            collate(iter([]))
        with pytest.raises(TypeError, match="a batch is a sequence of samples"):
            collate({"input_ids": [1]})
