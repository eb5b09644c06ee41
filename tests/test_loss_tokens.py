"""Loss tokens: ``loss_sizes=``, ``step_totals()``'s ``loss_units`` and ``normalize="loss_tokens"``.

The loss of a step is divided by its tokens that carry loss (labels != -100) over all ranks and
micro-batches; fitbatch knows them from the shared plan. These tests check the totals against
the batches each rank runs (through budget changes, resumes and world-size changes) and the
accumulated gradient against the gradient of the step's mean loss over its loss tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from contracts import load_script, run_processes
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fitbatch
from fitbatch import BudgetBatchSampler
from fitbatch.epoch._arrange import TooFewSamples
from fitbatch.sampler import StepTotals
from fitbatch.schedule import BatchSizeSchedule, GradientAccumulator, ScheduledBatchSampler

DATA = Path(__file__).parent / "data"
WORKER = Path(__file__).parent / "schedule_scripts" / "loss_tokens_worker.py"
W = load_script(WORKER, "loss_tokens_worker")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def real_sizes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` token counts of CPython stdlib files (capped) and loss tokens <= each of them."""
    rng = np.random.default_rng(seed)
    tokens = np.load(DATA / "cpython_stdlib_pytokens.npy")
    sizes = np.minimum(rng.choice(tokens, n), 4000).astype(np.int64)
    return sizes, rng.integers(0, sizes + 1)


def ranks(sizes, budget, world, loss, **kw):
    return [
        BudgetBatchSampler(sizes, budget, num_replicas=world, rank=r, loss_sizes=loss, **kw)
        for r in range(world)
    ]


def check_totals(samplers, loss):
    """Each step's loss units are the sum over ranks of the loss units of the batch it runs there."""
    totals = samplers[0].step_totals()
    assert isinstance(totals, StepTotals)
    plans = [s.plan() for s in samplers]
    first = len(totals.loss_units) - len(plans[0])
    for s, plan in zip(samplers, plans):
        # the same on every rank
        assert s.step_totals().loss_units.tolist() == totals.loss_units.tolist()
        assert plan.loss_units.tolist() == [float(loss[b].sum()) for b in plan]
    per_step = np.sum([p.loss_units for p in plans], axis=0) if len(plans[0]) else np.zeros(0)
    np.testing.assert_allclose(totals.loss_units[first:], per_step, rtol=0, atol=1e-9)
    return totals


def ran_loss(samplers, loss):
    """The loss sizes of the samples in the batches the ranks run (from their plans' first step)."""
    run = np.concatenate([np.zeros(0, np.int64), *(b for s in samplers for b in s.plan())])
    assert np.unique(run).size == run.size  # each sample at most once
    return float(loss[run].sum())


# ---------------------------------------------------------------- plans


def test_plan_batches_carries_loss_units_per_batch_and_in_stats():
    sizes, loss = real_sizes(300, 0)
    plan = fitbatch.plan_batches(sizes, 16384, strategy="pooled", seed=1, loss_sizes=loss)
    plain = fitbatch.plan_batches(sizes, 16384, strategy="pooled", seed=1)
    assert plan.to_lists() == plain.to_lists()  # loss sizes do not change the batches
    assert plan.loss_units.tolist() == [float(loss[b].sum()) for b in plan]
    assert plan.stats().loss_units == float(loss.sum())
    # without loss sizes, loss units are the real units
    assert plain.loss_units.tolist() == plain.real_units.tolist()
    assert plain.stats().loss_units == float(sizes.sum())
    # a share of the batches (one rank's) carries the same loss sizes
    part = plan.select(np.array([3, 0, 5]))
    assert part.loss_units.tolist() == [float(loss[plan[i]].sum()) for i in (3, 0, 5)]


def test_left_out_samples_carry_no_loss_units():
    sizes = [5, 30, 4, 3, 6, 2]
    plan = fitbatch.plan_batches(
        sizes,
        10,
        cost="sum",
        strategy="sequential",
        oversized="skip",
        loss_sizes=[1, 9, 2, 3, 4, 2],  # none above its size (refused since issue 37)
    )
    assert plan.to_lists() == [[0, 2], [3, 4], [5]] and plan.skipped.tolist() == [1]
    assert plan.loss_units.tolist() == [3.0, 7.0, 2.0] and plan.stats().loss_units == 12.0


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ([1, 2], ValueError, r"one entry per sample: 3 .* got shape \(2,\)"),
        ([1, -2, 3], ValueError, r"1 bad row: index 1 \(size -2.0\)"),
        ([1, 2, float("nan")], ValueError, r"index 2 \(size nan\)"),
        (
            [1, float("inf"), -1],
            ValueError,
            r"2 bad rows: index 1 \(size inf\), index 2 \(size -1.0\)",
        ),
        ([True, False, True], TypeError, "dtype bool"),
        ("123", TypeError, "one number per sample"),
        ([[1], [2], [3]], ValueError, r"got shape \(3, 1\)"),
    ],
)
def test_loss_sizes_are_checked_everywhere(bad, error, match):
    for build in (
        lambda: fitbatch.plan_batches([3, 1, 2], 4, loss_sizes=bad),
        lambda: BudgetBatchSampler([3, 1, 2], 4, num_replicas=1, rank=0, loss_sizes=bad),
        lambda: ScheduledBatchSampler([3, 1, 2], 3, micro_batch_size=1, loss_sizes=bad),
    ):
        with pytest.raises(error, match=match):
            build()


# ---------------------------------------------------------------- BudgetBatchSampler


def test_step_totals_is_a_named_tuple_and_loss_units_default_to_units():
    sampler = BudgetBatchSampler([3, 1, 4, 1, 5], 6, strategy="sorted", num_replicas=1, rank=0)
    samples, units, loss_units = sampler.step_totals()
    assert samples.tolist() == [1, 2, 1, 1] and units.tolist() == [1.0, 4.0, 4.0, 5.0]
    assert loss_units.tolist() == units.tolist()
    with_loss = BudgetBatchSampler(
        [3, 1, 4, 1, 5], 6, strategy="sorted", num_replicas=1, rank=0, loss_sizes=[2, 0, 4, 1, 3]
    )
    assert with_loss.step_totals()._fields == ("samples", "units", "loss_units")
    assert with_loss.step_totals().loss_units.tolist() == [1.0, 2.0, 4.0, 3.0]
    assert list(with_loss) == list(sampler)


@SETTINGS
@given(
    n=st.integers(30, 150),
    seed=st.integers(0, 2**16),
    world=st.integers(1, 4),
    new_world=st.integers(1, 4),
    strategy=st.sampled_from(["pooled", "sorted", "packed", "sequential"]),
    change_at=st.floats(0, 1),
    stop_at=st.floats(0, 1),
    new_budget=st.sampled_from([None, 5000, 12000]),
    policy=st.sampled_from(["split", "drop"]),
)
def test_loss_totals_survive_budget_change_resume_and_world_change(
    n, seed, world, new_world, strategy, change_at, stop_at, new_budget, policy
):
    sizes, loss = real_sizes(n, seed)
    kw = {
        "strategy": strategy,
        "seed": seed,
        "cost": "sum",
        "oversized": "single",
        "policy": policy,
    }
    samplers = ranks(sizes, 9000, world, loss, **kw)
    totals = check_totals(samplers, loss)
    # the loss units of every sample that runs, once ("split" runs them all)
    assert totals.loss_units.sum() == pytest.approx(ran_loss(samplers, loss))
    if policy == "split":
        assert totals.loss_units.sum() == pytest.approx(float(loss.sum()))
    # a budget change part-way through the epoch (all ranks alike)
    iters = [iter(s) for s in samplers]
    change = int(change_at * len(samplers[0]))
    for it in iters:
        for _ in range(change):
            next(it)
    if new_budget is not None:
        for s in samplers:
            s.set_budget(new_budget)
    changed = check_totals(samplers, loss)
    # the steps already run keep theirs
    assert changed.loss_units[:change].tolist() == totals.loss_units[:change].tolist()
    assert changed.loss_units.sum() == pytest.approx(ran_loss(samplers, loss))
    # a resume at a later step, on another world size
    stop = change + int(stop_at * (len(changed.loss_units) - change))
    state = json.loads(json.dumps(samplers[0].state_dict(step=stop)))
    began = state["options"]["budget"]  # a change before the first step begins the epoch
    resumed = ranks(sizes, began, new_world, loss, **kw)
    try:
        for s in resumed:
            s.load_state_dict(state)
    except TooFewSamples:
        # the steps left cannot give every new rank a batch: refused, as it must be
        assume(False)
    after = check_totals(resumed, loss)
    assert after.loss_units[:stop].tolist() == changed.loss_units[:stop].tolist()
    # the samples the new ranks run carry exactly the loss units of the steps they run
    first = len(after.loss_units) - len(resumed[0].plan())
    assert float(after.loss_units[first:].sum()) == pytest.approx(ran_loss(resumed, loss))
    if policy == "split":
        assert after.loss_units.sum() == pytest.approx(float(loss.sum()))


@SETTINGS
@given(
    seed=st.integers(0, 2**16), world=st.integers(2, 3), policy=st.sampled_from(["split", "drop"])
)
def test_loss_totals_with_per_rank_budgets_and_equal_step_policies(seed, world, policy):
    sizes, loss = real_sizes(90, seed)
    budgets = [8000 * (r + 1) for r in range(world)]
    samplers = ranks(
        sizes, budgets, world, loss, seed=seed, cost="sum", oversized="single", policy=policy
    )
    totals = check_totals(samplers, loss)
    ran = np.concatenate([b for s in samplers for b in s.plan()])
    assert totals.loss_units.sum() == pytest.approx(float(loss[ran].sum()))
    for s in samplers:
        it = iter(s)
        next(it)
        s.set_budget(6000)
    changed = check_totals(samplers, loss)
    assert changed.loss_units[:1].tolist() == totals.loss_units[:1].tolist()
    plain = ranks(
        sizes, 9000, world, None, seed=seed, cost="sum", oversized="single", policy=policy
    )
    assert plain[0].step_totals().loss_units.tolist() == plain[0].step_totals().units.tolist()


def test_other_epochs_carry_loss_units_too():
    sizes, loss = real_sizes(80, 3)
    samplers = ranks(sizes, 12000, 2, loss, cost="sum")
    for epoch in (1, 2):
        plans = [s.plan(epoch) for s in samplers]
        totals = samplers[0].step_totals(epoch)
        np.testing.assert_allclose(totals.loss_units, plans[0].loss_units + plans[1].loss_units)
        assert totals.loss_units.sum() == pytest.approx(float(loss.sum()))


def test_a_state_saved_with_other_loss_sizes_is_refused():
    sizes, loss = real_sizes(50, 1)
    sampler = BudgetBatchSampler(sizes, 12000, num_replicas=1, rank=0, loss_sizes=loss)
    state = sampler.state_dict(step=2)
    other = loss.copy()
    other[7] += 1
    for loss_sizes in (other, None):
        with pytest.raises(
            ValueError, match="saved over other sizes or loss_sizes .*same loss_sizes"
        ):
            BudgetBatchSampler(
                sizes, 12000, num_replicas=1, rank=0, loss_sizes=loss_sizes
            ).load_state_dict(state)
    again = BudgetBatchSampler(sizes, 12000, num_replicas=1, rank=0, loss_sizes=loss)
    again.load_state_dict(state)
    assert list(again) == list(sampler)[2:]
    # without loss sizes the digest is that of the sizes alone (states saved before them still load)
    plain = BudgetBatchSampler(sizes, 12000, num_replicas=1, rank=0).state_dict()
    assert plain["sizes_digest"] == fitbatch._state.sizes_digest(np.asarray(sizes))
    schedule = ScheduledBatchSampler(sizes, 8, micro_batch_size=2, loss_sizes=loss).state_dict(
        micro=2
    )
    with pytest.raises(ValueError, match="loss_sizes"):
        ScheduledBatchSampler(sizes, 8, micro_batch_size=2, loss_sizes=other).load_state_dict(
            schedule
        )


# ---------------------------------------------------------------- ScheduledBatchSampler


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    world=st.integers(1, 3),
    micro=st.sampled_from([2, 3, "9000"]),
    stop_at=st.floats(0, 1),
    drop_last=st.booleans(),
)
def test_micro_batch_infos_carry_the_steps_loss_units_over_all_ranks(
    seed, world, micro, stop_at, drop_last
):
    sizes, loss = real_sizes(70, seed)
    kw = {"rounding": "uneven"} if isinstance(micro, int) else {}
    kw["drop_last"] = drop_last
    schedule = BatchSizeSchedule.from_list(
        [12, 7, 20] if isinstance(micro, int) else [20000, 30000], on_exhausted="cycle"
    )
    samplers = [
        ScheduledBatchSampler(
            sizes,
            schedule,
            micro_batch_size=micro,
            num_replicas=world,
            rank=r,
            seed=seed,
            loss_sizes=loss,
            **kw,
        )
        for r in range(world)
    ]
    per_rank = [list(s.with_info()) for s in samplers]
    step_loss: dict[int, float] = {}
    for pairs in per_rank:
        for batch, info in pairs:
            assert info.loss_units == float(loss[batch].sum())
            step_loss[info.step] = step_loss.get(info.step, 0.0) + info.loss_units
    totals = samplers[0].step_totals()
    for pairs in per_rank:
        for _, info in pairs:
            assert info.step_loss_units == pytest.approx(step_loss[info.step])
            assert info.step_loss_units == totals.loss_units[info.step]
    used = np.concatenate([b for pairs in per_rank for b, _ in pairs])
    assert totals.loss_units.sum() == pytest.approx(float(loss[used].sum()))
    # resumed mid-epoch: the same infos from the cursor on
    micro_done = int(stop_at * len(per_rank[0]))
    state = samplers[0].state_dict(micro=micro_done)
    again = ScheduledBatchSampler(
        sizes,
        schedule,
        micro_batch_size=micro,
        num_replicas=world,
        rank=0,
        seed=seed,
        loss_sizes=loss,
        **kw,
    )
    again.load_state_dict(state)
    assert again.infos() == [info for _, info in per_rank[0][micro_done:]]


def test_without_loss_sizes_infos_loss_units_are_units():
    sampler = ScheduledBatchSampler([3, 5, 2, 6], 4, micro_batch_size=2, shuffle=False)
    assert [(i.loss_units, i.step_loss_units) for i in sampler.infos()] == [
        (8.0, 16.0),
        (8.0, 16.0),
    ]


# ---------------------------------------------------------------- GradientAccumulator


def reference_grads(samples: list[int]) -> list[torch.Tensor]:
    """The gradient of the mean loss over all loss tokens of ``samples``, in one go."""
    model = W.make_model()
    tokens = sum(W.loss_sizes()[i] for i in samples)
    (W.loss_sum(model, samples) / tokens).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_accumulated_gradient_is_the_mean_over_the_steps_loss_tokens():
    model = W.make_model()
    acc = GradientAccumulator(
        model, torch.optim.SGD(model.parameters(), lr=0.0), lr_rule="none", normalize="loss_tokens"
    )
    sampler = ScheduledBatchSampler(
        W.sizes(),
        W.schedule(),
        micro_batch_size=W.MICRO,
        seed=5,
        rounding="uneven",
        loss_sizes=W.loss_sizes(),
    )
    mine: list[int] = []
    checked = 0
    for batch, info in sampler.with_info():
        mine += batch
        assert info.step_loss_units != info.step_units
        if acc.backward(W.loss_sum(model, batch), info):
            units = [
                float(sum(W.loss_sizes()[i] for i in b))
                for b, i in sampler.with_info()
                if i.step == info.step
            ]
            assert len(set(units)) > 1 or info.n_micro == 1  # uneven loss tokens per micro-batch
            assert info.step_loss_units == sum(units)
            for got, want in zip(
                [p.grad for p in model.parameters()], reference_grads(mine), strict=True
            ):
                torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
            mine, checked = [], checked + 1
    assert checked == len(sampler.step_totals().loss_units) >= 3


def test_loss_tokens_normalisation_refuses_an_info_without_them():
    from fitbatch.schedule import MicroBatchInfo

    net = torch.nn.Linear(1, 1)
    acc = GradientAccumulator(
        net, torch.optim.SGD(net.parameters(), lr=0.1), lr_rule="none", normalize="loss_tokens"
    )
    info = MicroBatchInfo(
        epoch=0,
        step=0,
        micro=0,
        n_micro=1,
        samples=2,
        units=5.0,
        step_samples=2,
        step_units=5.0,
        scheduled=2,
        world=1,
    )
    with pytest.raises(ValueError, match="normalize='loss_tokens' needs the step's loss units"):
        acc.backward(net(torch.ones(1, 1)).sum(), info)
    none = ScheduledBatchSampler([3, 4], 2, micro_batch_size=1, loss_sizes=[0, 0]).infos()[0]
    with pytest.raises(ValueError, match="no loss tokens to normalise by"):
        acc.backward(net(torch.ones(1, 1)).sum(), none)
    with pytest.raises(ValueError, match="'loss_tokens'"):
        GradientAccumulator(
            net, torch.optim.SGD(net.parameters(), lr=0.1), lr_rule="none", normalize="loss"
        )


def test_two_gloo_ranks_accumulate_the_mean_over_all_loss_tokens_of_each_step(tmp_path):
    world = 2
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    run_processes(
        [
            [sys.executable, str(WORKER), str(r), str(world), str(tmp_path / "init"), str(outs[r])]
            for r in range(world)
        ],
        timeout=150,
    )
    results = [torch.load(o) for o in outs]
    for mode in ("ddp", "plain"):
        logs = [r[mode] for r in results]
        assert len({len(lg) for lg in logs}) == 1 and len(logs[0]) >= 3
        for k, rec in enumerate(logs[0]):
            samples = rec["samples"] + logs[1][k]["samples"]
            assert (
                rec["loss_units"]
                == logs[1][k]["loss_units"]
                == sum(W.loss_sizes()[i] for i in samples)
            )
            want = reference_grads(samples)
            for lg in logs:
                for got, ref in zip(lg[k]["grads"], want, strict=True):
                    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
        # the ranks' loss tokens differ at some step: a per-rank mean would be wrong there
        per_rank = [[sum(W.loss_sizes()[i] for i in rec["samples"]) for rec in lg] for lg in logs]
        assert per_rank[0] != per_rank[1]


def test_the_training_docs_loss_tokens_example_runs(capsys):
    text = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    block = text.split("<!-- loss-tokens-example -->\n```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "docs/training.md", "exec"), {})
    totals, steps = capsys.readouterr().out.strip().rsplit(" ", 1)
    lengths = [7, 3, 9, 4, 6, 8, 5, 2]
    loss = [n - n // 2 for n in lengths]
    sampler = ScheduledBatchSampler(lengths, 4, micro_batch_size=2, loss_sizes=loss, seed=0)
    expect = [
        float(sum(loss[i] for b, info in sampler.with_info() if info.step == k for i in b))
        for k in range(2)
    ]
    assert totals == str(expect) and steps == "2" and sum(expect) == sum(loss)
