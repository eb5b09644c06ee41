"""Names a package exports but imports on first use (PEP 562), written once for every face.

A face lists ``{name: module}`` and takes its ``__getattr__`` and ``__dir__`` from
:func:`exports`; the first lookup imports the module and stores the name in the face's globals,
so later lookups are plain attributes. Imports a plan never needs (hashlib, file readers,
torch) stay out of ``import fitbatch``.

>>> import types
>>> face = types.ModuleType("face")
>>> face.__getattr__, face.__dir__ = exports("face", {"sqrt": "math"}, vars(face))
>>> face.sqrt(4.0), "sqrt" in dir(face)
(2.0, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def exports(
    face: str, table: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the module ``face`` whose globals are ``namespace``,
    loading each name of ``table`` from its module on first use."""

    def __getattr__(name: str) -> Any:
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            namespace[name] = value  # the next lookup is a plain attribute
            return value
        raise AttributeError(f"module {face!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


class _Later:
    """A module imported at the first lookup of one of its attributes (see :func:`module`)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def module(name: str) -> Any:
    """The module ``name`` for a module-level global that imports it on first use: a kernel a
    plan may not need stays out of ``import fitbatch``. Declare the real module under
    ``TYPE_CHECKING`` so that type checks see it.

    >>> import sys
    >>> later = module("fitbatch._no_such_module_yet")
    >>> "fitbatch._no_such_module_yet" in sys.modules
    False
    >>> module("colorsys").rgb_to_hsv(1.0, 0.0, 0.0)
    (0.0, 1.0, 1.0)
    """
    return _Later(name)
