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
