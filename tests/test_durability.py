"""Durability: ``fastsearch tune`` killed with SIGKILL at several points resumes from its database,
which stays readable, keeps every record written before the kill and never measures a candidate
twice; a torn last line (a kill in the middle of an append) is set aside and reported."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import warnings
from pathlib import Path

from fastsearch.database import RECORD_FILE, WORKLOAD_FILE, TuningDatabase
from test_cli import _command, run

TRIALS, BATCH = 8, 2
ARGS = ["tune", "--workload", "GMM:0", "--trials", str(TRIALS), "--batch-size", str(BATCH)]
ARGS += ["--strategy", "random", "--repeat", "1", "--min-repeat-ms", "5", "--build-workers", "1"]


def _complete_rows(path: Path) -> list[list]:
    """Records on complete lines (a torn last line has no newline yet)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def _kill_when(work: Path, rows: int) -> int:
    """Start a run and SIGKILL it once the record file holds ``rows`` complete records (0: once the
    workload is written, i.e. during the first batch); returns the records seen just before."""
    proc = subprocess.Popen(
        [*_command(), *ARGS, "--work-dir", str(work), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    records, seen = work / RECORD_FILE, 0
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (work / WORKLOAD_FILE).is_file():
                seen = len(_complete_rows(records))
                if seen >= rows:
                    break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    return seen


def _keys(rows: list[list]) -> list[str]:
    return [json.dumps(r[1][0]) for r in rows]  # the stored trace: one per candidate


def test_sigkill_at_several_points_then_resume(tmp_path):
    work = tmp_path / "db"
    stored_after: list[int] = []
    for rows in (0, 1, 3, 6):  # during the first batch, then mid-run at growing record counts
        seen = _kill_when(work, rows)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn line is repaired here; reported below
            db = TuningDatabase(work)  # readable after every kill
        stored = _complete_rows(work / RECORD_FILE)
        assert len(db) == len(stored) >= seen  # nothing written before the kill is lost
        assert len(set(_keys(stored))) == len(stored)  # nothing measured twice
        assert not stored_after or len(stored) >= stored_after[-1]
        stored_after.append(len(stored))
    assert stored_after[-1] < TRIALS

    # A kill in the middle of an append leaves half a line: the resumed run sets it aside and says so.
    record_file = work / RECORD_FILE
    last = record_file.read_text().splitlines()[-1]
    with open(record_file, "a") as f:
        f.write(last[: len(last) // 2])
    kept = len(_complete_rows(record_file))

    out = run(*ARGS, "--work-dir", str(work), "--no-progress")
    assert out.returncode == 0, out.stderr
    assert f"{TRIALS - kept} measured this run" in out.stdout
    assert f"{kept} already stored" in out.stdout
    assert "repaired     dropped the torn last line" in out.stdout
    assert "DatabaseWarning" in out.stderr
    assert (work / (RECORD_FILE + ".torn")).read_text() == last[: len(last) // 2] + "\n"
    rows = _complete_rows(record_file)
    switched = "became the best" in out.stdout  # the final round stored a runner-up again
    assert len(rows) == TRIALS + switched and record_file.read_text().endswith("\n")
    assert len(set(_keys(rows))) == TRIALS  # resumed runs never re-measured a stored candidate
    print(f"records stored after kills at 0/1/3/6 records: {stored_after}")
