"""Calibration on a real small transformer, measured on CPU with the live-tensor tracker."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fitbatch.memory import measure_peak  # noqa: E402
from fitbatch.memory.calibrate import Calibration, calibrate  # noqa: E402

VOCAB, DIM = 64, 32


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        layer = torch.nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)))


@pytest.fixture(scope="module")
def lm_step():
    net = TinyLM()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step(tokens):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(
            net(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten()
        )
        loss.backward()
        opt.step()

    def make_batch(count, length):
        return torch.randint(0, VOCAB, (count, length), generator=gen)

    return step, make_batch


def calibrate_lm(step, make_batch, log, capacity):
    """The language-model calibration of these tests, probes logged to (and resumed from) ``log``."""
    return calibrate(
        step, make_batch, device="cpu", capacity=capacity, lengths=(8, 16, 32, 64, 128), log=log, progress=False
    )


@pytest.fixture(scope="module")
def calibration(lm_step, tmp_path_factory):
    step, make_batch = lm_step
    log = tmp_path_factory.mktemp("cal") / "probes.jsonl"
    cal = calibrate_lm(step, make_batch, log, "4MiB")
    return cal, log


def test_transformer_held_out_shapes_within_ten_percent(calibration, lm_step):
    cal, _ = calibration
    step, make_batch = lm_step
    assert isinstance(cal, Calibration) and cal.complete
    assert cal.capacity == 4 * 2**20 and cal.budget == pytest.approx(0.95 * cal.capacity)
    assert all(cal.max_counts[L] >= 1 for L in (8, 16, 32, 64, 128))
    probed = {(p.count, p.length) for p in cal.probes}
    rng = np.random.default_rng(0)
    errors, covered = [], []
    while len(errors) < 10:
        length = int(rng.integers(10, 120))
        most = int(cal.model.max_count(np.array([float(length)]), cal.budget)[0])
        count = max(1, int(rng.uniform(0.5, 1.0) * most))
        if (count, length) in probed:
            continue
        measured = measure_peak(lambda c=count, L=length: step(make_batch(c, L)))
        errors.append(cal.model.predict([count], [length], upper=False)[0] / measured - 1)
        covered.append(
            cal.model.predict([count], [length])[0] >= measured and measured <= cal.capacity
        )
    assert max(abs(e) for e in errors) < 0.10, errors
    assert all(covered)


def test_probe_log_resumes_without_rerunning(calibration, lm_step):
    cal, log = calibration
    step, make_batch = lm_step
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == len({(p.count, p.length) for p in cal.probes})
    calls = []

    def counting_step(batch):
        calls.append(batch.shape)
        step(batch)

    again = calibrate_lm(counting_step, make_batch, log, "4MiB")
    assert calls == []
    assert again.model == cal.model and again.max_counts == cal.max_counts
    # a smaller capacity re-decides from the logged peaks: fewer samples fit, few new probes
    smaller = calibrate_lm(counting_step, make_batch, log, "2MiB")
    assert all(smaller.max_counts[L] <= cal.max_counts[L] for L in smaller.max_counts)


def test_out_of_memory_steps_and_time_limit():
    def step(batch):
        if batch.numel() > 2048:
            raise torch.OutOfMemoryError("test double")
        (batch * 2).sum()

    def make_batch(count, length):
        return torch.zeros(count, length)

    cal = calibrate(
        step,
        make_batch,
        device="cpu",
        capacity="1GiB",
        lengths=(16, 64),
        progress=False,
        headroom=0.0,
    )
    assert cal.max_counts == {16: 128, 64: 32}
    assert any(p.peak is None for p in cal.probes) and cal.budget == 2**30
    with pytest.raises(RuntimeError, match="too few"):
        calibrate(
            step,
            make_batch,
            device="cpu",
            capacity="1GiB",
            lengths=(16, 64),
            time_limit=1e-9,
            progress=False,
        )


def test_validation_and_progress_bar():
    pytest.importorskip("tqdm")

    def make_batch(count, length):
        return torch.zeros(count, length)

    with pytest.raises(ValueError, match="headroom"):
        calibrate(lambda b: b, make_batch, device="cpu", capacity=1000, headroom=0.95)
    with pytest.raises(ValueError, match="lengths"):
        calibrate(lambda b: b, make_batch, device="cpu", capacity=1000, lengths=())
    with pytest.raises(ValueError, match="capacity"):
        calibrate(lambda b: b, make_batch, device="cpu", capacity="lots")
    with pytest.raises(ValueError, match="capacity"):
        calibrate(lambda b: b, make_batch, device="meta")
    cal = calibrate(
        lambda b: b + 1, make_batch, device="cpu", capacity="16KiB", lengths=(8, 16), progress=True
    )
    assert cal.to_dict()["max_counts"] == {"8": 256, "16": 128}
    json.dumps(cal.to_dict())
