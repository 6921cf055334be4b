"""Reading a suite's runs back (``benches.suite`` writes them): the databases of both tuners,
in the order their records were committed, and a record's time and kernel."""

from __future__ import annotations

import gzip
import json
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import tvm
from fastsearch.database import candidate_key
from fastsearch.ir.vector_math import REWRITTEN_OPS
from fastsearch.search.state import PREFIX
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod


def records_in_order(work_dir: Path, func: Any) -> list[ms.database.TuningRecord]:
    """Tuning records in the order they were committed (the JSON lines' order)."""
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    workload = db.commit_workload(_normalize_mod(func))
    out = []
    for line in (work_dir / "database_tuning_record.json").read_text().splitlines():
        if line.strip():
            _, rec = json.loads(line)
            out.append(ms.database.TuningRecord.from_json(rec, workload))
    return out


#: What of a fastsearch work directory a suite keeps (gzipped), so that its records can be
#: re-timed and analysed after the temporary work directory is gone.
_FASTSEARCH_KEPT = ("database_workload.json", "database_tuning_record.json", f"{PREFIX}.*genomes.jsonl")


def keep_fastsearch(work: Path, kept: Path) -> None:
    """Gzipped copies of fastsearch's database and genomes from ``work`` in ``kept``."""
    kept.mkdir(parents=True, exist_ok=True)
    for name in sorted({p.name for pattern in _FASTSEARCH_KEPT for p in work.glob(pattern)}):
        if (work / name).exists():
            with gzip.open(kept / f"{name}.gz", "wb", compresslevel=9) as out:
                out.write((work / name).read_bytes())


def suite_runs(suite_dir: Path, workload: str, seed: int | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """(path, run) of every run of ``workload`` (of ``seed``, when given) that a ``benches.suite``
    out-dir holds, in the order of their file names."""
    out = []
    for path in sorted(suite_dir.glob("run_*.json")):
        run = json.loads(path.read_text())
        if run["workload"] == workload and (seed is None or run["seed"] == seed):
            out.append((path, run))
    return out


def fastsearch_dir(run: dict[str, Any], out_dir: Path, stem: str) -> Path | None:
    """A run's fastsearch work directory: still in its ``work_dir``, or unpacked from the copy the
    suite kept in ``out_dir/fastsearch/<stem>`` (None when neither exists)."""
    work = Path(run["work_dir"]) / "fastsearch"
    if (work / "database_tuning_record.json").exists():
        return work
    kept = out_dir / "fastsearch" / stem
    if not (kept / "database_tuning_record.json.gz").exists():
        return None
    unpacked = Path(tempfile.mkdtemp(prefix=f"kept_{stem}_"))
    for gz in kept.glob("*.gz"):
        (unpacked / gz.name[:-3]).write_bytes(gzip.decompress(gz.read_bytes()))
    return unpacked


def metaschedule_dir(run: dict[str, Any], out_dir: Path, stem: str) -> Path:
    """A run's MetaSchedule database folder: the copy the suite kept in
    ``out_dir/metaschedule/<stem>`` when there is one, else the run's ``work_dir``."""
    kept = out_dir / "metaschedule" / stem
    if (kept / "database_tuning_record.json").exists():
        return kept
    return Path(run["work_dir"]) / "metaschedule"


def mean_us(rec: ms.database.TuningRecord) -> float:
    """A record's mean run time in microseconds (infinite for a failed one)."""
    secs = [float(s) for s in rec.run_secs] if rec.run_secs is not None else []
    return statistics.fmean(secs) * 1e6 if secs and max(secs) < 1e9 else math.inf


def compile_record(
    rec: ms.database.TuningRecord, target: tvm.target.Target, pipeline: str = "default"
) -> Any:
    """The record's schedule, replayed on its workload and built for ``target`` with the TIR
    ``pipeline`` (TVM's ``"default"``, what MetaSchedule builds with, or fastsearch's
    :data:`~fastsearch.ir.vector_math.TIR_PIPELINE`)."""
    return compile_module(replay_record(rec), target, pipeline)


def compile_module(mod: tvm.IRModule, target: tvm.target.Target, pipeline: str = "default") -> Any:
    """A scheduled module (:func:`replay_record`'s) built for ``target`` with the TIR ``pipeline``."""
    return tvm.compile(mod, target=target, tir_pipeline=pipeline)


def replay_record(rec: ms.database.TuningRecord) -> tvm.IRModule:
    """The record's schedule, replayed on its workload."""
    sch = tvm.s_tir.Schedule(rec.workload.mod)
    rec.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def lowering_differs(mod: tvm.IRModule) -> bool:
    """Whether a scheduled module calls an operator fastsearch's TIR pipeline rewrites
    (:data:`~fastsearch.ir.vector_math.REWRITTEN_OPS`): the kernels it can build differently
    from TVM's default one."""
    text = mod.script()
    return any(f"T.{op}(" in text for op in REWRITTEN_OPS)


def best_within(
    records: list[ms.database.TuningRecord], n: int, last: bool = True
) -> ms.database.TuningRecord | None:
    """The best record of the first ``n`` candidates measured. A candidate stored again (the
    winner of fastsearch's final round, after the run's last trial) counts at the ``last``
    checkpoint only."""
    first: dict[str, int] = {}
    within = []
    for rec in records:
        key = candidate_key(rec.trace)
        if key not in first:
            first[key] = len(first)
        elif not last:
            continue
        if first[key] < n and math.isfinite(mean_us(rec)):
            within.append(rec)
    return min(within, key=mean_us) if within else None


def other_cpu_load(seconds: float = 2.0) -> float:
    """How busy the machine's CPUs were over ``seconds`` while this process slept (0 idle, 1 every
    CPU busy), from ``/proc/stat``; NaN where it cannot be read. Timing a model while other work
    runs is unreliable: TVM's thread-pool barriers stall whenever a core is taken (a MobileNetV2
    read 225 ms instead of 14 ms)."""
    import time

    def sample() -> tuple[int, int] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    first = sample()
    time.sleep(seconds)
    second = sample()
    if first is None or second is None or second[0] == first[0]:
        return math.nan
    total, idle = second[0] - first[0], second[1] - first[1]
    return 1.0 - idle / total


#: Above this share of the CPUs busy with other work, a timing is flagged as unreliable.
BUSY_THRESHOLD = 0.1


def busy_warning(load: float) -> str | None:
    """A line for the report when other work kept the CPUs busy before timing, else None."""
    if math.isnan(load) or load <= BUSY_THRESHOLD:
        return None
    return (
        f"**Warning: {load:.0%} of the CPUs were busy with other work just before timing; "
        "the latencies are not reliable (re-time the exported libraries on a quiet machine with "
        "`python -m benches.retime_libraries`).**"
    )
