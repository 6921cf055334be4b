"""The ``fastsearch`` command: workload listing, a short tuning run, clear errors."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastsearch.database import RECORD_FILE, WORKLOAD_FILE


def _command() -> list[str]:
    """The installed console script next to this interpreter, else the module."""
    script = Path(sys.executable).with_name("fastsearch")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("fastsearch")
    return [found] if found else [sys.executable, "-m", "fastsearch.cli.main"]


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
    curve_csv = tmp_path / "curve.csv"
    args = ["tune", "--workload", "GMM", "--small", "--trials", "4", "--seed", "1"]
    args += ["--work-dir", str(work), "--target", "llvm", "--history", str(curve_csv)]
    out = run(*args)
    assert out.returncode == 0, out.stderr
    assert "4/4 trials" in out.stderr  # progress on stderr
    summary = out.stdout
    assert "GMM_0 (1, 128, 128, 128)" in summary
    assert "best " in summary and "GFLOP/s" in summary
    assert str(work) in summary
    for key in ("search", "build", "run"):
        assert key in summary
    assert re.search(r"build \(s\)    per candidate \([1-4] recorded\), medians: TVM passes \d", summary)
    assert (work / WORKLOAD_FILE).is_file()
    rows = [json.loads(line) for line in (work / RECORD_FILE).read_text().splitlines() if line]
    assert "final round  runners-up side by side with the best: x" in summary
    switched = "became the best" in summary  # then the final round stored the runner-up again
    assert len(rows) == 4 + switched
    with open(curve_csv) as f:
        curve = list(csv.DictReader(f))
    assert [int(r["trial"]) for r in curve] == [1, 2, 3, 4]
    best = [float(r["best_us"]) for r in curve if r["best_us"]]
    assert best and best == sorted(best, reverse=True)


def test_default_work_dir_is_under_the_current_directory(tmp_path):
    out = run("tune", "--workload", "GMM:0", "--trials", "2", "--no-progress", "--no-verify", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "2/2 trials" not in out.stderr  # no progress bar
    assert (tmp_path / "fastsearch_work" / "GMM_0" / RECORD_FILE).is_file()


def test_timing_defaults_are_the_librarys():
    """`fastsearch tune` times candidates as `fastsearch.tune` does unless told otherwise: its
    --repeat, --number and --min-repeat-ms defaults come from MeasureConfig (they were once
    written twice, and the command kept 20 ms repeats after the library's went to 10)."""
    from fastsearch.cli.main import _parser
    from fastsearch.measure.measurer import MeasureConfig

    args = _parser().parse_args(["tune", "--workload", "GMM"])
    defaults = MeasureConfig()
    assert (args.repeat, args.number, args.min_repeat_ms) == (
        defaults.repeat,
        defaults.number,
        defaults.min_repeat_ms,
    )


@pytest.mark.parametrize("cold", ["on", "off"])
def test_cold_weights_option(cold, tmp_path):
    out = run("tune", "--workload", "GMM", "--small", "--trials", "2", "--no-progress", "--no-verify",
              "--cold-weights", cold, "--work-dir", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "best " in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("tune", "--workload", "NOPE"), "unknown workload 'NOPE'"),
        (("tune", "--workload", "GMM:17"), "GMM has shapes 0..3"),
        (("tune", "--workload", "GMM", "--target", '{"kind": "nope"}'), "InvalidTarget"),
        (("tune", "--workload", "GMM", "--target", "llvm -mcpu=skylake"), "llvm -mcpu=skylake"),
        (("tune", "--workload", "GMM", "--fusion", "search"), "needs a Relax model"),
    ],
)
def test_bad_input_is_a_clear_error(args, message, tmp_path):
    out = run(*args, "--work-dir", str(tmp_path / "w"), timeout=120)
    assert out.returncode == 1
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def _complete_rows(path: Path) -> list:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the line a killed run was writing
    return rows


def test_killed_run_resumes_from_its_database(tmp_path):
    """SIGKILL after the first batch: the rerun keeps what was stored and measures only the rest."""
    work = tmp_path / "db"
    args = [*_command(), "tune", "--workload", "GMM:0", "--trials", "8", "--batch-size", "2"]
    args += ["--work-dir", str(work), "--no-progress"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = work / RECORD_FILE
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if records.is_file() and len(records.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    kept = len(_complete_rows(records))
    assert 2 <= kept < 8
    out = run("tune", "--workload", "GMM:0", "--trials", "8", "--batch-size", "2", "--work-dir", str(work))
    assert out.returncode == 0, out.stderr
    assert f"{8 - kept} measured this run" in out.stdout
    assert f"{kept} already stored" in out.stdout
    rows = _complete_rows(records)
    switched = "became the best" in out.stdout  # the final round stored a runner-up again
    assert len(rows) == 8 + switched and records.read_text().endswith("\n")
    assert len({json.dumps(r[1][0]) for r in rows}) == 8  # no candidate measured twice
