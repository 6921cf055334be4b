"""The ``fastsearch`` command: workload listing, a short tuning run, clear errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fastsearch.database import RECORD_FILE, WORKLOAD_FILE


def _command() -> list[str]:
    """The installed console script next to this interpreter, else the module."""
    script = Path(sys.executable).with_name("fastsearch")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("fastsearch")
    return [found] if found else [sys.executable, "-m", "fastsearch.cli"]


def run(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_command(), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False
    )


def test_workloads_lists_the_families():
    out = run("workloads")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for family in ("GMM", "C2D", "SFM", "TBG"):
        assert any(line.startswith(f"{family}:0 ") for line in lines)
    gmm0 = next(line for line in lines if line.startswith("GMM:0 "))
    assert "(1, 128, 128, 128)" in gmm0


def test_tune_smoke(tmp_path):
    work = tmp_path / "db"
    out = run(
        "tune",
        "--workload",
        "GMM",
        "--small",
        "--trials",
        "4",
        "--seed",
        "1",
        "--work-dir",
        str(work),
        "--target",
        "llvm",
    )
    assert out.returncode == 0, out.stderr
    assert "4/4 trials" in out.stderr  # progress on stderr
    summary = out.stdout
    assert "GMM_0 (1, 128, 128, 128)" in summary
    assert "best " in summary and "GFLOP/s" in summary
    assert str(work) in summary
    for key in ("search", "build", "run"):
        assert key in summary
    assert (work / WORKLOAD_FILE).is_file()
    rows = [json.loads(line) for line in (work / RECORD_FILE).read_text().splitlines() if line]
    assert len(rows) == 4


def test_default_work_dir_is_under_the_current_directory(tmp_path):
    out = run("tune", "--workload", "GMM:0", "--trials", "2", "--no-progress", "--no-verify", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "2/2 trials" not in out.stderr  # no progress bar
    assert (tmp_path / "fastsearch_work" / "GMM_0" / RECORD_FILE).is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("tune", "--workload", "NOPE"), "unknown workload 'NOPE'"),
        (("tune", "--workload", "GMM:17"), "GMM has shapes 0..3"),
        (("tune", "--workload", "GMM", "--target", '{"kind": "nope"}'), "InvalidTarget"),
        (("tune", "--workload", "GMM", "--target", "llvm -mcpu=skylake"), "llvm -mcpu=skylake"),
    ],
)
def test_bad_input_is_a_clear_error(args, message, tmp_path):
    out = run(*args, "--work-dir", str(tmp_path / "w"), timeout=120)
    assert out.returncode == 1
    assert message in out.stderr
    assert "Traceback" not in out.stderr
