"""What the gloo worker scripts here share: their command line and their process group.

Each worker is started as a script (``python tests/distributed/x_worker.py --init ... --world W
--rank r --out DIR [its own options]``), so this module is found beside it on ``sys.path``.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path
from typing import Any

#: how long a rank waits for the others at any collective before it fails (no test hangs)
TIMEOUT = timedelta(seconds=60)


def worker_args(**extra: dict[str, Any]) -> argparse.Namespace:
    """``--init``, ``--world``, ``--rank``, ``--out``, plus ``extra`` (``name=add_argument kwargs``)."""
    p = argparse.ArgumentParser()
    p.add_argument("--init", required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    for name, kwargs in extra.items():
        p.add_argument(f"--{name.replace('_', '-')}", required=True, **kwargs)
    return p.parse_args()


def join_group(args: argparse.Namespace) -> None:
    """This rank joins the gloo process group the test started (file store, :data:`TIMEOUT`)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=args.init, world_size=args.world, rank=args.rank, timeout=TIMEOUT)
