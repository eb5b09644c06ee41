"""TRL's ``SFTTrainer`` with fitbatch batches: the plan is the batch the model sees.

``class Trainer(FitbatchTrainerMixin, SFTTrainer)`` on a tiny random-initialised Llama and an
in-memory word-level tokenizer (``tests/integrations/tiny_lm.py``; nothing is downloaded). In one
process: a ``"text"`` dataset (TRL appends EOS) with ``shuffle_dataset=True`` and
``pad_to_multiple_of``, a ``messages`` dataset, TRL's ``padding_free`` and fitbatch's varlen
collate (the ``num_tokens`` metric with a 4-D mask), and what is refused at construction. Under
``torchrun`` (2 gloo processes): each sample once per epoch, the budget on every batch, the
Trainer's loss-token count, and ``resume_from_checkpoint`` mid-epoch with the same weights
(``tests/integrations/sft_worker.py``).
"""

from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl", reason="the integrations extra is not installed")
datasets = pytest.importorskip("datasets", reason="the integrations extra is not installed")

import fitbatch  # noqa: E402
from fitbatch.collate import make_varlen_collate  # noqa: E402
from fitbatch.integrations.transformers import (  # noqa: E402
    BudgetSampling,
    FitbatchTrainerMixin,
    causal_loss_sizes,
)

WORKERS = Path(__file__).resolve().parent / "integrations"
sys.path.insert(0, str(WORKERS))
import tiny_lm  # noqa: E402
from test_integrations import results, torchrun  # noqa: E402


class Trainer(FitbatchTrainerMixin, trl.SFTTrainer):
    """SFTTrainer on fitbatch batches, logging each micro-batch: [global_step, shape, num_items, batch]."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        items = None if num_items_in_batch is None else int(num_items_in_batch)
        self.seen.append([self.state.global_step, tuple(inputs["input_ids"].shape), items,
                          {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "position_ids")}])
        return super().training_step(model, inputs, num_items_in_batch)


@pytest.fixture(scope="module")
def tok():
    return tiny_lm.tokenizer()


def config(tmp_path, **kw):
    base = {"use_cpu": True, "report_to": "none", "save_strategy": "no", "num_train_epochs": 1, "logging_steps": 1,
            "disable_tqdm": True, "gradient_accumulation_steps": 2, "seed": 0}
    return trl.SFTConfig(str(tmp_path / "out"), **{**base, **kw})


def build(tmp_path, tok, data, batch_sampler, collator=None, **kw):
    trainer = Trainer(model=tiny_lm.model(len(tok)), args=config(tmp_path, **kw), train_dataset=data,
                      processing_class=tok, data_collator=collator, batch_sampler=batch_sampler)
    trainer.seen = []
    return trainer


def real_rows(batch) -> list[tuple[int, ...]]:
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    return [tuple(row[m].tolist()) for row, m in zip(ids, mask)]


def test_sft_text_shuffled_and_padded_to_a_multiple_stays_in_budget_each_row_once(tmp_path, tok, one_torch_thread):
    texts = tiny_lm.texts(60)
    data = datasets.Dataset.from_dict({"text": texts})
    trainer = build(tmp_path, tok, data, BudgetSampling(256), shuffle_dataset=True, pad_to_multiple_of=16)
    prepared = [tuple(r) for r in trainer.train_dataset["input_ids"]]
    assert all(r[-1] == tok.eos_token_id for r in prepared), "TRL appended EOS: the sizes include it"
    lengths = np.array([len(r) for r in prepared])
    np.testing.assert_array_equal(trainer.batch_sampler._sizes.values, -(-lengths // 16) * 16)
    trainer.train()
    assert all(rows * width <= 256 and width % 16 == 0 for _, (rows, width), _, _ in trainer.seen)
    trained = [r for *_, batch in trainer.seen for r in real_rows(batch)]
    assert Counter(trained) == Counter(prepared), "each prepared row once"
    # num_items_in_batch: the optimizer step's loss tokens, as causal_loss_sizes counts them per row
    loss = dict(zip(prepared, causal_loss_sizes(trainer.train_dataset)))
    by_step = defaultdict(list)
    for step, _, items, batch in trainer.seen:
        by_step[step].append((items, sum(loss[r] for r in real_rows(batch))))
    for parts in by_step.values():
        assert {items for items, _ in parts} == {sum(n for _, n in parts)}
    units = trainer.batch_sampler.step_totals().loss_units
    assert int(units.sum()) == sum(loss[r] for r in trained)


def test_sft_refuses_sizes_of_other_rows_and_trl_packing_at_construction(tmp_path, tok):
    texts = tiny_lm.texts(40)
    raw = [len(tok(t)["input_ids"]) for t in texts]  # what a user measures: no EOS yet

    def sampler(sizes):
        return fitbatch.BudgetBatchSampler(sizes, 256, num_replicas=1, rank=0)

    with pytest.raises(ValueError, match=r"40 train_dataset rows are longer than their sizes.*appended EOS.*BudgetSampling"):
        build(tmp_path, tok, datasets.Dataset.from_dict({"text": texts}), sampler(raw))
    # with EOS, but TRL's shuffle_dataset=True permutes the rows after they were measured
    with pytest.raises(ValueError, match=r"rows are longer than their sizes.*shuffle_dataset=True"):
        build(tmp_path, tok, datasets.Dataset.from_dict({"text": texts}), sampler([n + 1 for n in raw]),
              shuffle_dataset=True)
    build(tmp_path, tok, datasets.Dataset.from_dict({"text": texts}), sampler([n + 1 for n in raw]))  # the same rows
    with pytest.raises(ValueError, match=r"packing=True.*strategy='packed'"):
        build(tmp_path, tok, datasets.Dataset.from_dict({"text": texts}), BudgetSampling(256), packing=True, max_length=64)


def test_sft_messages_dataset(tmp_path, tok, one_torch_thread):
    rng = np.random.default_rng(2)
    chats = [[{"role": "user", "content": t}, {"role": "assistant", "content": a}]
             for t, a in zip(tiny_lm.texts(30, 20, seed=1), tiny_lm.texts(30, 10, seed=2))]
    rng.shuffle(chats)
    trainer = build(tmp_path, tok, datasets.Dataset.from_dict({"messages": chats}), BudgetSampling(200))
    trainer.train()
    assert all(rows * width <= 200 for _, (rows, width), _, _ in trainer.seen)
    assert sum(rows for _, (rows, _), _, _ in trainer.seen) == 30


@pytest.mark.parametrize("how", ["trl_padding_free", "fitbatch_varlen"])
def test_sft_padding_free_rows_under_a_packed_plan(tmp_path, tok, how, one_torch_thread):
    """TRL's padding_free=True (its own collator) or make_varlen_collate(causal_mask=True) (eager/sdpa
    attention): one row per batch of at most the budget's tokens; num_tokens counts the real tokens."""
    data = datasets.Dataset.from_dict({"text": tiny_lm.texts(40)})
    spec = BudgetSampling(160, cost="sum", strategy="packed")
    if how == "trl_padding_free":
        trainer = build(tmp_path, tok, data, spec, padding_free=True, max_length=None)
    else:
        trainer = build(tmp_path, tok, data, spec, collator=make_varlen_collate(causal_mask=True))
    trainer.train()
    tokens = sum(len(r) for r in trainer.train_dataset["input_ids"])
    assert all(rows == 1 and width <= 160 for _, (rows, width), _, _ in trainer.seen)
    assert sum(width for _, (_, width), _, _ in trainer.seen) == tokens, "each row once, no padding"
    loss = int(causal_loss_sizes(trainer.train_dataset).sum())
    steps = {step: items for step, _, items, _ in trainer.seen}
    assert sum(steps.values()) == loss, "num_items_in_batch: the loss tokens, as counted per row"
    logged = [x["num_tokens"] for x in trainer.state.log_history if "num_tokens" in x]
    assert logged and all(math.isfinite(v) for v in logged) and logged[-1] == tokens


def test_sft_two_processes_each_sample_once_in_budget_and_resume_mid_epoch(tmp_path):
    """Two gloo processes: a "text" dataset, shuffle_dataset=True, pad_to_multiple_of=8,
    BudgetSampling(256); then resume_from_checkpoint at step 5 (inside epoch 1)."""
    from sft_worker import BUDGET, MULTIPLE

    worker = WORKERS / "sft_worker.py"
    torchrun(worker, "--out", str(tmp_path), "--phase", "full", "--save-steps", "5")
    full = results(tmp_path, "full", 2)
    for f in full:
        assert "longer than their sizes" in f["refused"] and "BudgetSampling" in f["refused"], f["refused"]
    prepared = Counter(tuple(r) for r in full[0]["prepared"])
    assert all(r[-1] == full[0]["eos"] for r in prepared)
    for epoch in range(2):
        trained = Counter(tuple(r) for f in full for x in f["log"] if x[1] == epoch for r in x[2])
        assert trained == prepared, "each prepared row once per epoch over both ranks"
        assert len({sum(1 for x in f["log"] if x[1] == epoch) for f in full}) == 1, "equal steps"
    for f in full:
        for *_, (n, width), _ in f["log"]:
            assert n * width <= BUDGET and width % MULTIPLE == 0
    loss_of = {tuple(r): len(r) - 1 for r in prepared}  # every label but the first (no -100 in text)
    steps = defaultdict(list)
    for f in full:
        for step, _, rows, _, items in f["log"]:
            steps[step].append((items, sum(loss_of[tuple(r)] for r in rows)))
    for parts in steps.values():
        assert {items for items, _ in parts} == {sum(n for _, n in parts)}, "num_items_in_batch over both ranks"
    assert full[0]["num_tokens"][-1] == 2 * sum(len(r) * k for r, k in prepared.items())

    torchrun(worker, "--out", str(tmp_path), "--phase", "resume", "--resume-step", "5")
    resumed = results(tmp_path, "resume", 2)
    for f, r in zip(full, resumed):
        assert r["log"] == [x for x in f["log"] if x[0] >= 5], "resume_from_checkpoint continues at the batch"
        np.testing.assert_allclose(r["params"], f["params"], rtol=0, atol=1e-6)
