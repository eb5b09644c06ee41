"""fitbatch under accelerate and the Hugging Face Trainer: every sample once, equal steps, exact resume.

In-process tests wrap fitbatch samplers in accelerate's real ``BatchSamplerShard`` (what
``accelerator.prepare`` does to a loader's batch sampler) and check that each rank still gets
exactly fitbatch's batches, that resumes and ``skip_first_batches`` keep them, and that what
cannot work fails at the first batch with the way out. The multi-process tests start real
runs under ``torchrun`` (2 gloo processes on CPU, a timeout on each): the issue's naive
``accelerator.prepare`` code, ``fitbatch.integrations.accelerate.prepare`` with
``save_state``/``load_state`` mid-epoch (on 2 processes and on 1), and ``FitbatchTrainer`` on a
tiny random-initialised Llama with ``resume_from_checkpoint`` mid-epoch
(``tests/integrations/*_worker.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
accelerate_data = pytest.importorskip("accelerate.data_loader", reason="the integrations extra is not installed")
from accelerate.data_loader import BatchSamplerShard, SkipBatchSampler  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import fitbatch  # noqa: E402
from fitbatch import BudgetBatchSampler  # noqa: E402
from fitbatch.integrations import accelerate as fb_accelerate  # noqa: E402
from fitbatch.sampler._budget import PlanSampler, RankLayout  # noqa: E402
from fitbatch.schedule import ScheduledBatchSampler  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKERS = ROOT / "tests" / "integrations"
TIMEOUT = 240  # seconds for one torchrun launch (imports of torch and transformers on 2 cores)


def shard(sampler, world: int, rank: int) -> BatchSamplerShard:
    """What ``accelerator.prepare`` makes of a loader's batch sampler on process ``rank`` of ``world``."""
    return BatchSamplerShard(sampler, num_processes=world, process_index=rank)


def flat(batches) -> list[int]:
    return sorted(i for b in batches for i in b)


# --------------------------------------------------------------------------- in one process


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("strategy", ["pooled", "sequential", "packed"])
def test_batch_sampler_shard_hands_each_rank_fitbatch_batches(functions, world, strategy):
    sizes = functions[:2500]
    kw = {"strategy": strategy, "cost": "sum" if strategy == "packed" else "padded", "seed": 3}
    got = []
    for rank in range(world):
        own = BudgetBatchSampler(sizes, 4096, num_replicas=world, rank=rank, **kw)
        wrapped = shard(BudgetBatchSampler(sizes, 4096, num_replicas=world, rank=rank, **kw), world, rank)
        assert len(wrapped) == len(own)
        batches = list(wrapped)
        assert batches == list(own), "the shard's pick is exactly the rank's fitbatch batches"
        got.append(batches)
    assert len({len(g) for g in got}) == 1, "equal steps"
    assert flat(b for g in got for b in g) == list(range(len(sizes))), "each sample once"


def test_a_prepared_loader_keeps_epochs_step_totals_and_skip_first_batches(functions):
    sizes = functions[:2000]
    for rank in range(2):
        sampler = BudgetBatchSampler(sizes, 4096, num_replicas=2, rank=rank, seed=1)
        loader = DataLoader(range(len(sizes)), batch_sampler=shard(sampler, 2, rank), collate_fn=list)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            assert list(loader) == sampler.plan().to_lists() and len(loader) == len(sampler.plan())
        skipped = SkipBatchSampler(shard(sampler, 2, rank), skip_batches=4)
        assert list(skipped) == sampler.plan().to_lists()[4:] and len(skipped) == len(sampler.plan()) - 4
    # the steps' totals count both ranks' batches at each step
    ranks = [BudgetBatchSampler(sizes, 4096, num_replicas=2, rank=r, seed=1) for r in range(2)]
    rows = [list(shard(s, 2, s.rank)) for s in ranks]
    samples = ranks[0].step_totals().samples
    assert [len(a) + len(b) for a, b in zip(*rows)] == samples.tolist()


def test_resume_under_the_shard_on_the_same_and_another_world(functions):
    sizes = functions[:3000]
    full = [list(BudgetBatchSampler(sizes, 4096, num_replicas=2, rank=r, seed=2)) for r in range(2)]
    state = BudgetBatchSampler(sizes, 4096, num_replicas=2, rank=0, seed=2).state_dict(step=6)
    for rank in range(2):
        resumed = BudgetBatchSampler(sizes, 4096, num_replicas=2, rank=rank, seed=2)
        resumed.load_state_dict(state)
        assert list(shard(resumed, 2, rank)) == full[rank][6:]
    rest = []
    for rank in range(3):  # the rest of the epoch on 3 processes: re-arranged, each sample once
        resumed = BudgetBatchSampler(sizes, 4096, num_replicas=3, rank=rank, seed=2)
        resumed.load_state_dict(state)
        rest.append(list(shard(resumed, 3, rank)))
    assert len({len(r) for r in rest}) == 1
    done = [b for r in range(2) for b in full[r][:6]]
    assert flat(done + [b for r in rest for b in r]) == list(range(len(sizes)))


def test_scheduled_sampler_under_the_shard():
    sizes = np.random.default_rng(0).integers(1, 50, 400)
    kw = {"micro_batch_size": 4, "num_replicas": 2, "seed": 0}
    for rank in range(2):
        own = ScheduledBatchSampler(sizes, 32, rank=rank, **kw)
        assert list(shard(ScheduledBatchSampler(sizes, 32, rank=rank, **kw), 2, rank)) == list(own)


def test_a_pass_through_shard_changes_nothing(functions):
    sampler = BudgetBatchSampler(functions[:1000], 4096, num_replicas=2, rank=1)
    assert list(shard(sampler, 1, 0)) == list(sampler)


def test_a_sampler_built_for_another_world_fails_at_the_first_batch(functions):
    sampler = BudgetBatchSampler(functions[:1000], 4096, num_replicas=1, rank=0)  # built before Accelerator()
    with pytest.raises(ValueError, match=r"built for rank 0 of 1.*num_replicas=accelerator.num_processes"):
        next(iter(shard(sampler, 2, 0)))
    with pytest.raises(ValueError, match="shards this BudgetBatchSampler over 2 processes"):
        len(shard(sampler, 2, 1))


def test_a_sampler_without_a_shared_plan_names_prepare():
    class OneRank(PlanSampler):  # e.g. the compat samplers: this rank's batches only
        num_replicas, rank = 2, 0

        def _layout(self, epoch):
            return RankLayout.alone(fitbatch.plan_batches([1] * 8, 2, cost="sum", strategy="sequential"))

    class OneRankWithState(OneRank):
        def load_state_dict(self, state):
            pass

    with pytest.raises(ValueError, match=r"fitbatch\.integrations\.accelerate\.prepare_loader\(accelerator, loader\)"):
        list(shard(OneRank(), 2, 0))  # no state: prepare() would refuse it
    with pytest.raises(ValueError, match=r"fitbatch\.integrations\.accelerate\.prepare\(accelerator, loader\)"):
        list(shard(OneRankWithState(), 2, 0))


@pytest.fixture
def accelerator_factory():
    """Single-process ``Accelerator(cpu=True, ...)``; accelerate's shared state reset afterwards."""
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.state import AcceleratorState

    def make(**config):
        AcceleratorState._reset_state(reset_partial_state=True)
        return Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))

    yield make
    AcceleratorState._reset_state(reset_partial_state=True)


def test_dispatch_batches_fails_at_the_first_batch(accelerator_factory, functions):
    acc = accelerator_factory(dispatch_batches=True)
    sampler = BudgetBatchSampler(functions[:500], 4096, num_replicas=2, rank=0)
    loader = acc.prepare(DataLoader(range(500), batch_sampler=sampler, collate_fn=torch.tensor))
    with pytest.raises(ValueError, match=r"dispatch_batches=True.*dispatch_batches=False"):
        next(iter(loader))
    with pytest.raises(ValueError, match="dispatch_batches=True"):
        fb_accelerate.prepare(acc, DataLoader(range(500), batch_sampler=sampler, collate_fn=torch.tensor))


def test_prepare_refuses_what_would_break_the_cursor(accelerator_factory, functions):
    def loader(sampler):
        return DataLoader(range(500), batch_sampler=sampler, collate_fn=list)

    acc = accelerator_factory(use_stateful_dataloader=True)
    with pytest.raises(ValueError, match="use_stateful_dataloader=True"):
        fb_accelerate.prepare(acc, loader(BudgetBatchSampler(functions[:500], 4096)))
    acc = accelerator_factory()
    with pytest.raises(TypeError, match="must be a fitbatch sampler"):
        fb_accelerate.prepare(acc, DataLoader(range(10), batch_size=2))
    with pytest.raises(ValueError, match=r"built for rank 0 of 2, but accelerate splits the loader over 1"):
        fb_accelerate.prepare(acc, loader(BudgetBatchSampler(functions[:500], 4096, num_replicas=2, rank=0)))


def test_resumable_loader_counts_what_the_loop_received(accelerator_factory, functions):
    sizes = functions[:3000]

    def build(acc):
        sampler = BudgetBatchSampler(sizes, 4096, seed=4)
        return sampler, fb_accelerate.prepare(
            acc, DataLoader(range(len(sizes)), batch_sampler=sampler, collate_fn=list, num_workers=2)
        )

    acc = accelerator_factory()
    sampler, loader = build(acc)
    epoch0 = sampler.plan().to_lists()
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    assert loader.step == 5 and sampler.state_dict()["step"] > 5, "the workers prefetched ahead"
    state = loader.state_dict()
    assert state["sampler"]["step"] == 5 and state["sampler"]["epoch"] == 0
    del it
    sampler2, loader2 = build(acc)
    loader2.load_state_dict(state)
    assert (loader2.epoch, loader2.step, len(loader2)) == (0, 5, len(epoch0) - 5)
    assert head + list(loader2) == epoch0
    assert (loader2.epoch, loader2.step) == (1, 0), "a finished epoch moves on, as accelerate's loaders do"
    assert list(loader2) == sampler2.plan(1).to_lists()


def trainer_sampler(**kw):
    """The sampler of tests/integrations/trainer_worker.py: 19 batches per rank in epoch 0, 20 in epoch 1."""
    lengths = np.random.default_rng(0).integers(8, 97, 240)
    return BudgetBatchSampler(lengths, 600, cost="padded", strategy="sequential", shuffle=True, seed=0,
                              num_replicas=2, rank=0, **kw)


class StubTrainer:
    """The Trainer methods FitbatchTrainerMixin overrides, as transformers 5.23 calls them."""

    def __init__(self, args) -> None:
        from types import SimpleNamespace

        self.args, self.state = args, SimpleNamespace(global_step=0, num_train_epochs=2)
        self.train_dataset = self.data_collator = None

    def set_initial_training_values(self, args, dataloader):
        return (1, 99, 240, 240, 8, 99, 99)

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume, trial):
        return 0, 0

    def _run_epoch(self, model, epoch, train_dataloader, steps_in_epoch, num_update_steps_per_epoch):
        return epoch, steps_in_epoch, num_update_steps_per_epoch

    def _save_checkpoint(self, model, trial) -> None:
        pass


def test_trainer_epochs_of_their_own_length_and_the_checked_resume(tmp_path):
    from types import SimpleNamespace

    from fitbatch.integrations.transformers import SAMPLER_FILE, FitbatchTrainerMixin

    class Trainer(FitbatchTrainerMixin, StubTrainer):
        pass

    def args(**kw):
        return SimpleNamespace(**{"gradient_accumulation_steps": 2, "max_steps": -1, "num_train_epochs": 2,
                                  "train_sampling_strategy": "random", "ignore_data_skip": False,
                                  "world_size": 2, "process_index": 0, "per_device_train_batch_size": 8, **kw})

    sampler = trainer_sampler()
    assert [len(sampler.plan(e)) for e in range(2)] == [19, 20]
    trainer = Trainer(args(), batch_sampler=sampler)
    assert trainer.set_initial_training_values(trainer.args, None) == (2, 10, 240, 240, 8, 19, 20)
    assert trainer.set_initial_training_values(args(num_train_epochs=1.5), None)[6] == 15
    assert trainer.set_initial_training_values(args(max_steps=12), None)[0] == 2
    assert trainer._run_epoch(None, epoch=1, train_dataloader=None, steps_in_epoch=19,
                              num_update_steps_per_epoch=10) == (1, 20, 10)
    assert sampler.epoch == 1
    for global_step, position in ((0, (0, 0)), (9, (0, 18)), (10, (1, 0)), (13, (1, 6)), (20, (2, 0))):
        trainer.state.global_step = global_step
        assert trainer._init_training_state(20, 10, 2, None, None) == position

    saved = trainer_sampler().state_dict(step=6)
    saved["epoch"] = 1
    trainer.state.global_step = 13
    (tmp_path / SAMPLER_FILE).write_text(json.dumps(saved))
    assert trainer._init_training_state(20, 10, 2, str(tmp_path), None) == (1, 6)
    other = Trainer(args(gradient_accumulation_steps=3), batch_sampler=trainer_sampler())
    other.state.global_step = 13  # 13 steps of 3 batches: epoch 1, batch 18, not where the sampler stood
    with pytest.raises(ValueError, match="sampler stood at epoch 1, batch 6"):
        other._init_training_state(20, 7, 2, str(tmp_path), None)
    bigger = Trainer(args(), batch_sampler=trainer_sampler(max_batch_size=4))
    bigger.state.global_step = 13
    with pytest.raises(ValueError, match="planning options"):
        bigger._init_training_state(20, 10, 2, str(tmp_path), None)
    (tmp_path / SAMPLER_FILE).write_text(json.dumps({**saved, "num_replicas": 3}))
    with pytest.raises(ValueError, match="saved on 3 processes"):
        trainer._init_training_state(20, 10, 2, str(tmp_path), None)
    with pytest.raises(TypeError, match="fitbatch sampler with state"):
        Trainer(args(), batch_sampler=[[0, 1]])


# --------------------------------------------------------------------------- real processes


def torchrun(script: Path, *args: str, nproc: int = 2) -> None:
    """Run ``script`` on ``nproc`` gloo processes (1: plain python), failing after TIMEOUT s."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(sys.path), "TOKENIZERS_PARALLELISM": "false"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    cmd = [*launch, str(script), *args] if nproc > 1 else [sys.executable, str(script), *args]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script.name} {args}: no exit within {TIMEOUT} s\n{str(exc.stdout)[-3000:]}")
    assert proc.returncode == 0, f"{script.name} {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def results(out: Path, name: str, world: int) -> list[dict]:
    return [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("window", [0, 512], ids=["global", "windowed"])
def test_accelerate_two_processes_naive_prepare_and_save_load_state(tmp_path, window):
    """The issue's code under torchrun; then prepare() with save_state/load_state mid-epoch (2 and 1 processes).

    ``windowed``: the same with ``window=512`` (six windows).
    """
    worker = WORKERS / "accelerate_worker.py"
    n = 3000
    torchrun(worker, "--out", str(tmp_path), "--phase", "naive", "--window", str(window))
    naive = results(tmp_path, "naive-w2", 2)
    assert {r["kind"] for r in naive} == {"BudgetBatchSampler"} and {r["window"] for r in naive} == {window or None}
    for epoch in range(2):
        for r in naive:
            assert r["sampler_world"] == [2, r["rank"]]
            assert r[f"batches{epoch}"] == r[f"plan{epoch}"], "each rank runs exactly fitbatch's batches"
            assert r[f"len{epoch}"] == len(r[f"plan{epoch}"])
        assert len({len(r[f"batches{epoch}"]) for r in naive}) == 1, "equal steps"
        assert flat(b for r in naive for b in r[f"batches{epoch}"]) == list(range(n)), "each sample once"
        per_step = [sum(len(r[f"batches{epoch}"][k]) for r in naive) for k in range(naive[0][f"len{epoch}"])]
        assert per_step == naive[0][f"step_samples{epoch}"], "step_totals() describe the steps run"
    assert naive[0]["batches0"] != naive[0]["batches1"], "set_epoch gave a new plan"
    for r in naive:
        assert r["skip5"] == r["batches1"][5:], "accelerator.skip_first_batches resumes at the step"

    stop = 7
    torchrun(worker, "--out", str(tmp_path), "--phase", "full", "--stop-step", str(stop), "--window", str(window))
    torchrun(worker, "--out", str(tmp_path), "--phase", "resume", "--window", str(window))
    full, resumed = results(tmp_path, "full-w2", 2), results(tmp_path, "resume-w2", 2)
    for f in full:
        assert "over the budget" in f["mismatch"] and "sizes are not the lengths" in f["mismatch"], f["mismatch"]
    for f, r in zip(full, resumed):
        assert f["end"] == [2, 0] and r["resumed_at"] == [1, stop]
        assert r["log"] == [x for x in f["log"] if (x[0], x[1]) >= (1, stop)], "resume continues at the batch"
        np.testing.assert_allclose(r["params"], f["params"], rtol=0, atol=1e-12)
    for epoch in range(2):
        assert flat(x[2] for f in full for x in f["log"] if x[0] == epoch) == list(range(n))

    torchrun(worker, "--out", str(tmp_path), "--phase", "resume", "--window", str(window), nproc=1)  # the same checkpoint, 1 process
    alone = results(tmp_path, "resume-w1", 1)[0]
    assert alone["resumed_at"] == [1, 0], "the rest of the epoch, re-arranged for 1 process"
    before = [x[2] for f in full for x in f["log"] if x[0] == 1 and x[1] < stop]
    after = [x[2] for x in alone["log"] if x[0] == 1]
    assert flat(before + after) == list(range(n)), "each sample of the resumed epoch exactly once"


def test_accelerate_resume_inside_a_gradient_accumulation_on_1_2_and_3_processes(tmp_path):
    """Issue 37: save_state at loader step 5 with gradient_accumulation_steps=2 (inside an
    accumulation) on 2 processes; load_state on 3 deadlocked (accelerate restores its step
    counter from a file per rank, which the third rank lacks, so the ranks synchronised
    gradients on different steps). The checkpoint resumes at the accumulation's first batch
    (4), accelerate's counter is set from the loader's cursor on every rank: on 2 processes the
    run ends with the very parameters of the uninterrupted one; on 1 and 3 every sample of the
    epoch runs once and every rank synchronises on the same steps, within the timeout."""
    worker = WORKERS / "accelerate_worker.py"
    n, stop, accum = 3000, 5, 2
    common = ["--out", str(tmp_path), "--accum", str(accum)]
    torchrun(worker, *common, "--phase", "full", "--stop-step", str(stop))
    full = results(tmp_path, "full-w2", 2)
    boundary = stop - stop % accum  # the first batch of the accumulation the checkpoint is inside
    for f in full:
        syncs = [x[4] for x in f["log"] if x[0] == 1]
        assert syncs[:6] == [False, True, False, True, False, True], "accumulation over 2 batches"
    torchrun(worker, *common, "--phase", "resume")
    same = results(tmp_path, "resume-w2", 2)
    for f, r in zip(full, same):
        assert r["resumed_at"] == [1, boundary] and r["acc_step"] == boundary
        assert r["log"] == [x for x in f["log"] if (x[0], x[1]) >= (1, boundary)], "the same batches, synced alike"
        np.testing.assert_allclose(r["params"], f["params"], rtol=0, atol=1e-12)
    before = [x[2] for f in full for x in f["log"] if x[0] == 1 and x[1] < boundary]
    for world in (1, 3):
        torchrun(worker, *common, "--phase", "resume", nproc=world)
        runs = results(tmp_path, f"resume-w{world}", world)
        assert {r["acc_step"] for r in runs} == {0} and all(r["resumed_at"] == [1, 0] for r in runs)
        steps = [[(x[0], x[1], x[3], x[4]) for x in r["log"]] for r in runs]
        assert all(s == steps[0] for s in steps), "every rank counts and synchronises on the same steps"
        after = [x[2] for r in runs for x in r["log"] if x[0] == 1]
        assert flat(before + after) == list(range(n)), f"each sample of the resumed epoch once ({world} processes)"
        assert all(r["end"] == [2, 0] for r in runs)


def test_accelerate_two_processes_compat_sampler_over_a_distributed_sampler(tmp_path):
    """A compat sampler (no state, no world) under torchrun: what the plain prepare error names
    (``prepare_loader``) runs each process's own batches, every sample once per epoch."""
    torchrun(WORKERS / "accelerate_worker.py", "--out", str(tmp_path), "--phase", "compat")
    runs = results(tmp_path, "compat-w2", 2)
    for r in runs:
        assert "prepare_loader(accelerator, loader)" in r["plain_error"], r["plain_error"]
    for epoch in range(2):
        for r in runs:
            assert r[f"batches{epoch}"] == r[f"own{epoch}"], "each process runs exactly its sampler's batches"
            assert r[f"len{epoch}"] == len(r[f"batches{epoch}"])
        assert flat(b for r in runs for b in r[f"batches{epoch}"]) == list(range(3000)), "each sample once"
    assert runs[0]["batches0"] != runs[0]["batches1"], "the DistributedSampler's epoch reached the batches"


def trainer_steps(runs: list[dict]) -> dict[int, list[tuple[int, list[int], int]]]:
    """Micro-batches by optimizer step: (epoch, sample ids, num_items_in_batch) from every rank."""
    steps: dict[int, list] = defaultdict(list)
    for run in runs:
        for global_step, epoch, ids, items in run["log"]:
            steps[global_step].append((epoch, ids, items))
    return steps


def test_hf_trainer_two_processes_each_sample_once_and_resume_mid_epoch(tmp_path):
    worker = WORKERS / "trainer_worker.py"
    torchrun(worker, "--out", str(tmp_path), "--phase", "full", "--save-steps", "13")
    full = results(tmp_path, "full", 2)
    lengths = full[0]["lengths"]
    for f in full:
        assert "240 train_dataset rows are longer than their sizes" in f["mismatch"], f["mismatch"]
    counts = [[sum(1 for x in f["log"] if x[1] == e) for e in range(2)] for f in full]
    assert counts[0] == counts[1] == [19, 20], "each epoch runs its own batch count, equal on both ranks"
    for epoch in range(2):
        assert flat(x[2] for f in full for x in f["log"] if x[1] == epoch) == list(range(len(lengths)))
    # num_items_in_batch: the loss tokens of the whole optimizer step, over both ranks, as planned
    g = 2
    for global_step, parts in trainer_steps(full).items():
        tokens = sum(lengths[i] - 1 for _, ids, _ in parts for i in ids)
        assert {items for _, _, items in parts} == {tokens}
        epoch = parts[0][0]
        first = global_step - (0 if epoch == 0 else 10)  # epoch 0 has 10 optimizer steps
        samples, units, _ = map(np.array, full[0]["totals"][str(epoch)])
        assert tokens == int((units - samples)[first * g : (first + 1) * g].sum())
    assert full[0]["global_step"] == 20

    torchrun(worker, "--out", str(tmp_path), "--phase", "resume", "--resume-step", "13")
    resumed = results(tmp_path, "resume", 2)
    for f, r in zip(full, resumed):
        assert r["log"] == [x for x in f["log"] if x[0] >= 13], "resume_from_checkpoint continues at the batch"
        np.testing.assert_allclose(r["params"], f["params"], rtol=0, atol=1e-6)
    saved = json.loads((tmp_path / "run" / "checkpoint-13" / "fitbatch_sampler.json").read_text())
    assert (saved["epoch"], saved["step"], saved["num_replicas"]) == (1, 6, 2)


@pytest.mark.parametrize("window", [0, 64], ids=["global", "windowed"])
def test_hf_trainer_packed_batches(tmp_path, window):
    """Packed batches through FitbatchTrainer; ``windowed``: planned in windows of 64 samples."""
    torchrun(WORKERS / "trainer_worker.py", "--out", str(tmp_path), "--phase", "packed", "--window", str(window))
    packed = results(tmp_path, "packed", 2)
    lengths = packed[0]["lengths"]
    for p in packed:
        assert "a padded collator under a sum plan" in p["mismatch"], p["mismatch"]
    assert len(packed[0]["log"]) == len(packed[1]["log"])
    assert flat(x[2] for p in packed for x in p["log"]) == list(range(len(lengths)))
    for parts in trainer_steps(packed).values():
        assert {items for _, _, items in parts} == {sum(lengths[i] - 1 for _, ids, _ in parts for i in ids)}


def test_lightning_resumes_mid_epoch_with_a_stateful_dataloader(tmp_path, one_torch_thread):
    """Lightning checkpoints a torchdata StatefulDataLoader (2 workers); the fitbatch sampler is its state."""
    L = pytest.importorskip("lightning", reason="the integrations extra is not installed")
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="the integrations extra is not installed")
    sizes = np.random.default_rng(0).integers(1, 100, 500)
    log: list = []

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            log.append([self.current_epoch, batch.tolist()])
            return self.lin(batch.float()[:, None]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    def fit(ckpt_path=None) -> list:
        log.clear()
        sampler = BudgetBatchSampler(sizes, 1000, seed=0)
        loader = stateful.StatefulDataLoader(range(500), batch_sampler=sampler, collate_fn=torch.tensor, num_workers=2)
        every = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=7, save_top_k=-1, filename="{step}")
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, use_distributed_sampler=False, logger=False,
                            callbacks=[every], enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Module(), loader, ckpt_path=ckpt_path)
        return list(log)

    full = fit()
    per_epoch = [sum(1 for epoch, _ in full if epoch == e) for e in range(2)]
    assert per_epoch[0] > 21, "step 21 is inside epoch 0"
    for e in range(2):
        assert flat(b for epoch, b in full if epoch == e) == list(range(500))
        # Lightning set each epoch through batch_sampler.sampler (it ran epoch 0 twice)
        assert [b for epoch, b in full if epoch == e] == BudgetBatchSampler(sizes, 1000, seed=0).plan(e).to_lists()
    assert fit(str(tmp_path / "step=21.ckpt")) == full[21:], "the resumed run continues at the batch"


def test_trainer_refuses_a_sampler_over_other_rows_at_construction(tmp_path):
    """150 rows over 120 sizes trained 120 and logged 150; 90 rows failed in loading (IndexError); rows
    longer than their sizes overran the budget. Each is refused when the trainer is built, naming the fix."""
    from transformers import TrainingArguments

    from fitbatch.integrations.transformers import FitbatchTrainer

    sampler = BudgetBatchSampler(np.full(120, 10), 100, num_replicas=1, rank=0)
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to="none", remove_unused_columns=False, save_strategy="no")

    def build(data, batch_sampler=sampler, **kw):
        return FitbatchTrainer(model=torch.nn.Linear(1, 1), args=kw.pop("args", args), train_dataset=data,
                               batch_sampler=batch_sampler, **kw)

    for rows in (150, 90):
        data = [{"input_ids": [1] * 10} for _ in range(rows)]
        with pytest.raises(ValueError, match=rf"train_dataset has {rows} rows but the batch sampler was built over 120 sizes.*BudgetSampling"):
            build(data)
    longer = [{"input_ids": [1] * (11 if i in (3, 7) else 10)} for i in range(120)]  # an EOS appended, say
    with pytest.raises(ValueError, match=r"2 train_dataset rows are longer than their sizes.*row 3 \(11 tokens, size 10\), row 7"):
        build(longer)

    class Collator:  # pads to a multiple of 8: a row of 10 tokens costs 16
        pad_to_multiple_of = 8

        def __call__(self, rows):
            return rows

    with pytest.raises(ValueError, match=r"120 train_dataset rows.*pad_to_multiple_of=8\): row 0 \(16 tokens, size 10\)"):
        build([{"input_ids": [1] * 10}] * 120, data_collator=Collator())
    build([{"input_ids": [1] * 10}] * 120)  # the rows of the sizes: accepted
    with pytest.raises(ValueError, match=r"rank 0 of 2.*args.process_index=0 of args.world_size=1.*num_replicas=args.world_size"):
        build([{"input_ids": [1] * 10}] * 120, BudgetBatchSampler(np.full(120, 10), 100, num_replicas=2, rank=0))
    skip = TrainingArguments(str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", ignore_data_skip=True)
    with pytest.raises(ValueError, match="ignore_data_skip=True would rerun"):
        build([{"input_ids": [1] * 10}] * 120, args=skip)


def test_trainer_builds_the_sampler_from_the_rows_it_trains(tmp_path):
    """BudgetSampling: the sampler is built after the trainer's __init__, from its train_dataset, with the
    collator's pad multiple and the Trainer's loss-token count; the collated batches are checked."""
    datasets = pytest.importorskip("datasets")
    from transformers import TrainingArguments

    from fitbatch.integrations.transformers import BudgetSampling, FitbatchTrainer

    lengths = np.random.default_rng(1).integers(3, 40, 60)
    rows = {"input_ids": [[1] * int(n) for n in lengths], "labels": [[-100] * 2 + [1] * (int(n) - 2) for n in lengths]}
    data = datasets.Dataset.from_dict(rows).shuffle(seed=3)  # an indices mapping: the order read is the shuffled one
    order = np.array([len(r["input_ids"]) for r in data])
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", seed=5,
                             remove_unused_columns=False)

    class Collator:
        pad_to_multiple_of = 8

        def __call__(self, features):
            width = -(-max(len(f["input_ids"]) for f in features) // 8) * 8
            return {"input_ids": torch.zeros(len(features), width, dtype=torch.long)}

    trainer = FitbatchTrainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=data, data_collator=Collator(),
                              batch_sampler=BudgetSampling(200, strategy="sorted", max_batch_size=9))
    sampler = trainer.batch_sampler
    assert (sampler.num_replicas, sampler.rank, sampler.options.seed, sampler.options.max_batch_size) == (1, 0, 5, 9)
    np.testing.assert_array_equal(sampler._sizes.values, -(-order // 8) * 8)
    np.testing.assert_array_equal(sampler._loss, order - 2)  # labels[1:] != -100, as the Trainer counts
    loader = trainer.get_train_dataloader()
    assert sum(1 for _ in loader) == len(sampler.plan())
    with pytest.raises(TypeError, match="returned list, not a fitbatch sampler"):
        FitbatchTrainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=data, batch_sampler=lambda trainer: [[0]])


def test_the_collated_batches_are_checked_in_the_trainer_and_under_accelerate(tmp_path, accelerator_factory):
    """A sampler whose sizes are one short per row (EOS appended after measuring): the first collated batch
    over the budget raises, in FitbatchTrainer's loader and in fb_accelerate.prepare's; check_budget=False opts out."""
    from transformers import TrainingArguments

    from fitbatch.integrations.transformers import FitbatchTrainer

    rows = [{"input_ids": [1] * 10} for _ in range(40)]
    short = BudgetBatchSampler(np.full(40, 10), 100, strategy="sequential", num_replicas=1, rank=0)

    def pad(features):
        return {"input_ids": torch.ones(len(features), len(features[0]["input_ids"]) + 1, dtype=torch.long)}

    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to="none", remove_unused_columns=False, save_strategy="no")
    trainer = FitbatchTrainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=rows, data_collator=pad, batch_sampler=short)
    with pytest.raises(ValueError, match=r"collated batch 1 costs 110 \(10 rows x 11 tokens, cost 'padded'\), over the budget 100"):
        next(iter(trainer.get_train_dataloader()))
    trainer.check_budget = False
    assert next(iter(trainer.get_train_dataloader()))["input_ids"].shape == (10, 11)
    acc = accelerator_factory()
    loader = fb_accelerate.prepare(acc, DataLoader(rows, batch_sampler=short, collate_fn=pad))
    with pytest.raises(ValueError, match="sizes are not the lengths of these rows"):
        next(iter(loader))
    assert loader.collate_fn.collate_fn is pad
    unchecked = fb_accelerate.prepare(acc, DataLoader(rows, batch_sampler=short, collate_fn=pad), check_budget=False, register=False)
    assert len(list(unchecked)) == 4
