"""Sizes from array columns (numpy, ``pyarrow``, ``pandas``), ``datasets`` columns and tokenizers.

Every helper returns a 1-D numpy array (int64 when every size is a whole number, else float64),
validated like :func:`fitbatch.as_sizes`. Optional libraries (``pyarrow``, ``pandas``,
``datasets``) are imported inside the helpers that need them, never at import time; the other
size sources (:mod:`fitbatch.sizes._files`, :mod:`fitbatch.sizes._readers`) build on
:func:`_finish`, :func:`to_numbers` and :func:`from_array` here.

>>> from_array([3, 1, 2])
array([3, 1, 2])
>>> from_tokenizer(["a b c", "d"], lambda batch: [t.split() for t in batch])
array([3, 1])
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fitbatch.sizes._coerce import MAX_EXACT, as_sizes

logger = logging.getLogger("fitbatch.sizes")  # one logger for every size source


def _require(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs {module!r}: pip install 'fitbatch[{extra}]' (or pip install {module.split('.')[0]})"
        ) from exc


def _finish(values: NDArray[Any], where: str) -> NDArray[Any]:
    """Validate like :func:`as_sizes` and return int64 when every size is whole, else float64."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{where}: sizes must be 1-D, got shape {arr.shape}")
    if arr.dtype == bool:
        raise ValueError(f"{where}: sizes must be numbers, got booleans (dtype bool)")
    try:
        as_sizes(arr)  # before any cast: uint64 above 2**63 must not wrap to negative int64
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None
    out = arr.astype(np.int64 if arr.dtype.kind in "iu" else np.float64, copy=False)
    if out.dtype == np.float64 and out.size and np.all(out == np.floor(out)) and out.max() <= MAX_EXACT:
        return out.astype(np.int64)
    return out


def _inexact_row(values: Sequence[Any], numbers: NDArray[np.float64]) -> int | None:
    """The first of ``values`` (number strings) that is an integer above 2**53, which ``numbers``
    (their float64 parse) holds rounded; ``None`` if there is none."""
    if not numbers.size or not numbers.max() >= MAX_EXACT:
        return None
    for i in np.flatnonzero(numbers >= MAX_EXACT).tolist():
        text = values[i].decode() if isinstance(values[i], bytes) else str(values[i])
        try:
            if int(text) > MAX_EXACT:
                return int(i)
        except ValueError:  # a float literal such as 1e17: a float, not rounded from an integer
            continue
    return None


def _too_large(value: Any) -> str:
    shown = value.decode() if isinstance(value, bytes) else value
    return f"{shown} is an integer above 2**53 = {MAX_EXACT}, which float64 cannot hold exactly"


def to_numbers(values: Sequence[Any] | NDArray[Any], where: str, first_row: int = 0) -> NDArray[np.float64]:
    """Strings or objects to float64, or ``ValueError`` naming the first bad row and its value.

    >>> to_numbers(["1", "2.5"], "x").tolist()
    [1.0, 2.5]
    >>> to_numbers(["1", "two"], "column 'n'")
    Traceback (most recent call last):
    ...
    ValueError: column 'n' row 1: 'two' is not a number
    """
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        pass
    for i, v in enumerate(values):  # only on failure: find the row to report
        try:
            if v is None or isinstance(v, bool):
                raise ValueError
            float(v)
        except (TypeError, ValueError):
            shown = v.decode(errors="replace") if isinstance(v, bytes) else v
            if np.ndim(shown) > 0:  # a list column (token ids, say): its lengths are the sizes
                raise ValueError(
                    f"{where} row {first_row + i}: a list ({type(shown).__name__} of {len(shown)}), not a number; "
                    "take the lengths (`fitbatch index` does for parquet list columns), or choose a column of sizes"
                ) from None
            what = "missing value" if v is None or shown == "" else f"{shown!r} is not a number"
            raise ValueError(f"{where} row {first_row + i}: {what}") from None
    raise ValueError(f"{where}: values are not numbers")  # pragma: no cover - asarray failed on a 2-D ragged input


def from_array(column: Any, *, name: str = "sizes") -> NDArray[Any]:
    """Sizes from a column: numpy array, list, ``pyarrow`` Array/ChunkedArray or ``pandas`` Series.

    Args:
        column: one size per sample; strings that hold numbers are converted.
        name: what to call the column in error messages.

    Returns:
        1-D int64 array (float64 if some size is fractional).

    Raises:
        ValueError: a missing or non-numeric value (its row is named), a negative size.

    >>> from_array(["4", "5"])
    array([4, 5])
    >>> from_array([1.5, 2])
    array([1.5, 2. ])
    """
    where = f"column {name!r}"
    if hasattr(column, "is_null") and hasattr(column, "to_numpy"):  # pyarrow Array / ChunkedArray
        if column.null_count:
            nulls = np.flatnonzero(np.asarray(column.is_null()))
            raise ValueError(f"{where} row {int(nulls[0])}: missing value ({len(nulls)} missing in all)")
        arr = column.to_numpy(zero_copy_only=False) if not hasattr(column, "chunks") else column.to_numpy()
    elif hasattr(column, "isna") and hasattr(column, "to_numpy"):  # pandas Series
        missing = np.asarray(column.isna())
        if missing.any():
            bad = np.flatnonzero(missing)
            raise ValueError(f"{where} row {int(bad[0])}: missing value ({bad.size} missing in all)")
        arr = column.to_numpy()
    elif hasattr(column, "detach"):  # torch
        arr = column.detach().cpu().numpy()
    else:
        arr = np.asarray(column) if not isinstance(column, (list, tuple)) else np.asarray(column, dtype=object)
    if arr.dtype.kind not in "iufb":
        objects = arr.tolist() if arr.dtype == object else arr.astype(object).tolist()
        arr = to_numbers(objects, where)
        big = _inexact_row(objects, arr)
        if big is not None:
            raise ValueError(f"{where} row {big}: {_too_large(objects[big])}")
    if arr.dtype.kind == "f" and arr.size and np.isnan(arr).any():
        raise ValueError(f"{where} row {int(np.flatnonzero(np.isnan(arr))[0])}: missing value (NaN)")
    return _finish(arr, where)


# ---------------------------------------------------------------------------- tokenizers


def _token_counts(batch: list[str], tokenizer: Any) -> list[int]:
    """Tokens per text of one batch for an HF tokenizer, a ``tokenizers.Tokenizer`` or a function."""
    if hasattr(tokenizer, "encode_batch"):  # tokenizers.Tokenizer (transformers' have no encode_batch)
        return [len(e.ids) for e in tokenizer.encode_batch(batch)]
    out = tokenizer(batch)
    if hasattr(out, "keys") and "input_ids" in out:  # transformers BatchEncoding / dict
        out = out["input_ids"]
    counts = [len(x) for x in out]
    if len(counts) != len(batch):
        raise ValueError(
            f"the tokenizer returned {len(counts)} results for a batch of {len(batch)} texts; it must "
            "take a list of texts and return one token sequence per text (or a mapping with 'input_ids')"
        )
    return counts


def _batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def from_tokenizer(texts: Iterable[str] | Any, tokenizer: Any, *, batch_size: int = 1024) -> NDArray[np.int64]:
    """Tokens per text: run ``tokenizer`` over a text column in batches.

    Args:
        texts: an iterable of strings, or a ``pyarrow``/``pandas`` string column.
        tokenizer: a ``transformers`` tokenizer (called on a list, ``input_ids`` counted), a
            ``tokenizers.Tokenizer`` (``encode_batch``), or any function taking a list of texts
            and returning one token sequence per text.
        batch_size: texts per tokenizer call.

    Returns:
        int64 token counts, one per text.

    >>> from_tokenizer(["x = 1", "pass"], lambda b: [s.split() for s in b]).tolist()
    [3, 1]
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a column of strings, got a single string")
    if hasattr(texts, "to_pylist"):
        texts = texts.to_pylist()
    elif hasattr(texts, "tolist"):
        texts = texts.tolist()
    counts: list[int] = []
    for batch in _batched(texts, max(1, int(batch_size))):
        counts.extend(_token_counts(batch, tokenizer))
    return np.asarray(counts, dtype=np.int64)


# ---------------------------------------------------------------------------- datasets


def _lengths_batch(values: list[Any], *, column: str, tokenizer: Any) -> dict[str, list[int]]:
    """The ``.map(batched=True)`` function: lengths (or token counts) of one batch."""
    if tokenizer is not None:
        return {column: _token_counts(list(values), tokenizer)}
    return {column: [len(v) for v in values]}


def from_dataset(
    dataset: Any,
    column: str,
    *,
    source: str | None = None,
    tokenizer: Any = None,
    num_proc: int | None = None,
    batch_size: int = 1000,
) -> NDArray[Any]:
    """Sizes from a Hugging Face ``datasets.Dataset`` column, computed when it is missing.

    Args:
        dataset: a ``datasets.Dataset`` (anything with ``column_names``, ``map`` and
            ``with_format``).
        column: the size column; read directly (as Arrow, no Python loop) when present.
        source: when ``column`` is missing, the column to measure: ``len(value)`` of each value
            (token ids, audio arrays), or with ``tokenizer`` the token count of each text.
        tokenizer: see :func:`from_tokenizer`.
        num_proc: processes for ``dataset.map(batched=True, num_proc=...)``.
        batch_size: rows per ``map`` batch.

    Returns:
        1-D int64 (or float64) sizes in dataset order.

    Raises:
        ValueError: ``column`` is missing and no ``source`` is given, or ``source`` is missing.

    A stand-in with the two members a dataset whose size column exists needs (with the
    ``datasets`` library, pass the ``Dataset`` itself):

    >>> class Rows:
    ...     column_names = ["text", "n_tokens"]
    ...     def with_format(self, kind):          # kind is "arrow": columns without a copy
    ...         return {"text": ["a b", "c", "d e f"], "n_tokens": [2, 1, 3]}
    >>> from_dataset(Rows(), "n_tokens")
    array([2, 1, 3])
    >>> from_dataset(Rows(), "length")
    Traceback (most recent call last):
    ...
    ValueError: dataset has no column 'length'; columns: ['text', 'n_tokens']. Pass source='<column>' to compute 'length' as the length (or, with tokenizer=, the token count) of each value
    """
    names = list(dataset.column_names)
    if column not in names:
        if source is None:
            raise ValueError(
                f"dataset has no column {column!r}; columns: {names}. Pass source='<column>' to "
                f"compute {column!r} as the length (or, with tokenizer=, the token count) of each value"
            )
        if source not in names:
            raise ValueError(f"dataset has no column {source!r} to measure; columns: {names}")
        fn = functools.partial(_lengths_batch, column=column, tokenizer=tokenizer)
        logger.info("computing %r from %r with dataset.map(batched=True, num_proc=%s)", column, source, num_proc)
        dataset = dataset.map(
            fn, batched=True, batch_size=batch_size, input_columns=[source], num_proc=num_proc,
            remove_columns=[c for c in names if c != source] + [source], desc=f"fitbatch: {column}",
        )
    values = dataset.with_format("arrow")[column]
    return from_array(values, name=column)
