"""Slow, obviously correct planners: the oracles the fast kernels are compared against.

Everything here is plain Python over lists, one sample at a time, written for reading rather
than speed (STYLE 14, like fairseq's ``batch_by_size_baseline``). Sizes are floats, or tuples
of floats for D-dimensional samples; a cost is any function ``(count, max, sum) -> float``
where ``max``/``sum`` are floats (1-D) or tuples (D-dim).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

Size = Any  # float, or tuple[float, ...]
CostFn = Callable[[int, Size, Size], float]


def _max(a: Size, b: Size) -> Size:
    if isinstance(a, tuple):
        return tuple(max(x, y) for x, y in zip(a, b, strict=True))
    return max(a, b)


def _add(a: Size, b: Size) -> Size:
    if isinstance(a, tuple):
        return tuple(x + y for x, y in zip(a, b, strict=True))
    return a + b


def model_cost(model: Any) -> CostFn:
    """A fitbatch ``CostModel`` as a scalar cost function (one batch at a time)."""

    def cost(count: int, mx: Size, sm: Size) -> float:
        m = np.asarray([mx], dtype=np.float64)
        s = np.asarray([sm], dtype=np.float64)
        return float(model.evaluate(np.asarray([float(count)]), m, s)[0])

    return cost


def as_python(sizes: Any) -> list[Size]:
    """numpy (n,) or (n, D) array -> list of floats or tuples of floats."""
    arr = np.asarray(sizes, dtype=np.float64)
    if arr.ndim == 1:
        return [float(x) for x in arr]
    return [tuple(float(x) for x in row) for row in arr]


def greedy_starts(
    sizes: Sequence[Size],
    budget: float,
    cost: CostFn,
    *,
    cap: int | None = None,
    forced: Iterable[int] = (),
    multiple: int = 1,
    carry: tuple[int, Size, Size] | None = None,
) -> tuple[list[int], tuple[int, Size, Size]]:
    """Greedy batch starts, one sample at a time.

    A sample joins the open batch when the batch with it still costs at most ``budget``, holds
    at most ``cap`` samples, and the sample is not a forced (segment) start; otherwise it starts
    a new batch. An empty batch always takes its sample (a lone oversized sample is a batch).

    ``carry = (count, max, sum)`` is a batch left open before position 0 (its samples are not
    listed). With ``multiple > 1``, a batch closed by the budget or the cap (not by a forced
    start or the end of the sequence) that holds at least ``multiple`` samples is cut back to a
    multiple of ``multiple``; its surplus samples start the next batch, which is then filled
    greedily again. A cut never reaches into the carried samples.

    Returns (start positions, the batch open at the end as (count, max, sum)).
    """
    forced = set(forced)
    n = len(sizes)
    starts: list[int] = []
    if carry is not None and carry[0] > 0:
        batch_start, count, mx, sm = -carry[0], carry[0], carry[1], carry[2]
    else:
        batch_start, count, mx, sm = None, 0, None, None
    p = 0
    while p < n:
        x = sizes[p]
        if count == 0:
            batch_start, count, mx, sm = p, 1, x, x
            starts.append(p)
            p += 1
            continue
        new_max, new_sum = _max(mx, x), _add(sm, x)
        closes = p in forced or cost(count + 1, new_max, new_sum) > budget or (cap is not None and count + 1 > cap)
        if not closes:
            count, mx, sm = count + 1, new_max, new_sum
            p += 1
            continue
        q = p  # the open batch is [batch_start, q)
        if multiple > 1 and p not in forced and count >= multiple:
            cut = batch_start + count - count % multiple
            if cut >= 0:
                q = cut
        # start a fresh batch at q
        batch_start, count, mx, sm = q, 0, None, None
        p = q
    if count == 0:
        return starts, carry if (carry is not None and n == 0) else (0, None, None)
    return starts, (count, mx, sm)


def greedy_batches(sizes: Sequence[Size], budget: float, cost: CostFn, **kw: Any) -> list[list[int]]:
    """:func:`greedy_starts` as lists of positions (no carry)."""
    starts, _ = greedy_starts(sizes, budget, cost, **kw)
    bounds = starts + [len(sizes)]
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def first_fit_batches(
    sizes: Sequence[float], seg_starts: Sequence[int], budget: float, cap: int | None = None
) -> list[list[int]]:
    """First-fit decreasing over descending segments, the textbook way: each sample goes into
    the first batch of its segment (in opening order) whose room, the budget minus the sizes
    already in it subtracted one by one, is at least the sample, and that holds fewer than ``cap``
    samples; otherwise into a new batch."""
    n = len(sizes)
    cap = n if cap is None else cap
    bounds = list(seg_starts) + [n]
    out: list[list[int]] = []
    for s0, s1 in zip(bounds[:-1], bounds[1:], strict=True):
        batches: list[list[int]] = []
        rooms: list[float] = []
        for p in range(s0, s1):
            x = sizes[p]
            j = next((j for j, r in enumerate(rooms) if r >= x and len(batches[j]) < cap), None)
            if j is None:
                batches.append([])
                rooms.append(float(budget))
                j = len(batches) - 1
            batches[j].append(p)
            rooms[j] -= x
        out += batches
    return out


def packed_batches(
    sizes: Sequence[float], order: Sequence[int], seg_starts: Sequence[int], budget: float, loose: float, cap: int | None = None
) -> list[list[int]]:
    """The ``packed`` plan of samples laid out in ``order`` (each segment descending): first-fit
    packing per segment, then the batches of each segment after its last one filled to at least
    ``loose`` x budget (and each segment's last batch) packed again together, descending by size
    (ties by their order in those batches), after the kept batches."""
    laid = [sizes[i] for i in order]
    batches = [[order[p] for p in b] for b in first_fit_batches(laid, seg_starts, budget, cap)]
    if len(seg_starts) <= 1:
        return batches
    ends = list(seg_starts[1:]) + [len(order)]
    seg_of = []
    pos = 0
    for b in batches:
        seg_of.append(next(k for k, e in enumerate(ends) if pos < e))
        pos += len(b)
    loose_ids = set()
    for k in range(len(ends)):
        mine = [j for j, s in enumerate(seg_of) if s == k]
        tight = [j for j in mine if sum(sizes[i] for i in batches[j]) >= loose * budget]
        last_tight = max(tight, default=-1)
        loose_ids.update(j for j in mine if j > last_tight)
        if mine:
            loose_ids.add(mine[-1])
    if len(loose_ids) <= 1:
        return batches
    rest = [i for j in sorted(loose_ids) for i in batches[j]]
    rest = sorted(rest, key=lambda i: -sizes[i])  # stable: ties keep their order
    again = [[rest[p] for p in b] for b in first_fit_batches([sizes[i] for i in rest], [0], budget, cap)]
    return [b for j, b in enumerate(batches) if j not in loose_ids] + again


def batches_from_starts(order: Sequence[int], starts: Sequence[int]) -> list[list[int]]:
    bounds = list(starts) + [len(order)]
    return [list(order[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def batch_cost(batch: Sequence[int], sizes: Sequence[Size], cost: CostFn) -> float:
    """The cost of one batch of indices, from scratch."""
    mx = sm = None
    for i in batch:
        x = sizes[i]
        mx = x if mx is None else _max(mx, x)
        sm = x if sm is None else _add(sm, x)
    return cost(len(batch), mx, sm)


def largest_count(edge: float, budget: float, cost: CostFn, cap: int | None = None) -> int:
    """The most samples of size ``edge`` one batch holds within ``budget``, counted up one by
    one (at least 1, a lone sample; at most ``cap``)."""
    count = 1
    while (cap is None or count < cap) and cost(count + 1, edge, (count + 1) * edge) <= budget:
        count += 1
    return count


def fixed_batches(order: Sequence[int], batch_size: int) -> list[list[int]]:
    """Consecutive batches of ``batch_size`` samples of ``order`` (the last one takes the rest)."""
    order = list(order)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


# ---------------------------------------------------------------------------- collates (issue 37)


def _plain(value: Any) -> Any:
    """A sample's field as plain Python (lists, ints, floats, bools): what a reference reads."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return value.tolist() if hasattr(value, "tolist") else value


def _number_kind(x: Any) -> str | None:
    """'b', 'i' or 'f' for a plain number, ``None`` for anything else."""
    if isinstance(x, bool):
        return "b"
    if isinstance(x, int):
        return "i"
    if isinstance(x, float):
        return "f"
    return None


def _numbers(x: Any) -> bool:
    """A scalar number, or a (nested, rectangular) list of them."""
    if isinstance(x, list):
        if x and isinstance(x[0], list):
            return all(isinstance(r, list) and len(r) == len(x[0]) and _numbers(r) for r in x)
        return all(_number_kind(v) is not None for v in x)
    return _number_kind(x) is not None


def _ints(x: Any) -> bool:
    """A flat list of ints (not bools), or an empty list."""
    return isinstance(x, list) and all(_number_kind(v) == "i" for v in x)


def check_fields(batch: Sequence[Any], checked: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The field rules of ``fitbatch.collate._fields``, one sample at a time, in plain Python.

    ``checked``: the fields whose values are checked (``None``: all).
    """
    samples = list(batch)
    if not samples:
        raise ValueError("empty batch")
    for s in samples:
        if not isinstance(s, dict) or "input_ids" not in s:
            raise ValueError("a sample without input_ids")
    keys: list[str] = []
    for s in samples:
        keys += [k for k in s if k not in keys]
    for s in samples:
        for k in keys:
            if k not in s:
                raise ValueError(f"a sample without {k}")
    plain = [{k: _plain(v) for k, v in s.items()} for s in samples]
    for k in keys if checked is None else [k for k in keys if k in checked]:
        kinds = set()
        for s in plain:
            v = s[k]
            if v is None or not _numbers(v):
                raise ValueError(f"{k}: not numbers")
            kinds.add(isinstance(v, list))
        if len(kinds) > 1:
            raise ValueError(f"{k}: scalars and sequences")
    for s in plain:
        if not _ints(s["input_ids"]):
            raise ValueError("input_ids: not 1-D ints")
    return plain


def hf_collate(batch: Sequence[Any], pad_token_id: int, label_pad: int = -100,
               pad_values: dict[str, Any] | None = None) -> dict[str, list[Any]]:
    """``make_hf_collate(pad_token_id, ...)(batch)`` as lists (return_tensors='np', .tolist())."""
    plain = check_fields(batch)
    fills = {**(pad_values or {}), "input_ids": pad_token_id, "attention_mask": 0}
    fills.setdefault("labels", label_pad)
    keys = list(plain[0])
    n_ids = [len(s["input_ids"]) for s in plain]
    if "labels" in keys and isinstance(plain[0]["labels"], list):
        for s, n in zip(plain, n_ids):
            if not _ints(s["labels"]) or len(s["labels"]) != n:
                raise ValueError("labels: not per-token ints")
    if "attention_mask" in keys:
        for s, n in zip(plain, n_ids):
            m = s["attention_mask"]
            if not isinstance(m, list) or len(m) != n or any(_number_kind(v) not in ("i", "b") or v not in (0, 1) for v in m):
                raise ValueError("attention_mask: not 0/1 per token")
    sequences = [k for k in keys if isinstance(plain[0][k], list)]
    longest = max(len(s[k]) for s in plain for k in sequences)
    out: dict[str, list[Any]] = {}
    for k in keys:
        if k not in sequences:
            out[k] = [s[k] for s in plain]
            continue
        tails = {_shape(s[k])[1:] for s in plain}
        if len(tails) > 1:
            raise ValueError(f"{k}: tails differ")
        tail = tails.pop()
        pad = _filled(tail, fills.get(k, 0))
        out[k] = [list(s[k]) + [pad] * (longest - len(s[k])) for s in plain]
    if "attention_mask" not in out:
        out["attention_mask"] = [[1] * n + [0] * (longest - n) for n in n_ids]
    else:
        out["attention_mask"] = [[int(v) for v in row] for row in out["attention_mask"]]
    return out


def _shape(x: Any) -> tuple[int, ...]:
    return (len(x), *_shape(x[0])) if isinstance(x, list) and x else ((0,) if isinstance(x, list) else ())


def _filled(tail: tuple[int, ...], value: Any) -> Any:
    return [_filled(tail[1:], value) for _ in range(tail[0])] if tail else value


def varlen_collate(batch: Sequence[Any], pad_token_id: int = 0, label_pad: int = -100,
                   separator: bool = True) -> dict[str, Any]:
    """``make_varlen_collate(return_tensors='np', ...)(batch)`` as lists."""
    plain = check_fields(batch, checked=("input_ids", "labels"))
    for s in plain:
        if not s["input_ids"]:
            raise ValueError("a sample with no tokens")
        if "labels" in s and (not _ints(s["labels"]) or len(s["labels"]) != len(s["input_ids"])):
            raise ValueError("labels: not per-token ints")
    ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    seq_idx: list[int] = []
    cu = [0]
    for i, s in enumerate(plain):
        tokens = s["input_ids"]
        own = list(s.get("labels", tokens))
        if separator:
            own[0] = label_pad
        ids += tokens
        labels += own
        positions += list(range(len(tokens)))
        seq_idx += [i] * len(tokens)
        cu.append(cu[-1] + len(tokens))
    return {"input_ids": [ids], "labels": [labels], "position_ids": [positions], "seq_idx": [seq_idx],
            "cu_seq_lens_q": cu, "max_length_q": max(len(s["input_ids"]) for s in plain)}
