"""Griffe extension for the docs site: docstrings written for doctest and Sphinx read as Markdown.

fitbatch's docstrings are Google style with Sphinx roles (``:class:`~fitbatch.plan.BatchPlan```,
``:func:`sample```), which Markdown would print as they are. Each role becomes an *optional*
mkdocs-autorefs reference: a link where the target is rendered on some page, plain code where it
is not (a private module), so a role never breaks ``mkdocs build --strict``. A relative target is
looked up in the object's own scope, its module, then the package. A doctest example outside an
``Examples:`` section (``>>>`` lines and their output, up to a blank line) becomes a fenced
``pycon`` block, so that its output is not read as Markdown. Loaded by mkdocs.yml
(``extensions: - docs/_griffe_roles.py``).
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|mod|meth|attr|data|exc|obj|const):`(?P<target>[^`]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrite ``:role:`target``` in every docstring of the loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None:
                text = _fence_doctests(obj.docstring.value)
                obj.docstring.value = ROLE.sub(lambda m, o=obj: _ref(m["target"], o, pkg), text)


def _fence_doctests(text: str) -> str:
    """Put each run of doctest lines (from ``>>>`` to the next blank line) in a ``pycon`` fence,
    at the run's indentation; runs under an ``Examples:`` heading are left to griffe."""
    lines, out, i = text.split("\n"), [], 0
    in_examples = False
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped and not line.startswith(" "):
            in_examples = stripped.rstrip() in ("Examples:", "Example:")
        if stripped.startswith(">>>") and not in_examples:
            indent = line[: len(line) - len(stripped)]
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            out += [f"{indent}```pycon", *lines[i:j], f"{indent}```"]
            i = j
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _walk(obj: griffe.Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)  # type: ignore[arg-type]


def _ref(target: str, obj: griffe.Object, pkg: griffe.Module) -> str:
    title = target.lstrip("~")
    short = target.startswith("~")
    # "Title <target>" form
    explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<path>[^>]+)>", title)
    if explicit:
        title, path = explicit["title"], explicit["path"]
    else:
        path = title.lstrip(".")
        if short:
            title = path.rsplit(".", 1)[-1]
    scopes = [obj.path, obj.parent.path if obj.parent else "", obj.module.path, pkg.path, ""]
    identifier = path
    for scope in scopes:
        candidate = f"{scope}.{path}" if scope else path
        try:
            _lookup(pkg, candidate)
        except (KeyError, ValueError, AttributeError):
            continue
        identifier = candidate
        break
    code = f"<code>{html.escape(title)}</code>"
    return f'<autoref identifier="{html.escape(identifier)}" optional>{code}</autoref>'


def _lookup(pkg: griffe.Module, path: str) -> griffe.Object | griffe.Alias:
    if path == pkg.path:
        return pkg
    if not path.startswith(pkg.path + "."):
        raise KeyError(path)
    return pkg[path[len(pkg.path) + 1 :]]
