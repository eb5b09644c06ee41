"""The ``fitbatch`` command: ``demo``, ``plan``, ``sizes``, ``index`` (docs/cli.md).

``main(argv)`` runs one subcommand and returns its exit code (0, or 2 for bad input with one
line on stderr). ``_demo`` holds the bundled real example, ``_plot`` the plan plots.

>>> from fitbatch.cli import main
>>> callable(main)
True
"""

from __future__ import annotations

from fitbatch.cli._main import main

__all__ = ["main"]
