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
    batch = pad_collate([
        {"ids": np.array([1, 2, 3]), "label": 1.0, "pos": [0, 1, 2]},
        {"ids": np.array([4]), "label": 0.0, "pos": [0]},
    ])
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
