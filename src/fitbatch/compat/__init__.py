"""Drop-in adapters of the five seed tools' APIs, planned by fitbatch's engine.

One thin module per tool; each keeps the tool's names and signatures, maps them onto the core
(:func:`fitbatch.plan._planner.plan_with`, :func:`fitbatch.streaming.batch_stream`,
:mod:`fitbatch.memory`, :mod:`fitbatch.pipeline`, :mod:`fitbatch.schedule`) and says in its
docstring where it deliberately differs from the original (a bug not reproduced) and why:

* :mod:`fitbatch.compat.equibatch` — ``EquiarealBatchSampler``;
* :mod:`fitbatch.compat.bionemo` — bionemo-size-aware-batching 1.0.0: ``sampler``
  (``size_aware_batching``, ``SizeAwareBatchSampler``, ``BucketBatchSampler``, ``Real``) and
  ``utils`` (``collect_cuda_peak_alloc``, ``create_buckets``, ``Buckets``), plus the
  pre-release's ``PolynomialRegression``;
* :mod:`fitbatch.compat.aistore` — ``DynamicBatchSampler``;
* :mod:`fitbatch.compat.dpipe` — deep-pipe 0.5.0's ``dpipe.batch_iter``: its 18 names and its
  modules ``pipeline`` (with ``wrap_pipeline``), ``sources``, ``utils``, ``expiration_pool``;
* :mod:`fitbatch.compat.xla_vbs` — ``CustomSampler``, ``LinearRuleOptimizer``,
  ``RootRuleOptimizer``, ``ConstantOptimizer``.

Migrating is a change of the import line, for bionemo and dpipe a change of the package prefix
(see ``docs/migrating.md``); ``tests/upstream/`` runs the tools' own test suites on the adapters. Importing a module here
imports torch only where the adapter needs it by nature. The samplers are
:class:`~fitbatch.sampler._budget.PlanSampler` subclasses, as ``fitbatch.BudgetBatchSampler`` is; they
take torch's ``Sampler``/``BatchSampler`` as a second base on first access to the class.

>>> from fitbatch.compat.equibatch import EquiarealBatchSampler
>>> list(EquiarealBatchSampler(range(4), [5, 5, 9, 1].__getitem__, max_size=10, max_footprint=10))
[[0, 1], [2, 3]]
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from fitbatch.plan._planner import BatchPlan, PlanOptions, plan_with
from fitbatch.sampler._protocol import PlanSampler, RankLayout, torch_class
from fitbatch.sizes import Sizes, as_sizes

TOOLS = ("aistore", "bionemo", "dpipe", "equibatch", "xla_vbs")

__all__ = list(TOOLS)


def __getattr__(name: str) -> Any:
    # `fitbatch.compat.equibatch` without importing the other four (and their dependencies)
    if name in TOOLS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def measure(order: Sequence[Any], sizeof: Any, name: str) -> Sizes:
    """``sizeof(i)`` for every entry of ``order``, validated: numbers, non-negative and finite.

    Raises:
        TypeError: a result is not a real number.
        ValueError: negative or non-finite results, listed by sample (not by position).
    """
    raw = [sizeof(i) for i in order]
    wrong = [v for v in raw if isinstance(v, (bool, np.bool_)) or not _is_real(v)]
    if wrong:
        raise TypeError(f"{name} must return real numbers, got {wrong[0]!r}")
    values = np.asarray([float(v) for v in raw], dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0)))
    if bad.size:
        shown = ", ".join(f"sample {order[i]!r} (size {values[i]})" for i in bad[:5].tolist())
        more = f" and {bad.size - 5} more" if bad.size > 5 else ""
        raise ValueError(f"{name} must return non-negative finite sizes; {bad.size} bad: {shown}{more}")
    integral = all(isinstance(v, (int, np.integer)) for v in raw)
    return Sizes(values, integral or bool(np.all(values == np.floor(values))))


def _is_real(value: Any) -> bool:
    # numbers, numpy scalars and 0-d tensors convert with float(); strings must not
    return not isinstance(value, (str, bytes)) and hasattr(value, "__float__")


def plan_in_order(order: Sequence[Any], sizes: Any, budget: float | str, **options: Any) -> BatchPlan:
    """Greedy sum-budget batches over samples in a given order (the three samplers' rule).

    The plan is made over ``sizes`` (one per entry of ``order``, in that order) with the
    ``sequential`` strategy and the ``sum`` cost, unshuffled; its positions index ``order``
    (map them back with :func:`batches_of`).
    """
    opts = PlanOptions.build(budget, cost="sum", strategy="sequential", shuffle=False, **options)
    sz = sizes if isinstance(sizes, Sizes) else as_sizes(sizes)
    if len(sz) != len(order):
        raise ValueError(f"got {len(sz)} sizes for {len(order)} samples")
    return plan_with(sz, opts)


def batches_of(plan: BatchPlan, order: Sequence[Any]) -> list[list[Any]]:
    """The plan's batches as lists of the entries of ``order`` its positions point at."""
    if not len(plan):
        return []
    items = np.asarray(order) if len(order) else np.zeros(0, np.int64)
    if items.ndim == 1 and np.issubdtype(items.dtype, np.integer):
        flat = items[plan.order].tolist()
    else:  # indices of other types (keys, tuples): keep the very objects the sampler gave
        flat = [order[i] for i in plan.order.tolist()]
    bounds = plan.offsets.tolist()
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def torch_subclass(impl: type, base: str, module: str) -> type:
    """``impl`` with torch's ``torch.utils.data.<base>`` as second base (``impl`` alone without torch).

    ``impl`` owns ``__init__``, ``__iter__`` and ``__len__``; the torch base only makes
    ``isinstance`` checks (``DataLoader``, Lightning) pass.

    >>> class _Pairs(OrderedPlanSampler):
    ...     def __init__(self, order):
    ...         self.order = order
    ...     def _draw(self):
    ...         return self.order, plan_in_order(self.order, [1] * len(self.order), 2)
    >>> Pairs = torch_subclass(_Pairs, "BatchSampler", __name__)
    >>> Pairs.__name__, list(Pairs([5, 6, 7]))
    ('Pairs', [[5, 6], [7]])
    """
    torch_base = torch_class(base)
    bases = (impl,) if torch_base is object else (impl, torch_base)
    name = impl.__name__.lstrip("_")
    return type(name, bases, {"__module__": module, "__qualname__": name, "__doc__": impl.__doc__})


def lazy_torch_classes(module: str, classes: dict[str, tuple[type, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that builds each torch-backed class on first access.

    ``classes`` maps a public name to (implementation, torch base name); importing torch is paid
    only when the class is used.
    """

    def __getattr__(name: str) -> Any:
        if name in classes:
            impl, base = classes[name]
            cls = torch_subclass(impl, base, module)
            setattr(sys.modules[module], name, cls)
            return cls
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


class OrderedPlanSampler(PlanSampler):
    """A :class:`~fitbatch.sampler._budget.PlanSampler` over the order a wrapped sampler gives, drawn anew each iteration.

    Subclasses implement :meth:`_draw` (read the order, measure, plan) and may override
    :meth:`_after` (called once an iteration has yielded every batch). The batches hold the
    entries of the order (any index type); ``plan()`` is the next iteration's draw, whatever the
    epoch (its positions index the order). ``len()`` draws that plan once, so that the length
    and the batches that follow agree.

    >>> class Pairs(OrderedPlanSampler):
    ...     def _draw(self):
    ...         order = ["a", "b", "c"]
    ...         return order, plan_in_order(order, [1, 1, 1], 2)
    >>> sampler = Pairs()
    >>> len(sampler), list(sampler)
    (2, [['a', 'b'], ['c']])
    """

    _next: tuple[list[Any], BatchPlan] | None = None

    def _draw(self) -> tuple[list[Any], BatchPlan]:
        raise NotImplementedError

    def _after(self, order: list[Any], plan: BatchPlan) -> None:
        """Hook run after an iteration's last batch (reports, logs)."""

    def _layout(self, epoch: int) -> RankLayout:
        # the next iteration's draw, whatever the epoch
        if self._next is None:
            self._next = self._draw()
        return RankLayout.alone(self._next[1])

    def _generate(self) -> Iterator[tuple[int, list[Any]]]:
        # a generator: the draw runs at the first next(), after the length hint list() asks for
        order, plan = self._next if self._next is not None else self._draw()
        self._next = None
        yield from enumerate(batches_of(plan, order))
        self._after(order, plan)
