"""Padding collate functions: numpy and torch inputs, tuples and dicts, multiples, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fitbatch import PaddedBatch, make_pad_collate, pad_collate


def test_torch_sequences():
    batch = pad_collate([torch.tensor([1, 2, 3]), torch.tensor([4])])
    assert isinstance(batch, PaddedBatch)
    assert batch.values.dtype == torch.int64
    assert batch.values.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch.lengths.tolist() == [3, 1]
    assert batch.mask.tolist() == [[True, True, True], [True, False, False]]


def test_numpy_sequences_become_tensors():
    batch = pad_collate([np.array([1.5, 2.5]), np.array([4.0, 5.0, 6.0])])
    assert isinstance(batch.values, torch.Tensor) and batch.values.dtype == torch.float64
    assert batch.values.tolist() == [[1.5, 2.5, 0.0], [4.0, 5.0, 6.0]]
    assert batch.lengths.tolist() == [2, 3]


def test_trailing_dimensions_are_kept():
    batch = pad_collate([torch.ones(2, 3), torch.ones(4, 3)])
    assert tuple(batch.values.shape) == (2, 4, 3)
    assert batch.values[0, 2:].abs().sum().item() == 0
    with pytest.raises(ValueError, match="beyond their first"):
        pad_collate([torch.ones(2, 3), torch.ones(2, 4)])
    with pytest.raises(ValueError, match="beyond their first"):
        pad_collate([np.ones((2, 3)), np.ones((2, 4))])


def test_padding_value_and_multiple():
    collate = make_pad_collate(-1, pad_to_multiple_of=4)
    batch = collate([torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6])])
    assert batch.values.shape[1] == 8
    assert batch.values[1].tolist() == [6, -1, -1, -1, -1, -1, -1, -1]
    assert batch.mask.sum(dim=1).tolist() == [5, 1]
    assert make_pad_collate(pad_to_multiple_of=4)([torch.ones(4)]).values.shape[1] == 4
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="pad_to_multiple_of"):
            make_pad_collate(pad_to_multiple_of=bad)


def test_tuple_samples():
    batch = pad_collate([(torch.tensor([1, 2]), 0), (torch.tensor([3]), 1)])
    assert isinstance(batch, tuple) and len(batch) == 2
    tokens, labels = batch
    assert tokens.values.tolist() == [[1, 2], [3, 0]]
    assert labels.tolist() == [0, 1]


def test_dict_samples():
    batch = pad_collate(
        [
            {"ids": np.array([1, 2, 3]), "label": 1.0, "pos": [0, 1, 2]},
            {"ids": np.array([4]), "label": 0.0, "pos": [0]},
        ]
    )
    assert set(batch) == {"ids", "label", "pos"}
    assert batch["ids"].values.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch["label"].tolist() == [1.0, 0.0]
    assert batch["pos"].lengths.tolist() == [3, 1]


def test_scalars_and_strings():
    assert pad_collate([torch.tensor(1.0), torch.tensor(2.0)]).tolist() == [1.0, 2.0]
    assert pad_collate(["a", "b"]) == ["a", "b"]


def test_empty_batch_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        pad_collate([])


# ----------------------------------------------------------------------------- make_hf_collate


def test_hf_collate_pads_each_field_with_its_own_value():
    from fitbatch import make_hf_collate

    collate = make_hf_collate(pad_token_id=2, pad_values={"token_type_ids": 7})
    out = collate(
        [
            {
                "input_ids": [5, 6, 7],
                "labels": [5, 6, 7],
                "token_type_ids": [0, 0, 1],
                "label_id": 3,
            },
            {"input_ids": torch.tensor([8]), "labels": [8], "token_type_ids": [1], "label_id": 4},
        ]
    )
    assert sorted(out) == ["attention_mask", "input_ids", "label_id", "labels", "token_type_ids"]
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 2, 2]]
    assert out["labels"].tolist() == [[5, 6, 7], [8, -100, -100]]
    assert out["token_type_ids"].tolist() == [[0, 0, 1], [1, 7, 7]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["attention_mask"].dtype == out["input_ids"].dtype == torch.int64
    assert out["label_id"].tolist() == [3, 4]


def test_an_empty_sample_keeps_the_fields_types():
    """An empty list (a tokenizer's output for empty text) has no dtype of its own: numpy's
    float64 for ``[]`` must not turn a batch of token ids into floats."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fitbatch import make_hf_collate

    out = make_hf_collate(pad_token_id=2)(
        [{"input_ids": [], "labels": []}, {"input_ids": [5, 6], "labels": [5, 6]}]
    )
    assert {k: v.dtype for k, v in out.items()} == dict.fromkeys(out, torch.int64)
    assert out["input_ids"].tolist() == [[2, 2], [5, 6]]
    assert out["labels"].tolist() == [[-100, -100], [5, 6]]
    assert out["attention_mask"].tolist() == [[0, 0], [1, 1]]
    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    torch.manual_seed(0)
    assert torch.isfinite(LlamaForCausalLM(config)(**out).loss)  # the ids index an embedding

    batch = pad_collate([[], [5, 6]])
    assert batch.values.dtype == torch.int64 and batch.values.tolist() == [[0, 0], [5, 6]]
    assert batch.lengths.tolist() == [0, 2]
    floats = make_pad_collate(-1.0)([[], np.array([0.5], np.float32)])
    assert floats.values.dtype == torch.float32 and floats.values.tolist() == [[-1.0], [0.5]]
    assert pad_collate([[], []]).values.dtype == torch.int64  # only empty lists: the padding value's type
    assert make_pad_collate(-1.0)([[]]).values.dtype == torch.float64
    empty = np.array([], np.int32)  # an empty array has a type, and keeps it
    assert pad_collate([empty, np.array([1], np.int32)]).values.dtype == torch.int32


def test_hf_collate_given_mask_multiple_and_position_ids():
    from fitbatch import make_hf_collate

    collate = make_hf_collate(
        pad_token_id=0, pad_to_multiple_of=4, position_ids=True, return_tensors="np"
    )
    out = collate(
        [
            {"input_ids": [1, 2, 3, 4, 5], "attention_mask": [1, 1, 1, 0, 1]},
            {"input_ids": [6], "attention_mask": [1]},
        ]
    )
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5, 0, 0, 0], [6, 0, 0, 0, 0, 0, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]]
    assert out["position_ids"].tolist() == [list(range(8))] * 2
    assert "labels" not in out


def test_hf_collate_pads_to_an_allowed_shape_with_padding_rows():
    from fitbatch import make_hf_collate

    collate = make_hf_collate(pad_token_id=9, shapes=[[4, 4], [2, 8], [4, 4]], return_tensors="np")
    out = collate(
        [
            {"input_ids": [1, 2, 3], "labels": [1, 2, 3], "cls": 1},
            {"input_ids": [4], "labels": [4], "cls": 0},
        ]
    )
    assert out["input_ids"].tolist() == [[1, 2, 3, 9], [4, 9, 9, 9], [9] * 4, [9] * 4]
    assert out["labels"].tolist() == [
        [1, 2, 3, -100],
        [4, -100, -100, -100],
        [-100] * 4,
        [-100] * 4,
    ]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [0] * 4, [0] * 4]
    assert out["cls"].tolist() == [1, 0, 0, 0]
    assert collate([{"input_ids": [1] * 6, "labels": [1] * 6, "cls": 1}])["input_ids"].shape == (
        2,
        8,
    )
    with pytest.raises(
        ValueError, match="no allowed shape fits a batch of 1 rows with its longest sample 9 long"
    ):
        collate([{"input_ids": [1] * 9, "labels": [1] * 9, "cls": 1}])


@pytest.mark.parametrize(
    ("kwargs", "batch", "error", "match"),
    [
        ({"pad_token_id": None}, None, TypeError, "tokenizer.pad_token_id"),
        (
            {"pad_token_id": 0, "pad_to_multiple_of": 0},
            None,
            TypeError,
            "pad_to_multiple_of must be an int >= 1",
        ),
        (
            {"pad_token_id": 0, "return_tensors": "tf"},
            None,
            ValueError,
            "return_tensors must be one of",
        ),
        ({"pad_token_id": 0}, [], ValueError, "empty batch"),
        ({"pad_token_id": 0}, [{"ids": [1]}], ValueError, "sample 0 has no 'input_ids'"),
        ({"pad_token_id": 0}, [{"input_ids": 3}], ValueError, "1-D sequence of ints"),
        (
            {"pad_token_id": 0},
            [{"input_ids": [1], "labels": [1]}, {"input_ids": [2]}],
            ValueError,
            "sample 1 has no 'labels'",
        ),
        (
            {"pad_token_id": 0},
            [{"input_ids": [1], "x": [[1, 2]]}, {"input_ids": [2], "x": [[1]]}],
            ValueError,
            "field 'x'",
        ),
    ],
)
def test_hf_collate_errors(kwargs, batch, error, match):
    from fitbatch import make_hf_collate

    with pytest.raises(error, match=match):
        make_hf_collate(**kwargs)(batch)
