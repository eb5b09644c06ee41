"""Padded collate with Hugging Face conventions: the dict a transformers model takes.

Dict samples (``input_ids``, optional ``labels``, ``attention_mask`` and other fields) become
``(B, L)`` tensors padded per field: ``input_ids`` with the tokenizer's pad id, ``labels`` with
``-100`` (transformers' ignore index), ``attention_mask`` with 0 (built when absent), any other
field with the value a mapping gives (default 0). Scalar fields (a class label) are stacked.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fitbatch.collate import _fields as F
from fitbatch.collate._pad import padded_dtype
from fitbatch.collate._shapes import _pick, as_shapes

RETURN_TENSORS = ("pt", "np")


def _int(name: str, value: Any, low: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or (low is not None and value < low)
    ):
        bound = f" >= {low}" if low is not None else ""
        raise TypeError(f"{name} must be an int{bound}, got {value!r}")
    return int(value)


def _pad_values(given: Mapping[str, float] | None, pad_token_id: int, label_pad: int) -> dict[str, float]:
    """The padding value of every field: ``pad_values``, where ``input_ids`` and ``labels`` may be
    named too (they must agree with ``pad_token_id``; a ``labels`` entry replaces the default
    ``label_pad``) and ``attention_mask`` pads with 0 only."""
    if given is not None and not isinstance(given, Mapping):
        raise TypeError(f"pad_values must be a mapping of field name to padding value, got {type(given).__name__}")
    values = dict(given or {})
    if values.setdefault("input_ids", pad_token_id) != pad_token_id:
        raise ValueError(
            f"pad_values['input_ids']={values['input_ids']!r} disagrees with pad_token_id={pad_token_id}: give one"
        )
    if "labels" in values and label_pad not in (-100, values["labels"]):
        raise ValueError(f"pad_values['labels']={values['labels']!r} disagrees with label_pad={label_pad}: give one")
    values.setdefault("labels", label_pad)
    for key in INT_PADDED:
        _int(f"pad_values[{key!r}]", values[key])
    if values.setdefault("attention_mask", 0) != 0:
        raise ValueError(f"pad_values['attention_mask'] must be 0 (padding is masked out), got {values['attention_mask']!r}")
    return values


INT_PADDED = ("input_ids", "labels")


def make_hf_collate(
    pad_token_id: int,
    *,
    label_pad: int = -100,
    pad_values: Mapping[str, float] | None = None,
    pad_to_multiple_of: int = 1,
    position_ids: bool = False,
    shapes: Any = None,
    return_tensors: str = "pt",
) -> Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]]:
    """A padded collate for dict samples returning the names a transformers model accepts.

    Every sequence field is right-padded to the batch's longest sequence (rounded up to
    ``pad_to_multiple_of``, or to a shape of ``shapes``); scalar fields are stacked.

    Args:
        pad_token_id: the value of padded ``input_ids`` (``tokenizer.pad_token_id``).
        label_pad: the value of padded ``labels`` (``-100``: no loss there).
        pad_values: the padding value of fields by name (default 0 for any field not
            named; ``attention_mask`` is always padded with 0). ``labels`` here replaces
            ``label_pad``; ``input_ids`` here must equal ``pad_token_id``.
        pad_to_multiple_of: round the padded length up to a multiple of this (8 for tensor cores).
        position_ids: also return ``position_ids`` ``(B, L)``: 0, 1, ... in every row.
        shapes: allowed ``(rows, length)`` shapes (a ``(k, 2)`` array-like, e.g. a plan's
            ``shapes``): each batch is padded to the one :func:`pick_shape` picks; the extra
            rows are all padding (``attention_mask`` 0, ``labels`` ``label_pad``).
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).

    Returns:
        ``collate(samples) -> dict`` with ``input_ids``, ``attention_mask`` (int64, 1 on real
        tokens), ``labels`` when the samples have them, and every other field of the samples.

    Raises:
        TypeError: if ``pad_token_id``, ``label_pad`` or ``pad_to_multiple_of`` is not an int
            (``pad_to_multiple_of`` >= 1).
        ValueError: for an unknown ``return_tensors``, bad ``shapes`` or ``pad_values`` that
            disagree with ``pad_token_id``/``label_pad``; the collate function raises
            ``ValueError`` for a batch that breaks the field rules (:mod:`fitbatch.collate._fields`:
            a field in some samples only, ``None`` or non-numeric values, float ``input_ids``,
            ``labels`` or ``attention_mask`` not as long as ``input_ids``), fields whose shapes
            differ beyond the length axis, or a batch no shape fits.

    >>> collate = make_hf_collate(pad_token_id=0, return_tensors="np")
    >>> out = collate([{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8], "labels": [8]}])
    >>> out["input_ids"].tolist(), out["attention_mask"].tolist(), out["labels"].tolist()
    ([[5, 6, 7], [8, 0, 0]], [[1, 1, 1], [1, 0, 0]], [[5, 6, 7], [8, -100, -100]])
    """
    if pad_token_id is None:
        raise TypeError(
            "pad_token_id must be an int: pass tokenizer.pad_token_id (or eos_token_id if it has none)"
        )
    values = _pad_values(pad_values, _int("pad_token_id", pad_token_id), _int("label_pad", label_pad))
    multiple = _int("pad_to_multiple_of", pad_to_multiple_of, low=1)
    if return_tensors not in RETURN_TENSORS:
        raise ValueError(f"return_tensors must be one of {RETURN_TENSORS}, got {return_tensors!r}")
    table = None if shapes is None else as_shapes(shapes)

    def collate(batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Pad ``batch`` field by field (see :func:`make_hf_collate`)."""
        out = _collate(batch, values, multiple, table)
        if position_ids:
            out["position_ids"] = np.broadcast_to(
                np.arange(out["input_ids"].shape[1]), out["input_ids"].shape
            ).copy()
        if return_tensors == "pt":
            import torch

            return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
        return out

    return collate


def _columns(batch: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], dict[str, list[np.ndarray]]]:
    """The samples and every field's values, checked by the field rules (:mod:`._fields`)."""
    items = F.check_batch(batch, "make_hf_collate takes dict samples")
    columns = {k: F.values(items, k) for k in items[0]}
    lengths = F.check_tokens(columns["input_ids"])
    if "labels" in columns:
        F.check_labels(columns["labels"], lengths, per_sample=True)
    if "attention_mask" in columns:
        F.check_mask(columns["attention_mask"], lengths)
    return items, columns


def _collate(
    batch: Sequence[Mapping[str, Any]],
    values: Mapping[str, float],
    multiple: int,
    table: np.ndarray | None,
) -> dict[str, np.ndarray]:
    batch, columns = _columns(batch)
    sequences = {k: v for k, v in columns.items() if v[0].ndim >= 1}
    lens = {
        k: np.fromiter((x.shape[0] for x in v), dtype=np.int64, count=len(v))
        for k, v in sequences.items()
    }
    longest = max(int(n.max()) for n in lens.values())
    rows, length = len(batch), -(-longest // multiple) * multiple
    if table is not None:
        rows, length = _pick(table, len(batch), longest)
    out: dict[str, np.ndarray] = {}
    for key, items in columns.items():
        fill = values.get(key, 0)
        if key not in sequences:
            stacked = np.asarray(items)
            out[key] = np.concatenate(
                [stacked, np.full((rows - len(items), *stacked.shape[1:]), fill, stacked.dtype)]
            )
            continue
        tails = {x.shape[1:] for x in items}
        if len(tails) > 1:
            raise ValueError(
                f"field {key!r}: samples differ beyond their first (length) axis: {sorted(tails)}"
            )
        raw = [sample[key] for sample in batch]
        dtype = padded_dtype(items, raw, fill) if key != "attention_mask" else np.int64
        padded = np.full((rows, length, *tails.pop()), fill, dtype=dtype)
        # every real position (row i, t < lens[i]) receives the concatenated tokens, in order
        real = (
            np.arange(length)[None, :]
            < np.append(lens[key], np.zeros(rows - len(items), np.int64))[:, None]
        )
        padded[real] = np.concatenate(items)
        out[key] = padded
    if "attention_mask" not in out:
        ids_lens = np.append(lens["input_ids"], np.zeros(rows - len(batch), np.int64))
        out["attention_mask"] = (np.arange(length)[None, :] < ids_lens[:, None]).astype(np.int64)
    return out
