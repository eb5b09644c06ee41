"""fitbatch batches under Hugging Face ``accelerate``, with an exact cursor for ``save_state``.

``accelerator.prepare(DataLoader(ds, batch_sampler=sampler, collate_fn=...))`` already gives
every rank exactly the fitbatch sampler's batches (see :mod:`fitbatch.sampler._sharding`),
and ``accelerator.skip_first_batches(loader, k)`` resumes it ``k`` steps into an epoch. What
accelerate cannot know is *where* a budget-batched epoch stands: ``save_state`` saves no
position for a plain loader, and a sampler registered on its own would save the batches its
loader had *fetched* (one ahead, more with workers), not those the loop trained on.
:func:`prepare` closes that gap:

>>> from fitbatch.integrations import accelerate as fb_accelerate
>>> loader = fb_accelerate.prepare(accelerator, DataLoader(ds, batch_sampler=sampler, collate_fn=fitbatch.pad_collate))  # doctest: +SKIP
>>> for epoch in range(loader.epoch, epochs):  # doctest: +SKIP
...     loader.set_epoch(epoch)                # reaches the sampler (accelerate's does not)
...     for batch in loader:
...         ...                                # train; loader.step = steps done this epoch
...         accelerator.save_state(ckpt)       # the cursor is saved with the rest
>>> accelerator.load_state(ckpt)  # doctest: +SKIP

After ``load_state`` the loader continues at the saved step of the saved epoch, re-planning in
O(1) (no batch is replayed), and on another number of processes the rest of the epoch is
re-arranged for the new world (each sample still exactly once). With gradient accumulation, a
checkpoint taken inside an accumulation resumes at that accumulation's first batch, and
accelerate's step counter is set from the loader's cursor on every rank (see
:class:`ResumableLoader`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fitbatch._state import StateSchema
from fitbatch.collate import check_budget as checked_collate
from fitbatch.collate._budget import measurable
from fitbatch.sampler._protocol import PlanSampler

SAMPLER_KEY = "sampler"


def state_at(sampler: Any, done: int) -> dict[str, Any]:
    """The sampler's state after ``done`` rows of its epoch (its cursor keyword: ``step=``, ``micro=``)."""
    return sampler.state_dict(**{sampler.CURSOR_KEY: done})  # type: ignore[no-any-return]


def prepare_loader(accelerator: Any, loader: Any, *, check_budget: bool = True) -> Any:
    """``accelerator.prepare(loader)`` for a loader whose ``batch_sampler`` is a fitbatch sampler.

    The batch sampler already yields this rank's batches, so accelerate's ``BatchSamplerShard``
    is made a pass-through (one process), as ``transformers`` does for its own rank-aware
    sampler; this works for every fitbatch sampler, the compat ones included. Devices, RNG
    synchronisation, gradient-accumulation state and ``skip_first_batches`` stay accelerate's.

    A sampler built for a world (``num_replicas``, ``rank``) must be built for accelerate's. A
    compat sampler knows no world: on every process it batches what it is given, so give each
    process its share, as without accelerate (bionemo's ``SizeAwareBatchSampler`` over a
    ``DistributedSampler``, for example); without one, every process runs every sample.

    With ``check_budget`` (the default), the prepared loader's collate function measures every
    batch against the sampler's budget and raises at the first one over it
    (:func:`fitbatch.collate.check_budget`; samplers whose cost cannot be measured on a token
    tensor, and the compat samplers, are not checked). The given loader is not changed.

    Returns:
        accelerate's prepared loader (a ``DataLoaderShard``).

    Raises:
        TypeError: the loader's ``batch_sampler`` is not a fitbatch sampler.
        ValueError: ``split_batches=True`` or ``dispatch_batches=True`` (they cut or merge
            batches), or a sampler built for another world than the accelerator's (one with
            ``num_replicas``).

    >>> prepare_loader(None, object())
    Traceback (most recent call last):
    ...
    TypeError: loader.batch_sampler must be a fitbatch sampler (e.g. fitbatch.BudgetBatchSampler), got NoneType
    """
    sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(sampler, PlanSampler):
        raise TypeError(
            "loader.batch_sampler must be a fitbatch sampler (e.g. fitbatch.BudgetBatchSampler), "
            f"got {type(sampler).__name__}"
        )
    config = accelerator.dataloader_config
    for option in ("split_batches", "dispatch_batches"):
        if getattr(config, option, False):
            raise ValueError(
                f"accelerate's {option}=True would cut or merge fitbatch's batches across processes; "
                f"build the Accelerator with DataLoaderConfiguration({option}=False)"
            )
    prepared = accelerator.prepare(loader)
    shard: Any = getattr(prepared, "batch_sampler", None)
    sharded = getattr(shard, "batch_sampler", None) is sampler
    # the data-parallel world accelerate splits the loader over (with a device mesh: the DP part)
    world, index = (int(shard.num_processes), int(shard.process_index)) if sharded else (1, 0)
    # a sampler without num_replicas (the compat ones) batches what it is given on each process
    replicas = getattr(sampler, "num_replicas", None)
    if replicas is not None and (replicas, getattr(sampler, "rank", 0)) != (world, index):
        raise ValueError(
            f"{type(sampler).__name__} was built for rank {getattr(sampler, 'rank', 0)} of {replicas}, but "
            f"accelerate splits the loader over {world} process(es) and this one is {index}: build it after "
            "Accelerator() (it reads torch.distributed) or pass num_replicas=accelerator.num_processes, "
            "rank=accelerator.process_index"
        )
    if sharded:
        shard.num_processes, shard.process_index = 1, 0  # a pass-through: this rank's batches
    if check_budget and measurable(sampler) and getattr(prepared, "collate_fn", None) is not None:
        # on the torch loader accelerate's adapter wraps (accelerate >= 1.0), read by each new
        # iterator (and its workers) and carried by skip_first_batches
        torch_loader = getattr(prepared, "base_dataloader", prepared)
        torch_loader.collate_fn = checked_collate(prepared.collate_fn, sampler)
    return prepared


def prepare(accelerator: Any, loader: Any, *, register: bool = True, check_budget: bool = True) -> ResumableLoader:
    """Prepare a loader of fitbatch batches and register its cursor for ``save_state``.

    Args:
        accelerator: an ``accelerate.Accelerator``.
        loader: a ``torch.utils.data.DataLoader`` whose ``batch_sampler`` is a fitbatch sampler
            with state (``BudgetBatchSampler`` at any ``window=``, ``ScheduledBatchSampler``), built for the accelerator's processes; a sampler without
            state (the compat ones) takes :func:`prepare_loader`.
        register: call ``accelerator.register_for_checkpointing`` on the result, so that
            ``save_state``/``load_state`` carry the epoch and the step.
        check_budget: measure each collated batch against the sampler's budget (see
            :func:`prepare_loader`).

    Returns:
        a :class:`ResumableLoader` over accelerate's prepared loader.

    Raises:
        TypeError, ValueError: see :func:`prepare_loader`; ``use_stateful_dataloader=True``
            (accelerate would restore the position a second time).

    >>> prepare(None, object())
    Traceback (most recent call last):
    ...
    TypeError: loader.batch_sampler must be a fitbatch sampler (e.g. fitbatch.BudgetBatchSampler), got NoneType
    """
    sampler = getattr(loader, "batch_sampler", None)
    if isinstance(sampler, PlanSampler) and not hasattr(sampler, "load_state_dict"):
        raise TypeError(f"{type(sampler).__name__} has no state to resume; use prepare_loader(accelerator, loader)")
    if isinstance(sampler, PlanSampler) and getattr(accelerator.dataloader_config, "use_stateful_dataloader", False):
        raise ValueError(
            "use_stateful_dataloader=True: accelerate would restore the loader's position and fitbatch's "
            "cursor would restore it again; build the Accelerator without it (prepare() keeps the exact "
            "position), or use accelerator.prepare(loader) alone and set the sampler's epoch yourself"
        )
    out = ResumableLoader(prepare_loader(accelerator, loader, check_budget=check_budget), sampler, accelerator)
    if register:
        accelerator.register_for_checkpointing(out)
    return out


class ResumableLoader:
    """accelerate's prepared loader plus fitbatch's cursor: the batches the loop received.

    Iterating yields the prepared loader's batches and counts them (:attr:`step`);
    :meth:`state_dict` is the sampler's state at that count, so a checkpoint taken inside the
    loop (after the step) resumes at the next batch, whatever the loader prefetched. Other
    attributes (``dataset``, ``device``, ``batch_sampler``, ...) are the prepared loader's.
    After an iteration runs to the end, the sampler moves on to the next epoch (as accelerate's
    loaders count epochs); :meth:`set_epoch` sets one.

    Gradient accumulation (``Accelerator(gradient_accumulation_steps=k)`` and ``with
    accelerator.accumulate(model)``, one batch per call): a checkpoint taken inside an
    accumulation holds the model as the last optimizer step left it, not the gradients of the
    batches since, so its cursor is the first batch of that accumulation: a resume runs those
    batches again and every batch's gradient is applied once. After ``load_state``,
    accelerate's step counter (which decides on which batches the ranks synchronise
    gradients) is set from this cursor on every rank: accelerate restores it from a file per
    rank, which a rank added by a larger world does not have; ranks that disagreed on it
    deadlocked in DDP.

    Args:
        loader: accelerate's prepared loader (from :func:`prepare_loader`).
        sampler: the fitbatch sampler it draws from.
        accelerator: the ``Accelerator`` (:func:`prepare` passes it), for the gradient
            accumulation above; ``None``: no accumulation is assumed.

    >>> import fitbatch
    >>> sampler = fitbatch.BudgetBatchSampler([3, 1, 4, 1, 5], 5, num_replicas=1, rank=0)
    >>> loader = ResumableLoader(list(sampler), sampler)  # any iterable of its batches
    >>> next(iter(loader)), loader.step, loader.state_dict()["sampler"]["step"]
    ([3, 1], 1, 1)
    """

    STATE = StateSchema("accelerate loader", version=1, required=(SAMPLER_KEY,))

    def __init__(self, loader: Any, sampler: Any, accelerator: Any = None) -> None:
        self.loader, self.sampler, self.accelerator = loader, sampler, accelerator
        self._done = self._first_step()  # steps of the epoch the loop has received
        self._start = self._done  # the step this iteration of the epoch began at

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs (the sampler's)."""
        return int(self.sampler.epoch)

    @property
    def step(self) -> int:
        """Steps of the current epoch handed to the loop (index ``step - 1`` of ``step_totals()``)."""
        return self._done

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration runs, on the sampler and on accelerate's loader."""
        if epoch != self.sampler.epoch:
            self._done = 0
        self.sampler.set_epoch(epoch)
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(epoch)

    def step_totals(self) -> Any:
        """The sampler's :class:`~fitbatch.sampler.StepTotals` of the epoch: per step, samples, real units and loss units, all ranks."""
        return self.sampler.step_totals()

    def __len__(self) -> int:
        return len(self.loader)

    def _first_step(self) -> int:
        # the sampler's resume cursor: the step its next iteration starts at
        return int(self.sampler.n_steps()) - len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        self._done = self._start = self._first_step()
        for batch in self.loader:
            self._done += 1
            yield batch
        self.set_epoch(self.sampler.epoch + 1)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "sampler", "accelerator"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def _pending(self) -> int:
        """Batches of an unfinished gradient accumulation (their gradients are in no checkpoint)."""
        acc = self.accelerator
        steps = int(getattr(acc, "gradient_accumulation_steps", 1) or 1)
        if acc is None or steps <= 1 or getattr(acc, "sync_gradients", True):
            return 0
        return min(int(acc.step) % steps, self._done - self._start)

    def state_dict(self) -> dict[str, Any]:
        """``{"version", "sampler"}``: the sampler's state after the steps the loop received
        (inside a gradient accumulation: at its first batch, see the class docstring)."""
        return self.STATE.envelope(**{SAMPLER_KEY: state_at(self.sampler, self._done - self._pending())})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the saved epoch and step (re-arranged if the number of processes changed)."""
        self.STATE.check(state)
        self.sampler.load_state_dict(state[SAMPLER_KEY])
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(self.sampler.epoch)
        # the sampler's cursor: the saved step, or 0 of a re-arranged rest of the epoch
        self._done = self._start = self._first_step()
        if self.accelerator is not None and hasattr(self.accelerator, "step"):
            # the same accumulation phase on every rank, whatever files the world had: accelerate
            # counts batches since the epoch began (0 at each epoch's end), as this cursor does
            self.accelerator.step = self._done


__all__ = ["ResumableLoader", "prepare", "prepare_loader", "state_at"]
