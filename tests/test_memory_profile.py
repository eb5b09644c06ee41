"""Peak measurement: the live-tensor tracker gives exact peaks for known allocation patterns."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fitbatch.memory import (  # noqa: E402
    PeakTracker,
    collect_peak_memory,
    detect_capacity,
    is_oom_error,
    measure_peak,
)
from fitbatch.memory.profile import as_device  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_known_pattern_exact(device):
    def work():
        a = torch.empty(1000, device=device)  # 4000
        b = torch.empty(2000, device=device)  # 12000 live: peak
        del a
        c = torch.empty(500, device=device)  # 10000
        d = b[:100] * 2  # +400
        del b, c, d

    assert measure_peak(work, device=device) == 12000


def test_views_and_inplace_are_not_new_memory():
    base = torch.zeros(1024)  # created before: never counted

    def work():
        v = base.view(32, 32).t()
        base.add_(1)
        w = v.contiguous()  # 4096 new bytes
        w.mul_(2)
        return w

    with PeakTracker("cpu") as t:
        out = work()
        assert (t.peak, t.current) == (4096, 4096)
        del out
        assert t.current == 0
    assert t.peak == 4096


def test_peak_then_free_and_sequence():
    sizes = [3, 7, 2, 9, 1]

    def work():
        held = []
        for n in sizes:
            held.append(torch.empty(n * 100, dtype=torch.float64))
        # 2200 elements * 8 bytes at the peak
        del held[:]
        return torch.empty(10, dtype=torch.int8)

    assert measure_peak(work) == sum(sizes) * 100 * 8


def test_autograd_step_counts_gradients_not_parameters():
    lin = torch.nn.Linear(100, 100)
    x = torch.randn(64, 100)

    def step():
        lin.zero_grad(set_to_none=True)
        lin(x).relu().sum().backward()

    step()
    with PeakTracker() as t:
        step()
    grads = lin.weight.numel() * 4 + lin.bias.numel() * 4
    assert t.current == grads  # only the new gradients outlive the step
    assert t.peak > grads


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():

        def work():
            a = torch.empty(256, 256)
            return (a @ a).sum()

        peak = measure_peak(work)
    assert peak == 2 * 256 * 256 * 4 + 4  # a, a @ a and the scalar sum


def test_nested_trackers_see_the_same_ops():
    with PeakTracker() as outer:
        x = torch.empty(100)
        with PeakTracker() as inner:
            y = torch.empty(50)
        del x, y
    assert (outer.peak, inner.peak) == (600, 200)


def test_collect_warmup_failures_and_features():
    calls = []

    def work(n):
        calls.append(n)
        if n > 100:
            raise torch.OutOfMemoryError(f"cannot fit {n}")
        x = torch.empty(n, dtype=torch.float64)
        return int(x.numel())

    prof = collect_peak_memory([10, 200, 30, 400], work, device="cpu", warmup=2, progress=False)
    assert calls[:3] == [10, 10, 10]  # two warm-up runs, then the measured one
    assert prof.features == [10, 30]
    assert prof.peaks.tolist() == [80, 240]
    assert prof.indices.tolist() == [0, 2]
    assert prof.failed == (1, 3)
    assert "cannot fit 200" in prof.errors[0]
    assert len(prof) == 2


def test_collect_progress_bar_and_cleanup(capsys):
    pytest.importorskip("tqdm")
    cleaned = []
    prof = collect_peak_memory(
        (n for n in [1, 2]),
        lambda n: torch.empty(n).numel(),
        device="cpu",
        cleanup=lambda: cleaned.append(1),
    )
    assert prof.peaks.tolist() == [4, 8]
    assert len(cleaned) == 3  # warm-up run included


def test_collect_reraises_other_errors():
    def work(n):
        raise KeyError(n)

    with pytest.raises(KeyError):
        collect_peak_memory([1], work, device="cpu", progress=False)
    with pytest.raises(ValueError, match="warmup"):
        collect_peak_memory([1], lambda n: n, device="cpu", warmup=-1)


def test_is_oom_error_variants():
    assert is_oom_error(torch.cuda.OutOfMemoryError("x"))
    assert is_oom_error(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")
    )
    assert is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_oom_error(RuntimeError("shape mismatch"))


def test_devices_and_capacity():
    assert as_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device 'gpu0'"):
        as_device("gpu0")
    with pytest.raises(TypeError, match="device must be"):
        as_device(3)
    assert detect_capacity("cpu") > 0
    with pytest.raises(ValueError, match="pass capacity="):
        detect_capacity("meta")


def test_cuda_without_cuda_names_the_device_and_the_way_out(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    for call in (lambda: measure_peak(lambda: 1, device="cuda"), lambda: detect_capacity("cuda:0"),
                 lambda: PeakTracker("cuda")):
        with pytest.raises(RuntimeError, match=r"device 'cuda(:0)?' needs CUDA, but torch .* is built without CUDA; "
                                               r"measure on device='cpu' or device='meta'"):
            call()
    monkeypatch.setattr(torch.version, "cuda", "12.4")  # a CUDA build that sees no GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match=r"no CUDA device is visible \(CUDA_VISIBLE_DEVICES=''\)"):
        measure_peak(lambda: 1, device="cuda")


def test_a_cuda_index_past_the_visible_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"device 'cuda:3' does not exist: 2 CUDA devices visible \(cuda:0..cuda:1\)"):
        measure_peak(lambda: 1, device="cuda:3")


def test_importing_memory_does_not_import_torch():
    code = (
        "import sys, fitbatch; before = 'torch' in sys.modules; import fitbatch.memory; "
        "assert before or 'torch' not in sys.modules, 'fitbatch.memory imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_peaks_are_int64_array():
    prof = collect_peak_memory([], lambda n: n, device="cpu", progress=False)
    assert prof.peaks.dtype == np.int64 and len(prof) == 0


def test_memory_all_is_sorted_and_resolves():
    import fitbatch.memory as mem

    assert mem.__all__ == sorted(mem.__all__)
    for name in mem.__all__:
        assert getattr(mem, name) is not None
