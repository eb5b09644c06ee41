# ruff: noqa: T201  (a CI script: it reports by printing)
"""The installed wheel, checked from a fresh virtual environment that holds only it and numpy.

Run by .ci/run with that environment's python, outside the checkout: fitbatch must import from
the environment, every module of ``src/fitbatch`` must be in it, and the doctests of every
module pass. Examples that need an optional dependency the environment lacks (torch, the
integrations' frameworks) are counted as skipped, never as passed; any other failure fails.
"""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[1]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


class Runner(doctest.DocTestRunner):
    """Records the optional dependencies an example failed to import."""

    def __init__(self) -> None:
        super().__init__(optionflags=FLAGS)
        self.missing: set[str] = set()

    def report_unexpected_exception(self, out: Any, test: Any, example: Any, exc_info: Any) -> None:
        error = exc_info[1]
        while error is not None:  # an ImportError naming the extra is raised from the original
            if isinstance(error, ModuleNotFoundError) and not (error.name or "").startswith("fitbatch"):
                self.missing.add(error.name or "?")
            error = error.__cause__ or error.__context__
        super().report_unexpected_exception(out, test, example, exc_info)


    def report_failure(self, out: Any, test: Any, example: Any, got: str) -> None:
        # an example that expects an exception: the missing module is in the traceback it got
        for name in re.findall(r"ModuleNotFoundError: No module named '([\w.]+)'", got):
            if not name.startswith("fitbatch"):
                self.missing.add(name)
        super().report_failure(out, test, example, got)


def main() -> int:
    import fitbatch

    where = Path(fitbatch.__file__).resolve().parent
    if CHECKOUT in where.parents:
        print(f"fitbatch was imported from the checkout ({where}), not the wheel", file=sys.stderr)
        return 1
    print(f"fitbatch {fitbatch.__version__} from {where}")
    source = CHECKOUT / "src" / "fitbatch"
    expected = {p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()
                and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")}
    installed = {p.relative_to(where).as_posix() for p in where.rglob("*") if p.is_file()}
    if expected - installed:
        print(f"not in the wheel: {sorted(expected - installed)}", file=sys.stderr)
        return 1

    passed = failed = skipped = 0
    needs: set[str] = set()
    names = ["fitbatch"] + [m.name for m in pkgutil.walk_packages(fitbatch.__path__, "fitbatch.")
                            if not m.name.endswith("__main__")]  # that one runs the CLI
    for name in names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:  # an optional dependency at import: skipped
            if (error.name or "").startswith("fitbatch"):
                raise
            needs.add(error.name or "?")
            print(f"{name}: skipped (needs {error.name})")
            continue
        for test in doctest.DocTestFinder().find(module, name):
            if not test.examples or test.name.split(".")[-1] in ("__getattr__",):
                continue
            runner, out = Runner(), io.StringIO()
            result = runner.run(test, out=out.write, clear_globs=True)
            if runner.missing:
                skipped += 1
                needs |= runner.missing
            elif result.failed:
                failed += 1
                print(out.getvalue(), file=sys.stderr)
            else:
                passed += 1
    print(f"doctests of {len(names)} modules from the wheel: {passed} passed, {failed} failed, "
          f"{skipped} skipped (need {', '.join(sorted(needs)) or 'nothing'})")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
