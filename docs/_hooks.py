"""MkDocs hooks for the docs site (loaded by mkdocs.yml; not a page).

The Markdown files stay readable where they are (on a forge, in an editor) and the site is built
from them, with no second copy:

* ``--8<-- "FILE"`` or ``--8<-- "FILE:SECTION"`` on a line of its own includes a repository
  file, or the part of it between ``<!-- --8<-- [start:SECTION] -->`` and
  ``<!-- --8<-- [end:SECTION] -->`` (the README's quickstart, BENCHMARKS.md, CHANGELOG.md);
* links are written relative to the file they are in; on the site, a link to a docs page or to
  README.md, BENCHMARKS.md or CHANGELOG.md goes to its page, an image outside docs/ is copied
  into the site, and a link to any other repository file (a script, an example) becomes its
  path in code, since the site does not carry the sources;
* ``<!-- front door -->`` on ``api/fitbatch.md`` becomes the table of ``fitbatch.__all__``, each
  name linked to the package face that documents it;
* every API page must render every public name (``__all__``) of its module, or the build fails.
"""

from __future__ import annotations

import importlib
import inspect
import posixpath
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]

#: repository files that are pages of the site
ROOT_PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks.md", "CHANGELOG.md": "changelog.md"}
IMAGE = (".png", ".svg", ".jpg", ".jpeg", ".gif")
INCLUDE = re.compile(r'^--8<-- "(?P<file>[^":]+)(?::(?P<section>[\w-]+))?"[ \t]*$', re.M)
LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<url>[^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
API_PAGE = re.compile(r"^api/(?P<module>fitbatch(?:\.\w+)*)\.md$")


def on_config(config: Any) -> Any:
    """Pages that the nav of mkdocs.yml does not list join it: a guide (``docs/*.md``) at the end
    of "Guides", an API page (``docs/api/fitbatch.*.md``) at the end of "API reference", so
    that a page added on another branch is on the site after a merge without a nav edit."""
    nav = config["nav"] or []
    listed = set(_nav_paths(nav))
    sections = {key: items for entry in nav if isinstance(entry, dict) for key, items in entry.items()}
    docs = ROOT / "docs"
    for folder, section in (("", "Guides"), ("api", "API reference")):
        if section not in sections:
            continue
        for path in sorted((docs / folder).glob("*.md")):
            rel = path.relative_to(docs).as_posix()
            if rel not in listed and rel not in ROOT_PAGES.values() and rel != "getting_started.md":
                sections[section].append(rel)
    return config


def _nav_paths(items: Any) -> Any:
    if isinstance(items, str):
        yield items
    elif isinstance(items, list):
        for item in items:
            yield from _nav_paths(item)
    elif isinstance(items, dict):
        for value in items.values():
            yield from _nav_paths(value)


def on_files(files: Files, config: Any) -> Files:
    """Add the images that included repository files and the pages show from outside docs/."""
    sources = [ROOT / name for name in ROOT_PAGES] + sorted((ROOT / "docs").rglob("*.md"))
    for source in sources:
        base = source.parent.relative_to(ROOT).as_posix()
        for match in LINK.finditer(_outside_fences(source.read_text())):
            path = _resolve(base, match["url"].split("#", 1)[0])
            if path and path.endswith(IMAGE) and not path.startswith("docs/"):
                if files.get_file_from_path(path) is None and (ROOT / path).is_file():
                    files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    page_dir = posixpath.dirname(page.file.src_uri)
    markdown = _links(markdown, posixpath.join("docs", page_dir).rstrip("/"), page_dir)
    markdown = INCLUDE.sub(lambda m: _include(m["file"], m["section"], page_dir), markdown)
    if page.file.src_uri == "api/fitbatch.md":
        markdown = markdown.replace("<!-- front door -->", _front_door())
    return markdown


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    match = API_PAGE.match(page.file.src_uri)
    if match and match["module"] != "fitbatch":
        module = _module(match["module"])
        names = [n for n in getattr(module, "__all__", ()) if not n.startswith("_")]
        missing = [n for n in names if not _documented(html, module, n)]
        if missing:
            raise PluginError(f"{page.file.src_uri} does not document {module.__name__}.{missing}")
    return html


def _module(name: str) -> Any:
    """Import ``name`` from this checkout's ``src`` (mkdocs resets ``sys.path`` after loading
    hooks, so the path goes in at first use), and refuse a fitbatch imported from elsewhere."""
    src = ROOT / "src"
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    module = importlib.import_module(name)
    where = Path(sys.modules["fitbatch"].__file__ or "").resolve()
    if src not in where.parents:
        raise PluginError(f"fitbatch was imported from {where}, not from {src}")
    return module


def _documented(html: str, module: Any, name: str) -> bool:
    """Whether the page has a heading for ``module.name``, under the face's path or its own."""
    if f'id="{module.__name__}.{name}"' in html:
        return True
    obj = getattr(module, name)
    own = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    return f'id="{own}"' in html


def _include(name: str, section: str | None, page_dir: str) -> str:
    path = ROOT / name
    if not path.is_file():
        raise PluginError(f"include of {name!r}: no such file")
    text = path.read_text()
    if section is not None:
        start, end = f"<!-- --8<-- [start:{section}] -->", f"<!-- --8<-- [end:{section}] -->"
        if start not in text or end not in text:
            raise PluginError(f"include of {name}:{section}: no {start} ... {end} in {name}")
        text = text.split(start, 1)[1].split(end, 1)[0]
    base = posixpath.dirname(name)
    return _links(text.strip("\n"), base, page_dir)


def _links(markdown: str, base: str, page_dir: str) -> str:
    """Rewrite the links of ``markdown`` (written from repository folder ``base``) for a page in
    ``page_dir`` of the site. Code blocks are left alone."""
    out, last = [], 0
    for fence in FENCE.finditer(markdown):
        out.append(LINK.sub(lambda m: _link(m, base, page_dir), markdown[last : fence.start()]))
        out.append(fence.group(0))
        last = fence.end()
    out.append(LINK.sub(lambda m: _link(m, base, page_dir), markdown[last:]))
    return "".join(out)


def _link(match: re.Match[str], base: str, page_dir: str) -> str:
    url = match["url"]
    path_part, hash_, anchor = url.partition("#")
    path = _resolve(base, path_part)
    if path is None:
        return match.group(0)
    if path.startswith("docs/"):
        target = path[len("docs/") :]
    elif path in ROOT_PAGES:
        target = ROOT_PAGES[path]
    elif path.endswith(IMAGE) and (ROOT / path).is_file():
        target = path  # copied into the site at the same path by on_files
    else:  # a source file or folder: the site does not carry it
        text = match["text"]
        return text if path in text or text.startswith("`") else f"{text} (`{path}`)"
    rel = posixpath.relpath(target, page_dir or ".")
    return f"{match['bang']}[{match['text']}]({rel}{hash_}{anchor})"


def _resolve(base: str, url: str) -> str | None:
    """The repository path a relative link points at, or None (external, anchor-only)."""
    if not url or re.match(r"^[a-z][a-z0-9+.-]*:", url) or url.startswith("/"):
        return None
    path = posixpath.normpath(posixpath.join(base, url))
    return None if path.startswith("..") else path


def _outside_fences(markdown: str) -> str:
    return FENCE.sub("", markdown)


def _front_door() -> str:
    """A table of ``fitbatch.__all__``: each name, its first docstring line and its face."""
    fitbatch = _module("fitbatch")
    faces = sorted(
        p.stem for p in (ROOT / "docs" / "api").glob("fitbatch.*.md") if p.stem.count(".") == 1
    )
    rows, unhomed = ["| name | what it is | documented in |", "| --- | --- | --- |"], []
    for name in sorted(n for n in fitbatch.__all__ if not n.startswith("_")):
        obj = getattr(fitbatch, name)
        home = next((f for f in faces if _exports(_module(f), name, obj)), None)
        summary = _summary(obj)
        if home is None:
            unhomed.append(name)
            rows.append(f"| [`{name}`](#fitbatch.{name}) | {summary} | this page |")
        else:
            anchor = f"{home}.{name}"
            if inspect.ismodule(sys.modules.get(anchor)):  # a submodule shadows it (calibrate)
                anchor = f"{obj.__module__}.{obj.__qualname__}"
            face = home.removeprefix("fitbatch.")
            rows.append(f"| [`{name}`]({home}.md#{anchor}) | {summary} | [{face}]({home}.md) |")
    parts = ["\n".join(rows)]
    if unhomed:
        parts.append("## Names documented here\n\nThese front-door names are not exported by a package face yet.")
        parts += [f"::: fitbatch.{name}\n    options:\n      heading_level: 3" for name in unhomed]
    return "\n\n".join(parts)


def _exports(face: Any, name: str, obj: object) -> bool:
    """Whether the face's page documents ``obj`` as ``name``: in its ``__all__``, or (a module
    without one) a public name defined there."""
    if getattr(face, name, None) is not obj:
        return False
    if hasattr(face, "__all__"):
        return name in face.__all__
    return getattr(obj, "__module__", None) == face.__name__


def _summary(obj: object) -> str:
    if not (inspect.isclass(obj) or callable(obj) or inspect.ismodule(obj)):
        return ""
    doc = inspect.getdoc(obj) or ""
    first = doc.strip().split("\n\n", 1)[0].replace("\n", " ")
    first = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", first).replace("``", "`").replace("|", "\\|")
    return first if len(first) <= 160 else first[:157].rsplit(" ", 1)[0] + " …"

