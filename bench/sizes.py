"""Sizes benchmark: how fast sizes come from files and objects, and how fast `fitbatch plan` reports.

Run from the repository root:

    python bench/sizes.py               # 100k local files, 10k S3 objects (moto, loopback), 10M plan
    python bench/sizes.py --files 20000 --objects 0 --plan-n 1000000   # quicker

It prints markdown tables:

1. Local files: ``fitbatch.sizes.from_files`` on a directory tree of ``--files`` files (sizes drawn
   from the real CPython token-count set, as sparse files, 1,000 per directory), best of
   ``--repeat`` (page cache warm), beside fsspec's ``LocalFileSystem.find(detail=True)`` and a
   Python loop of ``os.path.getsize`` over known paths (the per-object way).
2. S3 objects (when s3fs and moto are installed): ``from_files("s3://...")`` through moto's S3
   server on 127.0.0.1, with the ListObjectsV2 requests it made, beside one HEAD per object
   (timed on a sample and scaled) — what a per-object size lookup costs.
3. ``fitbatch plan`` on ``--plan-n`` sizes (a .npy resampled from the real function set), as a
   subprocess, wall time to the printed table, for one strategy and for ``--strategy all``.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"

import fitbatch  # noqa: E402
import fitbatch.sizes  # noqa: E402


def make_tree(root: Path, n: int, per_dir: int = 1000) -> np.ndarray:
    """``n`` sparse files with real sizes (tokens per stdlib function x 4 bytes)."""
    base = np.load(DATA / "cpython_stdlib_functions.npy").astype(np.int64) * 4
    sizes = base[np.random.default_rng(0).integers(0, base.size, n)]
    for d in range(0, n, per_dir):
        folder = root / f"shard{d // per_dir:04d}"
        folder.mkdir()
        for i in range(d, min(n, d + per_dir)):
            with open(folder / f"sample{i:07d}.bin", "wb") as fh:
                fh.truncate(int(sizes[i]))
    return sizes


def best(fn, repeat: int) -> tuple[float, object]:
    out, t_best = None, float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t0)
    return t_best, out


def local_table(n: int, repeat: int) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="fitbatch-bench-"))
    try:
        t0 = time.perf_counter()
        want = make_tree(tmp, n)
        made = time.perf_counter() - t0
        rows = []
        t, got = best(lambda: fitbatch.sizes.from_files(tmp, progress=False), repeat)
        assert sorted(got.tolist()) == sorted(want.tolist())
        rows.append(("fitbatch.sizes.from_files (scandir, one read per directory)", t))
        try:
            import fsspec

            fs = fsspec.filesystem("file")
            t_f, found = best(lambda: fs.find(str(tmp), detail=True), 1)
            assert len(found) == n
            rows.append(("fsspec LocalFileSystem.find(detail=True)", t_f))
        except ImportError:
            pass
        paths, _ = fitbatch.sizes.list_files(tmp, progress=False)
        t_g, _ = best(lambda: [os.path.getsize(p) for p in paths], 1)
        rows.append(("os.path.getsize per known path (Python loop)", t_g))
        lines = [
            f"\n### Local files: {n:,} files in {n // 1000:,} directories (tree made in {made:.1f} s; best of {repeat}, warm cache)\n",
            "| method | time s | files/s |",
            "|---|---|---|",
            *(f"| {name} | {sec:.3f} | {n / sec:,.0f} |" for name, sec in rows),
        ]
        return "\n".join(lines)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def s3_table(n: int, prefixes: int = 10) -> str:
    try:
        import boto3
        import s3fs  # noqa: F401
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server
    except ImportError as exc:
        return f"\n### S3 objects: skipped ({exc})"

    class Quiet(WSGIRequestHandler):
        def log_request(self, *args, **kwargs):
            pass

    log: list[str] = []
    app = DomainDispatcherApplication(create_backend_app)

    def logged(environ, start_response):
        log.append(f"{environ['REQUEST_METHOD']} {environ.get('QUERY_STRING', '')}")
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, logged, threaded=True, request_handler=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = boto3.client("s3", endpoint_url=url, aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        keys = [f"data/p{i % prefixes:02d}/obj{i:07d}.tar" for i in range(n)]
        for i, key in enumerate(keys):
            backend.put_object("bench", key, b"x" * (i % 977))
        options = {"endpoint_url": url, "key": "x", "secret": "x", "client_kwargs": {"region_name": "us-east-1"}}
        log.clear()
        t0 = time.perf_counter()
        sizes = fitbatch.sizes.from_files("s3://bench/data/", storage_options=options, progress=False)
        t_list = time.perf_counter() - t0
        requests, listings = len(log), sum("list-type=2" in q for q in log)
        assert sizes.size == n
        sample = keys[:: max(1, n // 300)]
        t0 = time.perf_counter()
        for key in sample:
            client.head_object(Bucket="bench", Key=key)
        t_head = (time.perf_counter() - t0) / len(sample) * n
        return "\n".join([
            f"\n### S3 objects: {n:,} objects under {prefixes} prefixes (moto server on 127.0.0.1)\n",
            "| method | requests | time s | objects/s |",
            "|---|---|---|---|",
            f"| fitbatch.sizes.from_files('s3://bench/data/') | {requests} ({listings} ListObjectsV2) | {t_list:.3f} | {n / t_list:,.0f} |",
            f"| one HEAD per object (boto3; {len(sample)} timed, scaled) | {n:,} | {t_head:.1f} | {n / t_head:,.0f} |",
        ])
    finally:
        server.shutdown()
        thread.join(timeout=10)


def plan_table(n: int) -> str:
    base = np.load(DATA / "cpython_stdlib_functions.npy")
    tmp = Path(tempfile.mkdtemp(prefix="fitbatch-bench-"))
    try:
        path = tmp / "sizes.npy"
        np.save(path, base[np.random.default_rng(0).integers(0, base.size, n)].astype(np.int64))
        rows = []
        for extra in (["--strategy", "pooled"], ["--strategy", "buckets"], []):
            cmd = [sys.executable, "-m", "fitbatch", "plan", str(path), "--budget", "16384", *extra]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            n_rows = sum(1 for line in proc.stdout.splitlines() if line.startswith(("fixed", "fitbatch ")))
            rows.append(f"| `fitbatch plan sizes.npy --budget 16384 {' '.join(extra)}` | {n_rows} | {wall:.2f} | {cpu:.2f} |")
        return "\n".join([
            f"\n### `fitbatch plan` on {n:,} sizes (.npy; the whole command, Python start-up included; CPU time is what the command itself used, wall time also counts waiting for a shared core)\n",
            "| command | table rows | wall s | CPU s (user+sys) |",
            "|---|---|---|---|",
            *rows,
        ])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--plan-n", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"fitbatch {fitbatch.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    if args.files:
        print(local_table(args.files, args.repeat), flush=True)
    if args.objects:
        print(s3_table(args.objects), flush=True)
    if args.plan_n:
        print(plan_table(args.plan_n), flush=True)


if __name__ == "__main__":
    main()
