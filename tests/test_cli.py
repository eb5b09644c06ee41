"""The ``fitbatch`` command, run as a subprocess on real files (tests/cli_data, tests/data)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fitbatch
import fitbatch.sizes
import fitbatch.sizes._files as files_module
from fitbatch import cli
from fitbatch.epoch._arrange import arrange

TESTS = Path(__file__).resolve().parent
CLI_DATA = TESTS / "cli_data"
DATA = TESTS / "data"

# cli.main configures logging for its process: undo it after each test (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("restore_logging")


def run(*args: str, cwd: Path = CLI_DATA, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "fitbatch", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def table(stdout: str) -> dict[str, list[str]]:
    """The rows of the printed table, by plan name (cells split on 2+ spaces)."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("plan "))
    rows = {}
    for line in lines[head + 2 :]:
        if not line.strip():
            break
        cells = [c for c in line.split("  ") if c.strip()]
        rows[cells[0].strip()] = [c.strip() for c in cells[1:]]
    return rows


# Sizes 5 3 8 2 7 4 6 1 9, budget 10, padded cost. By hand: sorted gives [1 2 3] [4 5] [6] [7] [8]
# [9]: 6 batches, lower bound ceil(45 / 10) = 5, padded units 9+10+6+7+8+9 = 49, so padding
# efficiency 45/49 = 0.918, mean fill 49/60 = 0.817. The file order [5 3] [8] [2] [7] [4] [6] [1]
# [9] (sequential) pads to 47: 0.957 and 47/80 = 0.588. The largest safe fixed batch size is 1
# (9 + 8 padded to 18 > 10): 9 batches, fill 45/90 = 0.5, max 0.9.
SMALL_ALL = {
    "fixed batch size 1": ["9", "1.800x", "1.000", "0.500", "0.90", "-"],
    "fitbatch buckets": ["6", "1.200x", "0.918", "0.817", "1.00", "-"],  # one size per bucket (tiny epoch)
    "fitbatch packed": ["6", "1.200x", "0.918", "0.817", "1.00", "-"],
    "fitbatch pooled": ["6", "1.200x", "0.918", "0.817", "1.00", "-"],
    "fitbatch sequential": ["8", "1.600x", "0.957", "0.588", "1.00", "-"],
    "fitbatch sorted": ["6", "1.200x", "0.918", "0.817", "1.00", "-"],
}


def test_plan_small_known_numbers_every_strategy() -> None:
    out = run("plan", "small.npy", "--budget", "10").stdout
    assert out.startswith("small.npy: 9 sizes, total 45; min 1, median 5, max 9. Budget 10 (padded cost).")
    rows = table(out)
    assert {k: v[:-1] for k, v in rows.items()} == SMALL_ALL  # the last cell is the plan time


@pytest.mark.parametrize("source", ["small.txt", "small.csv", "small.parquet"])
def test_plan_same_numbers_from_every_format(source: str) -> None:
    if source.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    column = [] if source.endswith(".txt") else ["--column", "tokens"]
    out = run("plan", source, *column, "--budget", "10", "--strategy", "sorted").stdout
    rows = table(out)
    assert rows["fitbatch sorted"][:-1] == SMALL_ALL["fitbatch sorted"]
    assert rows["fixed batch size 1"][:-1] == SMALL_ALL["fixed batch size 1"]
    # One strategy: BatchPlan.report() follows the table, with the same numbers.
    assert "batches             6 (1.200x lower bound 5)" in out
    assert "padding efficiency  0.9184" in out


def test_plan_json_equals_the_library_over_ranks_and_epochs() -> None:
    pytest.importorskip("pyarrow")
    args = ["--budget", "65536", "--oversized", "skip", "--world-size", "3", "--epochs", "2", "--json", "--seed", "5"]
    got = json.loads(run("plan", "pytokens.parquet", "--column", "tokens", *args).stdout)
    sizes = fitbatch.as_sizes(np.load(DATA / "cpython_stdlib_pytokens.npy"))
    model = fitbatch.costs.resolve_cost("padded")
    by_name = {r["plan"]: r for r in got["rows"]}
    assert list(by_name)[0].startswith("fixed batch size")
    for name in ("pooled", "buckets", "sequential"):
        expect = []
        for epoch in range(2):
            plan = fitbatch.plan_batches(sizes, 65536, strategy=name, seed=5, epoch=epoch, oversized="skip")
            steps = arrange(plan, sizes, model, 3, seed=5, epoch=epoch)
            steps.plan.straggler_ratio = steps.straggler_ratio
            expect.append(steps.plan.stats().as_dict())
        row = by_name[f"fitbatch {name}"]
        for mine, theirs in zip(row["per_epoch"], expect):
            mine.pop("plan_seconds"), theirs.pop("plan_seconds")
            assert mine == pytest.approx(theirs)
        assert row["mean"]["n_batches"] == pytest.approx(np.mean([e["n_batches"] for e in expect]))
        assert row["mean"]["straggler_ratio"] == pytest.approx(np.mean([e["straggler_ratio"] for e in expect]))
        assert row["mean"]["skipped"] == 1  # the one file over 65536 tokens, counted


def test_plan_real_set_same_from_npy_csv_parquet() -> None:
    pytest.importorskip("pyarrow")
    common = ["--budget", "16384", "--oversized", "single", "--strategy", "buckets", "--json"]
    outs = [
        json.loads(run("plan", str(DATA / "cpython_stdlib_pytokens.npy"), *common).stdout),
        json.loads(run("plan", "pytokens.csv", "--column", "tokens", *common).stdout),
        json.loads(run("plan", "pytokens.parquet", "--column", "tokens", *common).stdout),
    ]
    means = [[{k: v for k, v in r["mean"].items() if k != "plan_seconds"} for r in o["rows"]] for o in outs]
    assert means[0] == means[1] == means[2]
    assert means[0][1]["n_samples"] == 1759 and means[0][1]["oversized_batches"] == 60


@pytest.fixture(scope="module")
def stdlib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few hundred real files of varying sizes, in nested directories."""
    root = Path(sysconfig.get_paths()["stdlib"])
    dest = tmp_path_factory.mktemp("stdlib")
    files = sorted(root.glob("*.py"))[:150] + sorted((root / "json").glob("*.py")) + sorted((root / "email").rglob("*.py"))
    for path in files:
        target = dest / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return dest


def test_sizes_command_byte_sizes_of_a_directory(stdlib_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sizes.npy"
    paths_file = tmp_path / "paths.txt"
    proc = run("sizes", str(stdlib_dir), "-o", str(out), "--paths", str(paths_file))
    expect = sorted((str(p), p.stat().st_size) for p in stdlib_dir.rglob("*") if p.is_file())
    sizes = np.load(out)
    assert sizes.dtype == np.int64 and sizes.tolist() == [s for _, s in expect]
    assert paths_file.read_text().split() == [p for p, _ in expect]
    assert f"{len(expect):,} sizes" in proc.stdout
    plan = run("plan", str(stdlib_dir), "--budget", "1MiB", "--cost", "sum", "--strategy", "packed").stdout
    assert f"{len(expect):,} sizes, total {sum(s for _, s in expect):,}" in plan
    assert "fitbatch packed" in table(plan)


def test_plot_png_is_written_and_not_blank(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    out = run("plan", str(DATA / "cpython_stdlib_pytokens.npy"), "--budget", "65536", "--oversized", "skip",
              "--plot", str(png)).stdout
    assert f"plot written to {png}" in out
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[:2] == (450, 1200)
    rgb = img[..., :3].reshape(-1, 3)
    assert rgb.std() > 0.05 and len(np.unique(rgb, axis=0)) > 50
    assert (rgb.min(axis=1) < 0.5).mean() > 0.01  # bars and text, not an empty canvas


ERRORS = [
    (["plan", "missing.npy", "--budget", "10"], "no such file or directory: 'missing.npy'"),
    (["plan", "small.csv", "--column", "tokenz", "--budget", "10"], "small.csv has no column 'tokenz'; columns: ['name', 'tokens']"),
    (["plan", "small.csv", "--budget", "10"], "small.csv has 2 columns ['name', 'tokens']: choose one"),
    (["plan", "small.parquet", "--column", "size", "--budget", "10"], "small.parquet has no column 'size'; columns: ['name', 'tokens']"),
    (["plan", "small.npy", "--column", "tokens", "--budget", "10"], "column= applies to .csv and .parquet files, not to .npy"),
    (["plan", "empty.txt", "--budget", "10"], "empty.txt holds no sizes (empty input)"),
    (["plan", "empty.csv", "--column", "tokens", "--budget", "10"], "empty.csv holds no sizes (empty input)"),
    (["plan", "bad_value.txt", "--budget", "10"], "bad_value.txt line 5: 'abc' is not a number"),
    (["plan", "bad_value.csv", "--column", "tokens", "--budget", "10"], "bad_value.csv line 4 (column 'tokens', row 2): 'n/a' is not a number"),
    (["plan", "nulls.parquet", "--budget", "10"], "nulls.parquet column 'tokens' row 1: missing value"),
    (["plan", "README.md", "--budget", "10"], "unknown sizes format '.md'"),
    (["plan", "small.npy", "--budget", "0.5"], "budget 0.5 is smaller than every sample: the smallest costs 1 alone (padded cost)"),
    (["plan", "small.npy", "--budget", "8"], "1 sample cost more than the budget 8 even alone; largest: index 8 (cost 9.0)"),
]


@pytest.mark.parametrize(("argv", "message"), ERRORS, ids=[e[1][:30] for e in ERRORS])
def test_error_messages(argv: list[str], message: str) -> None:
    if any(a.endswith(".parquet") for a in argv):
        pytest.importorskip("pyarrow")
    proc = run(*argv, ok=False)
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.startswith("fitbatch: error: ")
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


# --- every expected failure is one line and exit status 2; a bug keeps its traceback ---------


def main_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI in-process; return its one error line (checked to be one line, status 2)."""
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("fitbatch: error: ") and err.count("\n") == 1, err
    return err.strip()


def test_unwritable_outputs_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    small = str(CLI_DATA / "small.npy")
    assert main_error(capsys, "sizes", small, "-o", "/nonexistent/dir/out.npy") == (
        "fitbatch: error: cannot write /nonexistent/dir/out.npy: No such file or directory")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(b"abc")
    out = tmp_path / "out.npy"
    assert main_error(capsys, "sizes", str(tmp_path / "data"), "-o", str(out), "--paths", "/nonexistent/paths.txt") == (
        "fitbatch: error: cannot write /nonexistent/paths.txt: No such file or directory")


def test_plot_failures_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    small = str(CLI_DATA / "small.npy")
    line = main_error(capsys, "plan", small, "--budget", "10", "--plot", "/proc/nope.png")
    assert line.startswith("fitbatch: error: cannot write the plot /proc/nope.png: ")
    line = main_error(capsys, "plan", small, "--budget", "10", "--plot", str(tmp_path / "plan.xyz"))
    assert "cannot write the plot" in line and "Format 'xyz' is not supported" in line


class NoCredentialsError(Exception):
    """Stands in for botocore's (no OSError), raised from within a storage backend."""

    __module__ = "botocore.exceptions"


class FailingFS:
    """An fsspec-like filesystem whose every listing call raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def invalidate_cache(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise self.error

        return fail


@pytest.mark.parametrize(("error", "line"), [
    (NoCredentialsError("Unable to locate credentials"),
     "cannot read s3://bucket/prefix/: NoCredentialsError: Unable to locate credentials"),
    (PermissionError(13, "Permission denied", "bucket/prefix"), "cannot read s3://bucket/prefix/: Permission denied"),
])
def test_storage_errors_are_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                     error: Exception, line: str) -> None:
    # s3fs and moto may be absent: a filesystem that fails as s3fs without credentials does
    monkeypatch.setattr(files_module, "_url_to_fs", lambda url, options: (FailingFS(error), url.split("://", 1)[1]))
    assert main_error(capsys, "sizes", "s3://bucket/prefix/", "-o", "out.npy") == f"fitbatch: error: {line}"


@pytest.mark.parametrize("error", [
    ImportError("reading s3:// needs 'fsspec': pip install 'fitbatch[fsspec]'"),
    ValueError("bad\nvalue"),
    TypeError("sizes must be numbers"),
    OSError("disk on fire"),
])
def test_library_errors_are_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                     error: Exception) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(fitbatch.sizes, "from_source", fail)
    line = main_error(capsys, "plan", "x.npy", "--budget", "10")
    assert line.endswith(" ".join(str(error).split()))


def test_unexpected_errors_keep_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug in fitbatch")

    monkeypatch.setattr(fitbatch.sizes, "from_source", bug)
    with pytest.raises(KeyError, match="a bug in fitbatch"):
        cli.main(["plan", "x.npy", "--budget", "10"])


def test_a_subprocess_error_is_one_line_too(tmp_path: Path) -> None:
    proc = run("sizes", "small.npy", "-o", str(tmp_path / "missing" / "out.npy"), ok=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"fitbatch: error: cannot write {tmp_path / 'missing' / 'out.npy'}: No such file or directory\n"


def test_oversized_error_names_the_flags_and_single_plans_them() -> None:
    proc = run("plan", "small.npy", "--budget", "8", ok=False)
    assert "(--oversized single or --oversized skip)" in proc.stderr
    out = run("plan", "small.npy", "--budget", "8", "--oversized", "skip", "--strategy", "sorted").stdout
    assert "1 sample cost more than the budget alone: left out (--oversized skip)." in out
    assert "skipped / dropped   1 / 0 (0 batches)" in out


def test_usage_errors_exit_2() -> None:
    proc = run("plan", "small.npy", "--budget", "lots", ok=False)
    assert proc.returncode == 2 and "budget 'lots' is not a number" in proc.stderr
    proc = run("plan", "small.npy", "--budget", "10", "--world-size", "0", ok=False)
    assert proc.returncode == 2 and "expected an int >= 1" in proc.stderr


def test_demo_still_prints_its_table() -> None:
    out = run("demo", "--limit", "20").stdout
    assert out.startswith("Tokenising this Python's standard library")
    rows = table(out)
    assert "seed tools' greedy (sum budget)" in rows and "fitbatch pooled" in rows
    assert len(rows["fitbatch pooled"]) == 6  # batches .. plan ms: the demo's columns are unchanged


def test_sampler_logs_one_epoch_summary_at_info(caplog: pytest.LogCaptureFixture, pytokens: np.ndarray) -> None:
    sampler = fitbatch.BudgetBatchSampler(pytokens, 65536, oversized="skip", num_replicas=1, rank=0, seed=1)
    with caplog.at_level(logging.INFO, logger="fitbatch"):
        batches = list(sampler)
        list(sampler)  # the same epoch again: planned once, logged once
    summaries = [r for r in caplog.records if r.name == "fitbatch.sampler._budget"]
    assert len(summaries) == 1 and summaries[0].levelno == logging.INFO
    msg = summaries[0].getMessage()
    assert "\n" not in msg
    assert msg == "epoch 0: " + sampler.plan(0).stats().summary()
    assert f"{len(batches)} batches" in msg and "skipped 1" in msg
    sampler.set_epoch(1)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fitbatch"):
        list(sampler)
    assert [r.getMessage()[:8] for r in caplog.records if r.name == "fitbatch.sampler._budget"] == ["epoch 1:"]


def test_console_script_is_installed() -> None:
    exe = shutil.which("fitbatch")
    if exe is None:
        pytest.skip("the fitbatch console script is not on PATH (package not installed with pip)")
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 0 and proc.stdout.startswith("fitbatch ")


def test_compile_print_path_is_this_installs_cache_folder(tmp_path: Path) -> None:
    """``fitbatch compile --print-path``: the folder the loader reads (under FITBATCH_CACHE_DIR),
    without building anything."""
    pytest.importorskip("numba")
    from fitbatch._kernels import aot

    proc = subprocess.run([sys.executable, "-m", "fitbatch", "compile", "--print-path"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "FITBATCH_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    printed = Path(proc.stdout.strip())
    assert printed.parent == tmp_path / "aot"
    assert printed.name == aot.directory().name  # the same key in this process (only the root differs)
    assert not printed.exists()


def test_compile_without_numba_is_one_error_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba" else real(name, *a))
    assert cli.main(["compile"]) == 2  # EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fitbatch[fast]" in err[0], err
