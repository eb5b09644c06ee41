"""The field rules of the dict collates (:func:`make_hf_collate`, :func:`make_varlen_collate`).

One set of rules, checked before anything is padded or concatenated, so that no collate takes a
field from sample 0 alone and quietly drops or invents it for the others:

* **the batch**: a sequence of mappings (any iterable, a generator included, is read once into
  a list), not empty; every sample has ``input_ids``;
* **fields are the union over the batch**: a field present in some samples must be present in
  all of them (a batch whose sample 3 alone has ``labels`` is refused, never collated as if none
  had labels or as if all had);
* **every value**: not ``None``, and numbers (ints, floats or bools; a torch tensor or numpy
  array is fine); a field's values are all scalars or all sequences;
* ``input_ids``: a 1-D sequence of ints;
* ``labels``: per token (a 1-D sequence of ints as long as ``input_ids``) or, in
  :func:`make_hf_collate` only, per sample (a scalar class or regression target);
* ``attention_mask``: a 1-D sequence of 0/1 (ints or bools) as long as ``input_ids``.

Each violation is a ``ValueError`` naming the sample, the field and the way out.

>>> check_batch([{"input_ids": [1, 2]}, {"input_ids": [3], "labels": [3]}], "a collate")
Traceback (most recent call last):
...
ValueError: sample 0 has no 'labels', which sample 1 has: a field must be in every sample of a batch or in none (for labels: give every sample labels, -100 where no loss)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

#: fields whose values are token ids or per-token labels: ints only
INT_FIELDS = ("input_ids", "labels")


def as_batch(batch: Any, what: str) -> Sequence[Any]:
    """``batch`` as a sequence (an iterable such as a generator is read once into a list).

    Raises:
        TypeError: ``batch`` is a mapping, a string or not iterable.
        ValueError: an empty batch.
    """
    if isinstance(batch, (Mapping, str, bytes)) or not isinstance(batch, Iterable):
        raise TypeError(f"a batch is a sequence of samples (a list, or any iterable), got {type(batch).__name__}")
    items = batch if isinstance(batch, Sequence) else list(batch)
    if len(items) == 0:
        raise ValueError("cannot collate an empty batch")
    return items


def check_batch(batch: Any, what: str) -> list[Mapping[str, Any]]:
    """The batch as a list of mappings, each with ``input_ids``, and whose fields are the same.

    ``what``: how the collate describes its samples, for the message of a sample that is no
    dict with ``input_ids``.
    """
    items = as_batch(batch, what)
    for i, sample in enumerate(items):
        if not isinstance(sample, Mapping) or "input_ids" not in sample:
            found = sorted(map(str, sample)) if isinstance(sample, Mapping) else type(sample).__name__
            raise ValueError(f"sample {i} has no 'input_ids' (got {found}): {what}")
    union: dict[str, int] = {}
    for i, sample in enumerate(items):
        for key in sample:
            union.setdefault(key, i)
    for key, first in union.items():
        for i, sample in enumerate(items):
            if key not in sample:
                hint = " (for labels: give every sample labels, -100 where no loss)" if key == "labels" else ""
                raise ValueError(
                    f"sample {i} has no {key!r}, which sample {first} has: a field must be in every "
                    f"sample of a batch or in none{hint}"
                )
    return list(items)


def _array(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def values(batch: Sequence[Mapping[str, Any]], key: str) -> list[np.ndarray]:
    """Every sample's ``key`` as a numpy array: not ``None``, numbers, all scalars or all sequences."""
    out: list[np.ndarray] = []
    for i, sample in enumerate(batch):
        value = sample[key]
        if value is None:
            raise ValueError(f"sample {i}: {key!r} is None: give it a value, or leave the field out of every sample")
        try:
            arr = _array(value)
        except ValueError as exc:  # ragged nested lists
            raise ValueError(f"sample {i}: {key!r} is not a rectangular array of numbers ({exc})") from None
        if arr.dtype.kind not in "iufb" and not (arr.dtype.kind == "O" and arr.size == 0):
            raise ValueError(
                f"sample {i}: {key!r} holds {arr.dtype} values; fields hold numbers (token ids, labels, "
                "masks): convert it, or leave it out of the samples"
            )
        if out and (arr.ndim == 0) != (out[0].ndim == 0):
            kinds = ("a scalar", "a sequence") if out[0].ndim == 0 else ("a sequence", "a scalar")
            raise ValueError(f"sample {i}: {key!r} is {kinds[1]} but sample 0's is {kinds[0]}: give every sample the same kind")
        out.append(arr)
    return out


def _is_int(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "iu" or arr.size == 0  # numpy reads [] as float64


def check_tokens(arrays: Sequence[np.ndarray], key: str = "input_ids") -> np.ndarray:
    """1-D int sequences; returns their lengths (int64)."""
    for i, arr in enumerate(arrays):
        if arr.ndim != 1 or not _is_int(arr):
            raise ValueError(f"sample {i}: {key!r} must be a 1-D sequence of ints (token ids), got shape {arr.shape} {arr.dtype}")
    return np.fromiter((a.shape[0] for a in arrays), dtype=np.int64, count=len(arrays))


def check_labels(arrays: Sequence[np.ndarray], lengths: np.ndarray, *, per_sample: bool) -> bool:
    """Per-token labels (1-D ints as long as ``input_ids``), or scalars where ``per_sample``;
    returns whether they are per token."""
    if arrays[0].ndim == 0:
        if not per_sample:
            raise ValueError("sample 0: 'labels' is a scalar; this collate takes per-token labels (1-D, one per token)")
        return False
    for i, arr in enumerate(arrays):
        if arr.ndim != 1 or not _is_int(arr):
            raise ValueError(
                f"sample {i}: 'labels' must be a 1-D sequence of ints (one per token, -100 where no loss)"
                f"{' or a scalar per sample' if per_sample else ''}, got shape {arr.shape} {arr.dtype}"
            )
        if arr.shape[0] != lengths[i]:
            raise ValueError(f"sample {i}: 'labels' has {arr.shape[:1]} positions but 'input_ids' has {lengths[i]}")
    return True


def check_mask(arrays: Sequence[np.ndarray], lengths: np.ndarray) -> None:
    """``attention_mask``: 1-D 0/1 (ints or bools) as long as ``input_ids``."""
    for i, arr in enumerate(arrays):
        if arr.ndim != 1 or arr.shape[0] != lengths[i]:
            raise ValueError(
                f"sample {i}: 'attention_mask' has shape {arr.shape} but 'input_ids' has {lengths[i]} tokens: "
                "give one 0/1 per token (or leave attention_mask out: it is built)"
            )
        if arr.size and not (arr.dtype.kind in "iub" and np.isin(arr, (0, 1)).all()):
            raise ValueError(f"sample {i}: 'attention_mask' must hold 0 and 1 only, got {np.unique(arr)[:5].tolist()}")


__all__ = ["as_batch", "check_batch", "check_labels", "check_mask", "check_tokens", "values"]
