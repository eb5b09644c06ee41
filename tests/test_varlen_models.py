"""Proofs on a real transformers model (a tiny Llama, random init, CPU, float32, sdpa attention):
padding-free batches give each sample's own loss and the padded batches' gradients, and the
block-causal mask is what keeps the samples apart. Sample lengths are real: tokens per function
of the CPython standard library (tests/data)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import load_lengths

from fitbatch import make_hf_collate, make_varlen_collate

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LENGTHS = load_lengths("functions")[:18]  # 33 16 16 31 13 70 50 86 31 40 65 197 180 33 133 7 8 8


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def samples(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1, 128, (int(n),), generator=g)} for n in lengths]


def alone(model, batch):
    """Each sample through the model by itself: its logits, and the token-weighted mean loss."""
    logits, total, count = [], 0.0, 0
    for s in batch:
        out = model(input_ids=s["input_ids"][None], labels=s["input_ids"][None])
        n = s["input_ids"].numel() - 1
        logits.append(out.logits[0])
        total, count = total + out.loss * n, count + n
    return torch.cat(logits), total / count


@pytest.mark.parametrize("shapes", [None, [[8, 128], [4, 64]]])
@torch.no_grad()
def test_varlen_loss_equals_the_samples_alone(shapes):
    model = tiny_llama().eval()
    batch = samples(LENGTHS[:6])  # 179 tokens, longest 70: shapes pad T to 8 * 128 = 1024
    packed = make_varlen_collate(causal_mask=True, shapes=shapes)(batch)
    assert packed["input_ids"].shape[1] == (179 if shapes is None else 1024)
    out = model(**packed)
    ref_logits, ref_loss = alone(model, batch)
    torch.testing.assert_close(out.loss, ref_loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logits[0, :179], ref_logits, atol=1e-5, rtol=0)


@torch.no_grad()
def test_without_the_mask_samples_see_each_other():
    """Why ``causal_mask=True`` exists: sdpa has no varlen path, so position_ids alone do not
    keep the samples apart in transformers 5.23 -- it infers the boundaries from position_ids only
    when no attention mask is passed *and* no cache is built (``use_cache=False``)."""
    model = tiny_llama().eval()
    batch = samples(LENGTHS[:4])
    packed = make_varlen_collate(causal_mask=True)(batch)
    ref, _ = alone(model, batch)
    ids, pos = packed["input_ids"], packed["position_ids"]
    leaks = {
        "position_ids only": model(input_ids=ids, position_ids=pos).logits[0],
        "position_ids and a 2-D mask of ones": model(
            input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids)
        ).logits[0],
    }
    for how, logits in leaks.items():
        first = int(LENGTHS[0])  # the first sample sees nothing before it: the same either way
        torch.testing.assert_close(logits[:first], ref[:first], atol=1e-5, rtol=0)
        assert (logits[first:] - ref[first:]).abs().max() > 1e-2, (
            f"{how}: expected later samples to leak"
        )
    inferred = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
    torch.testing.assert_close(inferred, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(model(**packed).logits[0], ref, atol=1e-5, rtol=0)


def _step(model, batch, tokens):
    model.zero_grad()
    out = model(**batch, num_items_in_batch=tokens)  # sum-reduced loss / the same token count
    out.loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_padded_and_padding_free_training_give_equal_gradients():
    padded_model = tiny_llama(seed=1).train()
    packed_model = copy.deepcopy(padded_model)
    opt_padded = torch.optim.SGD(padded_model.parameters(), lr=0.5)
    opt_packed = torch.optim.SGD(packed_model.parameters(), lr=0.5)
    padded_collate = make_hf_collate(pad_token_id=0, pad_to_multiple_of=8)
    packed_collate = make_varlen_collate(causal_mask=True)
    for step in range(3):
        batch = samples(LENGTHS[6 * step : 6 * step + 6], seed=step)
        tokens = sum(s["input_ids"].numel() - 1 for s in batch)  # predicted tokens, both layouts
        padded = padded_collate([{**s, "labels": s["input_ids"]} for s in batch])
        assert (padded["labels"] == -100).sum() == padded["labels"].numel() - tokens - len(batch)
        grads_padded = _step(padded_model, padded, tokens)
        grads_packed = _step(packed_model, packed_collate(batch), tokens)
        for name, grad in grads_padded.items():
            torch.testing.assert_close(
                grads_packed[name], grad, atol=1e-5, rtol=0, msg=f"step {step}: {name}"
            )
        # the gradients are not trivially 0
        assert max(g.abs().max() for g in grads_padded.values()) > 1e-3
        opt_padded.step()
        opt_packed.step()
    for a, b in zip(padded_model.parameters(), packed_model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
