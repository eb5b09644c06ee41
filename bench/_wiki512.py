"""The sequence-length histogram of Krell et al.'s Wikipedia pre-training data (max length 512).

Source: Krell, Kosec, Perez, Fitzgibbon, "Efficient Sequence Packing without
Cross-contamination: Accelerating Large Language Models without Impacting Performance" (2021,
arXiv:2107.02027), histogram published with the authors' code: graphcore/examples,
``tutorials/blogs_code/packedBERT/histograms.py`` (``wikipedia_histogram``), Copyright (c) 2021
Graphcore Ltd., MIT licence. The counts are read from ``bench/data/wikipedia512_histogram.txt``
(one per line, with that note), the file ``bench/packing.py --wikipedia`` reads too.

``COUNTS[i]`` is the number of sequences of ``i + 1`` tokens: 16,279,552 sequences,
4,164,796,173 tokens; the bound ceil(tokens / 512) is 8,134,368 packs.

>>> int(COUNTS.sum()), int(np.ceil(tokens() / 512))
(16279552, 8134368)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "wikipedia512_histogram.txt"  # the counts, source, licence
COUNTS = np.loadtxt(DATA, dtype=np.int64, comments="#")
MAX_LENGTH = 512
# the packs the authors report for their algorithms on this histogram, at the most sequences per
# pack (as issue #39 quotes them from the paper): depth -> (algorithm, packs)
PUBLISHED = {3: ("NNLSHP", 8_155_057), 12: ("LPFHP", 8_149_619), 16: ("LPFHP", 8_140_006)}


def tokens() -> int:
    """All tokens of the histogram."""
    return int(np.dot(COUNTS, np.arange(1, MAX_LENGTH + 1)))


def lengths(seed: int = 0) -> np.ndarray:
    """One length per sequence (16,279,552), shuffled with ``seed``."""
    out = np.repeat(np.arange(1, MAX_LENGTH + 1, dtype=np.float64), COUNTS)
    np.random.default_rng(seed).shuffle(out)
    return out
