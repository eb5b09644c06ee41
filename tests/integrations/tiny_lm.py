"""A tiny causal LM and tokenizer built in memory (no download), for the TRL tests and workers.

* :func:`tokenizer`: a word-level ``PreTrainedTokenizerFast`` over ``w0 .. w{WORDS-1}`` with
  ``<pad>``, ``</s>`` (EOS) and a minimal chat template (for ``messages`` datasets);
* :func:`model`: a random-initialised ``LlamaForCausalLM`` from a config (two layers, width 32);
* :func:`texts`: ``n`` texts of 3 to ``longest`` words, seeded.
"""

from __future__ import annotations

import numpy as np

WORDS = 40
SPECIAL = ["<pad>", "</s>", "<unk>", "user:", "assistant:"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% if not loop.last %} {% endif %}{% endfor %}"
    "{% if add_generation_prompt %} assistant:{% endif %}"
)


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + [f"w{i}" for i in range(WORDS)])}
    vocab.update({"user": len(vocab), "assistant": len(vocab) + 1, ":": len(vocab) + 2})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def model(vocab_size: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=0, eos_token_id=1, bos_token_id=None)
    return LlamaForCausalLM(config)


def texts(n: int, longest: int = 40, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, longest + 1, n)
    return [" ".join(f"w{int(w)}" for w in rng.integers(0, WORDS, k)) for k in lengths]
