"""Held-out length sets for the plan-quality frontier (issue #39): shapes no rule was tuned on.

Two kinds, both resampled to ``n`` with a fixed seed:

- **Synthetic families** (``families(n)``): lognormal lengths of four spreads, a bimodal
  mixture, a Zipf tail, a uniform range, a few distinct values, and a large spike at the
  maximum (like Wikipedia-512, where 23 % of the sequences are cut at 512).
- **Real sets made on this machine** (``local_real(n)``), built at bench time from what is
  installed, with a tokenizer defined here (``TOKEN``: words, numbers and single punctuation
  marks, the split a word-level BPE starts from):

  * ``docstrings``: the docstring of every public function, class and method reachable from
    ``numpy`` and ``torch`` (each object once), in tokens;
  * ``doc paragraphs``: the paragraphs (blank-line separated) of every ``.md``, ``.rst`` and
    ``.txt`` file under the interpreter's ``site-packages``, in tokens.

  Their size depends on the installed versions: the bench prints how many lengths each held.

>>> sorted(families(100))[:2]
['bimodal (20 / 400)', 'few values (32 64 128 512)']
"""

from __future__ import annotations

import inspect
import re
import site
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

TOKEN = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")


def families(n: int, maximum: float = 16384.0) -> dict[str, np.ndarray]:
    """The synthetic families at ``n`` samples (seed 0), integer lengths in ``[1, maximum]``."""
    rng = np.random.default_rng(0)
    out = {}
    for sigma in (0.3, 0.6, 1.0, 1.5):
        out[f"lognormal (4.5, {sigma})"] = rng.lognormal(4.5, sigma, n)
    short = rng.random(n) < 0.7
    out["bimodal (20 / 400)"] = np.where(short, rng.normal(20, 5, n), rng.normal(400, 80, n))
    out["zipf tail (a=1.6)"] = 8.0 * rng.zipf(1.6, n)
    out["uniform (1-1000)"] = rng.uniform(1, 1000, n)
    out["few values (32 64 128 512)"] = rng.choice([32.0, 64, 128, 512], n, p=[0.4, 0.3, 0.2, 0.1])
    spike = rng.lognormal(5.0, 0.8, n)
    out["spike at max (25 % at 512)"] = np.where(rng.random(n) < 0.25, 512.0, np.minimum(spike, 512.0))
    return {k: np.clip(np.round(v), 1, maximum) for k, v in out.items()}


def _tokens(text: str) -> int:
    return len(TOKEN.findall(text))


@lru_cache(maxsize=1)
def _docstrings() -> np.ndarray:
    import numpy
    import torch

    seen: set[int] = set()
    lengths: list[int] = []
    todo = [numpy, torch, torch.nn, torch.nn.functional, numpy.linalg, numpy.fft, numpy.random, torch.linalg, torch.fft]
    for module in todo:
        for name in dir(module):
            if name.startswith("_"):
                continue
            try:
                obj = getattr(module, name)
            except Exception:  # noqa: BLE001 - lazy attributes that fail to load are skipped
                continue
            members = [obj]
            if inspect.isclass(obj):
                members += [v for k, v in vars(obj).items() if not k.startswith("_") and callable(v)]
            for m in members:
                doc = getattr(m, "__doc__", None)
                if isinstance(doc, str) and id(m) not in seen and doc.strip():
                    seen.add(id(m))
                    lengths.append(_tokens(doc))
    return np.asarray(lengths, dtype=np.float64)


@lru_cache(maxsize=1)
def _paragraphs() -> np.ndarray:
    roots = [Path(p) for p in site.getsitepackages() if Path(p).is_dir()]
    lengths: list[int] = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix not in (".md", ".rst", ".txt") or not path.is_file():
                continue
            try:
                text = path.read_text(encoding="utf-8", errors="ignore")
            except OSError:
                continue
            lengths += [t for t in (_tokens(p) for p in re.split(r"\n\s*\n", text)) if t > 0]
    return np.asarray(lengths, dtype=np.float64)


def local_real(n: int, maximum: float = 16384.0) -> dict[str, np.ndarray]:
    """The real sets made from what is installed, resampled to ``n`` (seed 0)."""
    out = {}
    for name, base in (("docstrings (numpy, torch)", _docstrings()), ("doc paragraphs (site-packages)", _paragraphs())):
        base = base[(base >= 1) & (base <= maximum)]
        print(f"# {name}: {base.size:,} lengths, median {np.median(base):.0f}, max {base.max():.0f}", file=sys.stderr)
        out[name] = base[np.random.default_rng(0).integers(0, base.size, n)]
    return out
