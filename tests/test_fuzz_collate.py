"""Fuzzing the dict collates against the slow references of ``tests/reference.py`` (issue 37).

Random batches of dict samples -- fields present or absent per sample, values as lists, numpy
arrays of several dtypes or torch tensors, ints, floats, bools, strings or ``None`` -- go
through ``make_hf_collate`` / ``make_varlen_collate`` and through the plain-Python references,
which apply the field rules of ``fitbatch.collate._fields`` one sample at a time. Either both
refuse the batch (``ValueError``/``TypeError``), or both give the same arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import reference
from hypothesis import event, given
from hypothesis import strategies as st

from fitbatch.collate import make_hf_collate, make_varlen_collate

torch = pytest.importorskip("torch")

KINDS = ["int", "int", "int", "float", "bool", "str", "none"]


@st.composite
def value(draw: Any, n: int, kind: str, scalar: bool = False) -> Any:
    """A field's value: ``n`` numbers of ``kind`` (or one, ``scalar``), in some container."""
    if kind == "none":
        return None
    element = {"int": st.integers(-5, 50), "float": st.floats(-5, 50, allow_nan=False).map(lambda x: x + 0.5),
               "bool": st.booleans(), "str": st.sampled_from(["a", "bc"])}[kind]
    if scalar:
        return draw(element)
    items = draw(st.lists(element, min_size=n, max_size=n))
    box = draw(st.sampled_from(["list", "numpy", "numpy32", "torch"]))
    if box == "list" or kind == "str":
        return items
    if box == "torch" and n:
        return torch.tensor(items)
    if box == "numpy32" and kind == "int":
        return np.asarray(items, dtype=np.int32)
    return np.asarray(items) if n else items


@st.composite
def batches(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 5))
    sometimes = draw(st.sampled_from(["all", "all", "all", "some"]))  # fields in every sample, or not
    has = {f: draw(st.booleans()) for f in ("labels", "attention_mask", "score", "label_scalar")}
    has["label_scalar"] = has["label_scalar"] and not has["labels"]
    kinds = {f: draw(st.sampled_from(KINDS)) if draw(st.integers(0, 4)) == 0 else "int" for f in
             ("input_ids", "labels", "attention_mask", "score")}
    score_scalar = draw(st.booleans())
    out = []
    for _ in range(n):
        length = draw(st.sampled_from([0, *range(1, 7), *range(1, 7)]))  # an empty sample now and then
        sample: dict[str, Any] = {"input_ids": draw(value(length, kinds["input_ids"]))}
        for field in ("labels", "attention_mask", "score", "label_scalar"):
            if not has[field] or (sometimes == "some" and draw(st.booleans())):
                continue
            if field == "labels":
                off = draw(st.sampled_from([0] * 10 + [1, -1])) if length else 0
                labels = draw(value(length + off, kinds["labels"]))
                sample["labels"] = labels
            elif field == "label_scalar":
                sample["labels"] = draw(st.integers(0, 3))
            elif field == "attention_mask":
                off = draw(st.sampled_from([0] * 10 + [-1])) if length else 0
                mask = draw(st.lists(st.integers(0, 1), min_size=length + off, max_size=length + off))
                if kinds["attention_mask"] == "bool":
                    mask = [bool(m) for m in mask]
                elif kinds["attention_mask"] != "int":
                    mask = draw(value(length + off, kinds["attention_mask"]))
                sample["attention_mask"] = mask
            else:
                sample["score"] = draw(value(draw(st.integers(0, 4)), kinds["score"], scalar=score_scalar))
        out.append(sample)
    return out


def outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except (ValueError, TypeError) as exc:
        return "refused", type(exc).__name__


def lists(out: dict[str, Any]) -> dict[str, Any]:
    return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in out.items()}


@given(batches(), st.integers(0, 3))
def test_hf_collate_equals_the_reference(batch: list[dict[str, Any]], pad: int) -> None:
    fast = outcome(lambda: lists(make_hf_collate(pad, return_tensors="np")(batch)))
    slow = outcome(lambda: reference.hf_collate(batch, pad))
    assert fast[0] == slow[0], (fast, slow)
    event(fast[0])  # --hypothesis-show-statistics: how many batches were collated, how many refused
    if fast[0] == "ok":
        assert fast[1] == slow[1]


@given(batches(), st.booleans())
def test_varlen_collate_equals_the_reference(batch: list[dict[str, Any]], separator: bool) -> None:
    fast = outcome(lambda: make_varlen_collate(return_tensors="np", separator=separator)(batch))
    slow = outcome(lambda: reference.varlen_collate(batch, separator=separator))
    assert fast[0] == slow[0], (fast, slow)
    event(fast[0])
    if fast[0] == "ok":
        got = lists(fast[1])
        for key, want in slow[1].items():
            assert got[key] == want, key
        assert got["cu_seq_lens_k"] == got["cu_seq_lens_q"] and got["max_length_k"] == got["max_length_q"]
