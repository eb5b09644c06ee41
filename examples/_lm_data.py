"""Real token sequences with no download: the running Python's standard library, tokenised.

Every function (``def``/``async def``, nested ones included) of the standard library's ``.py``
files becomes one sample: the ids of the tokens that start on its lines, as the ``tokenize``
module splits them. Lengths are long-tailed (median ~45 tokens, a few thousand at most), the
shape that makes fixed batch sizes waste compute.

Token ids come from a small frequency-ranked vocabulary: ``0`` is padding, then one
"unknown" id per token type (``NAME``, ``STRING``, ``COMMENT``, ...), then the most frequent
token strings of the corpus; ``NEWLINE``/``INDENT``/``DEDENT`` are one id each. The vocabulary
is rebuilt from the files read, so it is deterministic for a given Python and ``--files``.

>>> data = load_corpus(files=4, vocab_size=512, max_len=64)
>>> data.vocab_size, len(data.train) > 0, max(len(s) for s in data.train) <= 64
(512, True, True)
"""

from __future__ import annotations

import ast
import functools
import itertools
import os
import sysconfig
import tokenize
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PAD = 0
_STRUCTURAL = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT}
_SKIP = {tokenize.ENCODING, tokenize.ENDMARKER}


def stdlib_files(limit: int | None = None) -> list[Path]:
    """The standard library's ``.py`` files (no tests, site-packages, idlelib, lib2to3).

    With ``limit``, an evenly spread subset of that many files (deterministic).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        if Path(folder) == root:  # pruned, not filtered: site-packages may be large or changing
            dirs[:] = [d for d in dirs if d not in ("site-packages", "test", "idlelib", "lib2to3")]
        dirs[:] = [d for d in dirs if d != "site-packages" and not d.startswith("__pycache__")]
        files.extend(Path(folder) / n for n in names if n.endswith(".py"))
    files.sort()
    if limit is not None and limit < len(files):
        picks = np.linspace(0, len(files) - 1, num=max(1, limit)).round().astype(int)
        files = [files[i] for i in sorted(set(picks.tolist()))]
    return files


def _key(tok: tokenize.TokenInfo) -> tuple[int, str]:
    return (tok.type, "" if tok.type in _STRUCTURAL else tok.string)


def file_functions(path: Path) -> list[list[tuple[int, str]]]:
    """The token keys ``(type, string)`` of every function of one file (empty if unparsable)."""
    try:
        source = path.read_bytes()
        with open(path, "rb") as fh:
            toks = [t for t in tokenize.tokenize(fh.readline) if t.type not in _SKIP]
        tree = ast.parse(source)
    except (SyntaxError, tokenize.TokenError, UnicodeDecodeError, ValueError):
        return []
    starts = np.asarray([t.start[0] for t in toks], dtype=np.int64)
    keys = [_key(t) for t in toks]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            lo = int(np.searchsorted(starts, node.lineno, side="left"))
            hi = int(np.searchsorted(starts, node.end_lineno, side="right"))
            if hi - lo >= 2:  # a next-token target needs two tokens
                out.append(keys[lo:hi])
    return out


@dataclass(frozen=True)
class Corpus:
    """Tokenised samples: ``train`` and ``heldout`` lists of int64 arrays, and the vocabulary size."""

    train: list[np.ndarray]
    heldout: list[np.ndarray]
    vocab_size: int

    @property
    def train_lengths(self) -> np.ndarray:
        return np.asarray([len(s) for s in self.train], dtype=np.int64)


def build_vocab(functions: Sequence[Sequence[tuple[int, str]]], vocab_size: int) -> dict[tuple[int, str], int]:
    """Token key -> id: padding 0, one unknown id per token type, then the most frequent keys."""
    n_types = tokenize.N_TOKENS  # token types are 0 .. N_TOKENS - 1
    if vocab_size < 1 + n_types + 1:
        raise ValueError(f"vocab_size must be at least {n_types + 2}, got {vocab_size}")
    counts = Counter(k for fn in functions for k in fn)
    vocab = {}
    for key, _ in counts.most_common(vocab_size - 1 - n_types):
        vocab[key] = 1 + n_types + len(vocab)
    return vocab


def encode(fn: Sequence[tuple[int, str]], vocab: dict[tuple[int, str], int]) -> np.ndarray:
    return np.asarray([vocab.get(k, 1 + k[0]) for k in fn], dtype=np.int64)


def load_corpus(
    *, files: int | None = 400, vocab_size: int = 4096, max_len: int = 512, heldout: float = 0.05, seed: int = 0
) -> Corpus:
    """Tokenise ``files`` stdlib files (``None``: all ~700) into train and held-out samples.

    Sequences longer than ``max_len`` are truncated (their first ``max_len`` tokens are kept).
    The held-out set is a seeded random ``heldout`` share of the functions.
    """
    functions = [fn for path in stdlib_files(files) for fn in file_functions(path)]
    if not functions:
        raise ValueError(f"no functions found in {files!r} standard-library files")
    vocab = build_vocab(functions, vocab_size)
    seqs = [encode(fn[:max_len], vocab) for fn in functions]
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    is_held = rng.random(len(seqs)) < heldout
    if not is_held.any():
        is_held[int(rng.integers(len(seqs)))] = True
    train = [s for s, h in zip(seqs, is_held) if not h]
    held = [s for s, h in zip(seqs, is_held) if h]
    return Corpus(train, held, vocab_size)


def take_tokens(lengths: np.ndarray, tokens: int, seed: int = 0) -> np.ndarray:
    """Indices of a seeded random subset of samples holding about ``tokens`` real tokens."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))
    order = rng.permutation(len(lengths))
    keep = int(np.searchsorted(np.cumsum(lengths[order]), tokens)) + 1
    return np.sort(order[:keep])


# ----------------------------------------------------------------------------- batching

MODES = ("fixed", "padded", "packed")


def fixed_batch_size(lengths: np.ndarray, budget: int) -> int:
    """The largest fixed batch size that never exceeds ``budget`` padded tokens.

    Its worst batch holds the longest samples, padded to the very longest; ``budget // max``
    (for the padded cost this is ``fitbatch.plan.largest_safe_batch_size``).
    """
    return max(1, int(budget) // int(lengths.max()))


def make_sampler(
    mode: str, lengths: np.ndarray, budget: int, *, seed: int = 0, num_replicas: int = 1, rank: int = 0
) -> Any:
    """The batch sampler of a mode; every sampler here has ``set_epoch``.

    * ``fixed``: torch's ``DistributedSampler`` (a shuffled permutation, split over ranks)
      in batches of :func:`fixed_batch_size` samples — what a careful user does without fitbatch;
    * ``padded``: ``BudgetBatchSampler(cost="padded", strategy="pooled")``: count x longest <= budget;
    * ``packed``: ``BudgetBatchSampler(cost="sum", strategy="packed")``: sum of lengths <= budget.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "fixed":
        from torch.utils.data import BatchSampler, DistributedSampler

        base = DistributedSampler(
            range(len(lengths)), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed
        )
        sampler = BatchSampler(base, fixed_batch_size(lengths, budget), drop_last=False)
        sampler.set_epoch = base.set_epoch  # type: ignore[attr-defined]
        return sampler
    import fitbatch

    cost, strategy = ("padded", "pooled") if mode == "padded" else ("sum", "packed")
    return fitbatch.BudgetBatchSampler(
        lengths, budget, cost=cost, strategy=strategy, seed=seed, num_replicas=num_replicas, rank=rank,
        loss_sizes=np.maximum(np.asarray(lengths) - 1, 0),  # next-token targets: the tokens that carry loss
    )


class TokenDataset:
    """Map-style dataset over token arrays (a ``torch`` ``Dataset`` by protocol)."""

    def __init__(self, seqs: Sequence[np.ndarray]) -> None:
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.seqs[i]


def iterate_batches(
    mode: str,
    sampler: Any,
    seqs: Sequence[np.ndarray],
    *,
    world: int = 1,
    pad_to: int | None = None,
    num_workers: int = 0,
) -> Iterator[tuple[Any, int, int]]:
    """Endless ``(LMBatch, global real tokens, global predicted tokens)`` over epochs.

    fitbatch's sampler knows every step's totals over all ranks (``step_totals()``), so the
    loss normaliser needs no communication; the fixed baseline all-reduces its counts.
    """
    import torch
    from _lm_model import collate_packed, collate_padded
    from torch.utils.data import DataLoader

    if mode == "packed":
        collate: Any = functools.partial(collate_packed, pad_to=pad_to)
    else:
        collate = collate_padded
    loader = DataLoader(TokenDataset(seqs), batch_sampler=sampler, collate_fn=collate, num_workers=num_workers)
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        totals = sampler.step_totals() if hasattr(sampler, "step_totals") else None
        for k, batch in enumerate(loader):
            if totals is not None:
                yield batch, int(totals.units[k]), int(totals.loss_units[k])
                continue
            counts = torch.tensor([batch.real_tokens, int((batch.targets != -100).sum())])
            if world > 1:
                import torch.distributed as dist

                dist.all_reduce(counts)
            yield batch, int(counts[0]), int(counts[1])
