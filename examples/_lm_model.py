"""A small causal transformer language model with padded and packed (varlen) batches.

Two batch layouts, one model:

* **padded** (``collate_padded``): ``(B, L)`` rows, right-padded to the batch's longest sample.
  Causal attention needs no separate key-padding mask here: a real query at position ``i <
  length`` only sees keys ``<= i``, all real, so ``is_causal=True`` is exactly "causal and key
  padding" for every position that enters the loss (padded positions are ignored by the loss).
* **packed** (``collate_packed``): the batch's samples concatenated into one ``(1, T)`` row;
  positions restart at 0 for each sample and attention is block-diagonal causal, so no token
  sees another sample. Backends (``attention=``):

  - ``"njt"``: nested (jagged) tensors into ``scaled_dot_product_attention`` — FlashAttention
    varlen on CUDA, per-sample math on CPU;
  - ``"flex"``: ``flex_attention`` with a document-causal ``BlockMask`` (compiled; CUDA);
  - ``"grouped"``: samples gathered into a few length-grouped padded tiles, one causal SDPA
    call per tile (any device, no compile; the CPU default);
  - ``"dense"``: one SDPA call with a ``(T, T)`` block-diagonal boolean mask (reference).

>>> import torch
>>> model = TinyLM(LMConfig(vocab=50, dim=16, layers=1, heads=2, max_len=8))
>>> seqs = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]
>>> a = model.loss(collate_padded(seqs))
>>> b = model.loss(collate_packed(seqs), attention="dense")
>>> torch.allclose(a[0], b[0], atol=1e-5), int(a[1]), int(b[1])
(True, 3, 3)
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

ATTENTIONS = ("auto", "dense", "flex", "grouped", "njt")

# name -> (dim, layers, heads); parameters with a 8192 vocabulary and untied embeddings
MODEL_SIZES = {
    "tiny": (64, 2, 2),  # ~0.6 M
    "small": (128, 4, 4),  # ~3 M
    "25M": (384, 8, 6),  # ~20 M
    "100M": (768, 12, 12),  # ~98 M
}


@dataclass(frozen=True)
class LMConfig:
    vocab: int
    dim: int = 128
    layers: int = 4
    heads: int = 4
    max_len: int = 512

    @classmethod
    def named(cls, size: str, *, vocab: int, max_len: int) -> LMConfig:
        if size not in MODEL_SIZES:
            raise ValueError(f"model size must be one of {sorted(MODEL_SIZES)}, got {size!r}")
        dim, layers, heads = MODEL_SIZES[size]
        return cls(vocab=vocab, dim=dim, layers=layers, heads=heads, max_len=max_len)


@dataclass
class LMBatch:
    """Model inputs: ``tokens``/``positions``/``targets`` (R, T) and the attention layout.

    ``lengths`` (padded layout) or ``cu_seqlens`` (packed layout: sample starts in the row
    plus the end, int64). ``targets`` is -100 where no loss is taken (padding, last token).
    ``real_tokens`` counts the samples' own tokens, padding excluded.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    targets: torch.Tensor
    lengths: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0
    real_tokens: int = 0  # tokens of the samples themselves, padding excluded

    @property
    def slots(self) -> int:
        """Token positions the model computes on, padding included."""
        return int(self.tokens.numel())

    def to(self, device: torch.device | str) -> LMBatch:
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return LMBatch(
            move(self.tokens), move(self.positions), move(self.targets),
            move(self.lengths), move(self.cu_seqlens), self.max_seqlen, self.real_tokens,
        )


def _targets(seq: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(seq, -100)
    out[:-1] = seq[1:]
    return out


def collate_padded(seqs: Sequence[Any], pad_to_multiple_of: int = 1) -> LMBatch:
    """Right-pad samples to the longest (rounded up to ``pad_to_multiple_of``)."""
    seqs = [torch.as_tensor(s, dtype=torch.long) for s in seqs]
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    width = -(-int(lengths.max()) // pad_to_multiple_of) * pad_to_multiple_of
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    targets = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
        targets[i, : len(s)] = _targets(s)
    positions = torch.arange(width).expand(len(seqs), width).contiguous()
    return LMBatch(tokens, positions, targets, lengths=lengths, max_seqlen=width, real_tokens=int(lengths.sum()))


def collate_packed(seqs: Sequence[Any], pad_to: int | None = None) -> LMBatch:
    """Concatenate samples into one row; ``pad_to`` pads the row to a fixed width (static shapes).

    The padding, if any, forms one extra "sample" with no loss, so attention stays exact.
    """
    seqs = [torch.as_tensor(s, dtype=torch.long) for s in seqs]
    lens = [len(s) for s in seqs]
    real = sum(lens)
    if pad_to is not None and pad_to > real:
        seqs.append(torch.zeros(pad_to - real, dtype=torch.long))
        lens.append(pad_to - real)
    tokens = torch.cat(seqs)[None]
    cu = torch.zeros(len(lens) + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    positions = (torch.arange(int(cu[-1])) - torch.repeat_interleave(cu[:-1], torch.tensor(lens)))[None]
    targets = torch.cat([_targets(s) for s in seqs])[None]
    if pad_to is not None and pad_to > real:
        targets[0, real:] = -100
        positions[0, real:] = 0  # the filler may be longer than the position table
    return LMBatch(tokens, positions, targets, cu_seqlens=cu, max_seqlen=max(lens), real_tokens=real)


# ----------------------------------------------------------------------------- attention


def _dense_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    t = q.shape[-2]
    doc = torch.repeat_interleave(torch.arange(len(cu) - 1, device=q.device), cu.diff())
    idx = torch.arange(t, device=q.device)
    mask = (doc[:, None] == doc[None, :]) & (idx[:, None] >= idx[None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _grouped_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal attention as a few padded tiles of similar-length samples.

    Samples are grouped by length class (powers of two), so a tile pads each sample to less
    than twice its length; padded keys sit after every real query, so ``is_causal`` suffices.
    """
    h, t, d = q.shape[1:]
    lens = cu.diff()
    starts = cu[:-1]
    out = torch.empty_like(q)
    cls = torch.ceil(torch.log2(lens.clamp(min=1).double())).long()
    for c in torch.unique(cls).tolist():
        sel = (cls == c).nonzero().flatten()
        width = int(lens[sel].max())
        offs = torch.arange(width, device=q.device)
        pos = starts[sel, None] + offs[None]  # (n, width) row positions, clamped inside the row
        valid = offs[None] < lens[sel, None]
        pos = torch.where(valid, pos, starts[sel, None])
        qt, kt, vt = (x[0][:, pos].permute(1, 0, 2, 3) for x in (q, k, v))  # (n, h, width, d)
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        flat_pos = pos[valid]
        out[0][:, flat_pos] = o.permute(1, 0, 2, 3)[:, valid]
    return out


def _njt_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int) -> torch.Tensor:
    def nest(x: torch.Tensor) -> torch.Tensor:  # (1, h, T, d) -> nested (B, h, j, d)
        return torch.nested.nested_tensor_from_jagged(
            x[0].transpose(0, 1).contiguous(), cu, max_seqlen=max_len
        ).transpose(1, 2)

    o = F.scaled_dot_product_attention(nest(q), nest(k), nest(v), is_causal=True)
    return o.transpose(1, 2).values().transpose(0, 1)[None]


_FLEX: dict[str, Any] = {}
_NJT_BROKEN: dict[str, str] = {}  # device type -> why nested-tensor attention failed there


def _flex_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any) -> torch.Tensor:
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"](q, k, v, block_mask=block_mask)


def flex_block_mask(cu: torch.Tensor, t: int) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.repeat_interleave(torch.arange(len(cu) - 1, device=cu.device), cu.diff())

    def document_causal(b: Any, h: Any, qi: Any, ki: Any) -> Any:
        return (doc[qi] == doc[ki]) & (qi >= ki)

    # compiled on CUDA: the eager path materialises a (T, T) mask, too big at T = 65536
    return create_block_mask(document_causal, None, None, t, t, device=cu.device, _compile=cu.is_cuda)


def resolve_attention(attention: str, device: torch.device | str) -> str:
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    if attention == "auto":
        return "njt" if torch.device(device).type == "cuda" else "grouped"
    return attention


# ----------------------------------------------------------------------------- model


class Block(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1, self.ln2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.qkv, self.proj = nn.Linear(cfg.dim, 3 * cfg.dim), nn.Linear(cfg.dim, cfg.dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(), nn.Linear(4 * cfg.dim, cfg.dim))

    def forward(self, x: torch.Tensor, batch: LMBatch, attention: str, extra: Any) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if batch.cu_seqlens is None:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif attention == "dense":
            att = _dense_packed(q, k, v, batch.cu_seqlens)
        elif attention == "grouped":
            att = _grouped_packed(q, k, v, batch.cu_seqlens)
        elif attention == "njt" and _NJT_BROKEN.get(q.device.type) is None:
            try:
                att = _njt_packed(q, k, v, batch.cu_seqlens, batch.max_seqlen)
            except RuntimeError as err:  # no varlen kernel for this device/dtype: say so, go on
                _NJT_BROKEN[q.device.type] = str(err)
                logger.warning("nested-tensor attention failed (%s); using 'grouped'", err)
                att = _grouped_packed(q, k, v, batch.cu_seqlens)
        elif attention == "njt":
            att = _grouped_packed(q, k, v, batch.cu_seqlens)
        else:
            att = _flex_packed(q, k, v, extra)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """GPT-style decoder: token + learned position embeddings, pre-norm blocks, untied head."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.max_len, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def logits(self, batch: LMBatch, attention: str = "auto") -> torch.Tensor:
        attention = resolve_attention(attention, batch.tokens.device)
        extra = None
        if batch.cu_seqlens is not None and attention == "flex":
            extra = flex_block_mask(batch.cu_seqlens, batch.tokens.shape[1])
        x = self.tok(batch.tokens) + self.pos(batch.positions)
        for block in self.blocks:
            x = block(x, batch, attention, extra)
        return self.head(self.norm(x))

    def forward(self, batch: LMBatch, attention: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
        """Summed next-token cross-entropy and the number of predicted tokens.

        The loss is the forward pass, so a ``DistributedDataParallel`` wrapper syncs it.
        """
        logits = self.logits(batch, attention)
        targets = batch.targets
        keep = targets != -100
        total = F.cross_entropy(logits[keep].float(), targets[keep], reduction="sum")
        return total, keep.sum()

    loss = forward


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def evaluate(
    model: TinyLM, seqs: Sequence[Any], *, device: torch.device | str = "cpu", token_batch: int = 8192,
    dtype: torch.dtype | None = None,
) -> float:
    """Mean next-token loss (nats per predicted token) over ``seqs``, in sorted padded batches."""
    was = model.training
    model.eval()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    total, count, start = 0.0, 0, 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * len(seqs[order[end]]) <= token_batch:
            end += 1
        batch = collate_padded([seqs[i] for i in order[start:end]]).to(device)
        with torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None):
            s, n = model.loss(batch, attention="dense")
        total, count, start = total + float(s), count + int(n), end
    model.train(was)
    return total / max(count, 1)


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))


# ----------------------------------------------------------------------------- training


@dataclass
class TrainResult:
    """What one training run consumed and produced (this rank's share for the counts)."""

    real_tokens: int = 0  # samples' own tokens trained on (the unit of throughput)
    slots: int = 0  # positions computed on, padding included
    steps: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time: steadier than wall time on a shared machine
    ooms: int = 0
    eval_seconds: float = 0.0  # time spent in ``checkpoint`` calls, left out of ``seconds``
    eval_cpu_seconds: float = 0.0  # the same in CPU time, left out of ``cpu_seconds``
    losses: list[tuple[int, float]] | None = None  # (global real tokens so far, batch loss)

    @property
    def padded_fraction(self) -> float:
        return 1.0 - self.real_tokens / max(self.slots, 1)


def token_lr(peak: float, consumed: float, total: float, warmup: float = 0.05) -> float:
    """Learning rate by tokens consumed (not steps): linear warm-up, then cosine to 10 %.

    Modes with different batch counts then follow the same schedule per real token.
    """
    frac = consumed / max(total, 1.0)
    if frac < warmup:
        return peak * max(frac, 1e-3) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, (frac - warmup) / (1 - warmup)))))


def train_until(
    model: nn.Module,
    batches: Any,
    *,
    tokens: int,
    lr: float = 3e-3,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    attention: str = "auto",
    world: int = 1,
    log_every: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    checkpoint: Callable[[TrainResult, int], bool] | None = None,
    checkpoint_every: int = 0,
    schedule_tokens: int | None = None,
) -> TrainResult:
    """Train on ``batches`` until ``tokens`` real tokens (over all ranks) have been consumed.

    ``batches`` yields ``(LMBatch, global_real, global_predicted)``: the step's real tokens and
    predicted tokens summed over all ranks, so every rank stops at the same step and the loss
    is the mean over the step's predicted tokens (gradients of ``world`` ranks are averaged by
    DDP, hence the factor ``world``). An out-of-memory error skips the batch and is counted.

    ``checkpoint(result, consumed)`` is called after the first step that crosses each multiple
    of ``checkpoint_every`` real tokens (and after the last step), with ``result.seconds`` /
    ``cpu_seconds`` the training time so far; its own time goes to ``eval_seconds`` /
    ``eval_cpu_seconds``, not to the training clocks. It returns True to stop training.
    ``schedule_tokens`` (default ``tokens``) is the horizon of the learning-rate schedule.
    """
    device = torch.device(device)
    horizon = tokens if schedule_tokens is None else schedule_tokens
    next_check = checkpoint_every if checkpoint_every > 0 else tokens
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer or torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    res = TrainResult(losses=[])
    consumed = 0
    model.train()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    for batch, global_real, global_pred in batches:
        for group in opt.param_groups:
            group["lr"] = token_lr(lr, consumed, horizon)
        batch = batch.to(device)
        try:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                total, n_pred = model(batch, attention)
            loss = total * (world / max(int(global_pred), 1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        except torch.OutOfMemoryError:
            res.ooms += 1
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        consumed += int(global_real)
        res.real_tokens += batch.real_tokens
        res.slots += batch.slots
        res.steps += 1
        res.losses.append((consumed, float(total.detach()) / max(int(n_pred), 1)))
        if log_every and res.steps % log_every == 0:
            logger.info("step %d: %d tokens, loss %.3f", res.steps, consumed, res.losses[-1][1])
        done = consumed >= tokens
        if checkpoint is not None and (done or consumed >= next_check):
            sync()
            res.seconds = time.perf_counter() - t0 - res.eval_seconds
            res.cpu_seconds = time.process_time() - c0 - res.eval_cpu_seconds
            e0, ec0 = time.perf_counter(), time.process_time()
            done = checkpoint(res, consumed) or done
            res.eval_seconds += time.perf_counter() - e0
            res.eval_cpu_seconds += time.process_time() - ec0
            while next_check <= consumed:
                next_check += max(checkpoint_every, 1)
        if done:
            break
    sync()
    res.seconds = time.perf_counter() - t0 - res.eval_seconds
    res.cpu_seconds = time.process_time() - c0 - res.eval_cpu_seconds
    return res


LR_RULES = ("same", "sqrt", "linear")


def mode_lr(lr: float, tokens_per_step: float, baseline_tokens_per_step: float, rule: str = "sqrt") -> float:
    """The learning rate of a mode whose steps carry ``tokens_per_step`` real tokens.

    ``lr`` is the baseline's (fixed batch size) rate. ``"sqrt"`` scales it by the square root
    of the tokens-per-step ratio, the usual rule for Adam when the batch grows; ``"linear"``
    by the ratio itself (the SGD rule; ``fitbatch.schedule.GradientAccumulator`` offers the same two);
    ``"same"`` keeps it. Budget batches hold several times the real tokens of the safe fixed batch.

    >>> mode_lr(1e-3, 400.0, 100.0, "sqrt"), mode_lr(1e-3, 400.0, 100.0, "linear")
    (0.002, 0.004)
    """
    if rule not in LR_RULES:
        raise ValueError(f"lr rule must be one of {LR_RULES}, got {rule!r}")
    if rule == "same":
        return lr
    if rule == "linear":
        return lr * tokens_per_step / max(baseline_tokens_per_step, 1.0)
    return lr * math.sqrt(tokens_per_step / max(baseline_tokens_per_step, 1.0))


def short_run_parser(description: str) -> argparse.ArgumentParser:
    """The options of the short framework examples (Hugging Face datasets, Lightning)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--mode", choices=("padded", "packed"), default="padded")
    p.add_argument("--files", type=int, default=100)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=30_000)
    p.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="tiny")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--seed", type=int, default=0)
    return p
