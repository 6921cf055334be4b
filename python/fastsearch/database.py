"""The tuning database: MetaSchedule's JSONDatabase in a work directory, plus the bookkeeping
fastsearch needs to resume (a structural key per candidate) and to pick the best record.

Records are written exactly as MetaSchedule's ``AddToDatabase`` measure callback writes them: the
full trace (postprocessing included), the measured run seconds, the target and the argument
info; a candidate that failed to build or run gets ``run_secs = [1e10]`` (MetaSchedule's
``kMaxMeanTime`` stub), which TVM's ``get_top_k`` / ``compile_tir`` skip as invalid. The files are
``database_workload.json`` and ``database_tuning_record.json``, so TVM's own tools read them.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tvm
from tvm.ir import IRModule
from tvm.s_tir import Trace
from tvm.s_tir import meta_schedule as ms
from tvm.tirx import FloatImm, IntImm
from tvm_ffi import Array, Map, structural_equal, structural_hash

from fastsearch.errors import DatabaseError, DatabaseWarning

#: MetaSchedule's stub run time for a candidate with no measurement (``kMaxMeanTime``).
FAILED_RUN_SECS = 1e10

#: How far below the record it replaces a chosen runner-up is stored when its own time is not
#: lower: enough for float32 run seconds to rank it first, far too little to claim a speed-up.
SUPERSEDE_MARGIN = 1e-4

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"

__all__ = [
    "FAILED_RUN_SECS",
    "TuningDatabase",
    "candidate_key",
    "is_failed",
    "mean_run_secs",
    "plain_json",
    "superseding_run_secs",
]


def plain_json(obj: Any) -> Any:
    """Convert a TVM container tree (Array, Map, IntImm, FloatImm, String) to plain Python."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, IntImm | FloatImm):
        return obj.value
    if isinstance(obj, Map | dict):
        return {str(plain_json(k)): plain_json(v) for k, v in obj.items()}
    if isinstance(obj, Array | list | tuple):
        return [plain_json(x) for x in obj]
    return str(obj)


def candidate_key(trace: Trace) -> str:
    """Structural key of a candidate: its trace's JSON with decisions, postprocessing removed.

    Two traces with the same instructions, attributes and decisions have the same key, whatever
    their variable names; a trace read back from the database has the key of the one sampled.
    """
    return json.dumps(plain_json(trace.as_json(remove_postproc=True)), separators=(",", ":"))


def _lower(secs_by_key: dict[str, float], key: str, run_secs: Sequence[Any] | None) -> None:
    """Keep the lower of ``key``'s mean seconds so far and that of ``run_secs`` (TVM values)."""
    secs = mean_run_secs([float(s) for s in run_secs] if run_secs is not None else None)
    secs_by_key[key] = min(secs, secs_by_key.get(key, FAILED_RUN_SECS))


def is_failed(run_secs: Sequence[float] | None) -> bool:
    """Whether a record's run seconds mark a failed candidate (missing, or MetaSchedule's stub)."""
    if not run_secs:
        return True
    return all(float(s) >= FAILED_RUN_SECS for s in run_secs)


def mean_run_secs(run_secs: Sequence[float] | None) -> float:
    """Mean of the run seconds, as MetaSchedule ranks records; ``1e10`` for a failed candidate."""
    if is_failed(run_secs):
        return FAILED_RUN_SECS
    assert run_secs is not None
    return sum(float(s) for s in run_secs) / len(run_secs)


def superseding_run_secs(own_secs: Sequence[float], replaced_secs: float) -> list[float]:
    """Run seconds that store a runner-up chosen over a record of mean ``replaced_secs`` so
    that TVM's ``get_top_k`` (and so ``compile_tir``) ranks it first.

    Its own measured ``own_secs`` when their mean is lower; else the same seconds scaled to a
    mean just under ``replaced_secs`` (:data:`SUPERSEDE_MARGIN`). The database is append-only
    and the replaced record keeps its time, so the winner must be stored below it; it is never
    stored below both its own time and the one it replaces. (Scaling the replaced record's time
    by a side-by-side ratio could: a best that ran slow in one of the final round's processes
    gave a 1024-cube matmul 634 GFLOP/s on a machine whose peak is 542.)
    """
    own = [float(s) for s in own_secs]
    if not own or is_failed(own) or not 0.0 < replaced_secs < FAILED_RUN_SECS:
        raise ValueError(f"cannot rank run seconds {own} against a replaced mean of {replaced_secs}")
    mean = sum(own) / len(own)
    if mean < replaced_secs * (1.0 - SUPERSEDE_MARGIN):
        return own
    scale = replaced_secs * (1.0 - SUPERSEDE_MARGIN) / mean
    return [s * scale for s in own]


def _check_json_lines(path: Path, kind: str, num_workloads: int | None, repairs: list[str]) -> int:
    """Validate a JSON-lines database file; repair a torn final line left by a killed run.

    Returns the number of valid lines; a repair is described in ``repairs``. A line that is not
    valid JSON (other than a torn final line without its newline) raises :class:`DatabaseError`
    naming the file and line.
    """
    if not path.exists():
        return 0
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatabaseError(f"cannot read {kind} file {path}: {exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"corrupt {kind} file {path}: not UTF-8 text ({exc})") from exc
    lines = text.split("\n")
    torn = lines[-1]  # text after the last newline: empty unless the last write was cut short
    count = 0
    for lineno, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        _check_line(path, kind, lineno, line, num_workloads)
        count += 1
    if torn.strip():
        try:
            _check_line(path, kind, len(lines), torn, num_workloads)
            count += 1
            with open(path, "a", encoding="utf-8") as f:  # complete line, only the newline is missing
                f.write("\n")
        except DatabaseError:
            # A run killed in the middle of an append: keep the fragment aside and drop it here.
            backup = path.with_name(path.name + ".torn")
            with open(backup, "a", encoding="utf-8") as f:
                f.write(torn + "\n")
            with open(path, "r+b") as f:
                f.truncate(len(data) - len(torn.encode("utf-8")))
            repairs.append(
                f"dropped the torn last line {len(lines)} of {path} ({len(torn)} characters, "
                f"a run killed while writing it); kept in {backup}"
            )
    return count


def _check_line(path: Path, kind: str, lineno: int, line: str, num_workloads: int | None) -> None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatabaseError(f"corrupt {kind} file {path}, line {lineno}: {exc}") from exc
    if not isinstance(row, list) or len(row) != 2:
        raise DatabaseError(f"corrupt {kind} file {path}, line {lineno}: expected a 2-element list")
    if num_workloads is not None:
        index = row[0]
        if not isinstance(index, int) or not 0 <= index < num_workloads:
            raise DatabaseError(
                f"corrupt {kind} file {path}, line {lineno}: workload index {index!r} does not "
                f"exist (the workload file has {num_workloads})"
            )
        if not isinstance(row[1], list) or len(row[1]) < 2:
            raise DatabaseError(f"corrupt {kind} file {path}, line {lineno}: malformed tuning record")


def _first_bad_line(workload_path: Path, record_path: Path) -> str | None:
    """Which line TVM could not load (its own error names no line): parse each one as
    JSONDatabase does, workloads first, then records against their workload."""
    workloads: list[ms.database.Workload] = []
    for path, is_record in ((workload_path, False), (record_path, True)):
        if not path.exists():
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            row = json.loads(line)  # _check_json_lines already checked the JSON
            try:
                if is_record:
                    ms.database.TuningRecord.from_json(row[1], workloads[row[0]])
                else:
                    workloads.append(ms.database.Workload.from_json(row))
            except Exception as exc:  # noqa: BLE001  (reported, with the file and line, as the cause)
                what = "tuning record" if is_record else "workload"
                last = str(exc).strip().splitlines() or [type(exc).__name__]
                return f"line {lineno} of {path} is not a valid {what}: {last[-1]}"
    return None


class TuningDatabase:
    """MetaSchedule's :class:`JSONDatabase` in ``work_dir``, with resume keys and best lookup.

    ``ms_database`` is the JSONDatabase itself (pass it to ``compile_tir`` or ``tune_tir``).
    Existing files are validated and loaded; a corrupt file raises :class:`DatabaseError` naming it.
    """

    def __init__(self, work_dir: str | os.PathLike[str]) -> None:
        self.path = Path(work_dir)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseError(f"cannot create database directory {self.path}: {exc}") from exc
        self.workload_path = self.path / WORKLOAD_FILE
        self.record_path = self.path / RECORD_FILE
        #: What was repaired on load (also issued as a DatabaseWarning).
        self.repairs: list[str] = []
        num_workloads = _check_json_lines(self.workload_path, "workload", None, self.repairs)
        _check_json_lines(self.record_path, "tuning-record", num_workloads, self.repairs)
        for message in self.repairs:
            warnings.warn(message, DatabaseWarning, stacklevel=2)
        try:
            self.ms_database = ms.database.JSONDatabase(
                path_workload=str(self.workload_path),
                path_tuning_record=str(self.record_path),
                allow_missing=True,
            )
        except Exception as exc:
            raise DatabaseError(
                f"cannot load the tuning database {self.workload_path} / {self.record_path}: "
                f"{_first_bad_line(self.workload_path, self.record_path) or exc}"
            ) from exc
        # per workload (structural hash): keys measured, and each key's lowest mean seconds
        self._by_workload: dict[str, tuple[set[str], dict[str, float]]] = {}

    def __len__(self) -> int:
        return len(self.ms_database)

    def __repr__(self) -> str:
        return f"TuningDatabase({str(self.path)!r}, records={len(self)})"

    # -- workloads -----------------------------------------------------------------------------
    def commit_workload(self, mod: IRModule) -> ms.database.Workload:
        """Register ``mod`` (an IRModule with a ``main`` PrimFunc) and return its workload."""
        try:
            return self.ms_database.commit_workload(mod)
        except Exception as exc:
            raise DatabaseError(f"cannot write workload to {self.workload_path}: {exc}") from exc

    def records(self, workload: ms.database.Workload) -> list[ms.database.TuningRecord]:
        """All records of ``workload``, failed ones included (fastest first, as JSONDatabase keeps them)."""
        out = []
        for rec in self.ms_database.get_all_tuning_records():
            if rec.workload.same_as(workload) or structural_equal(rec.workload.mod, workload.mod):
                out.append(rec)
        return out

    def measured_keys(self, workload: ms.database.Workload) -> set[str]:
        """Candidate keys of every record of ``workload`` (what a resumed run must not re-measure)."""
        return self._index(workload)[0]

    def results(self, workload: ms.database.Workload) -> list[tuple[str, float]]:
        """(key, mean run seconds) of every candidate of ``workload``, fastest first (ties in the
        order they were stored, as JSONDatabase orders them); a candidate stored twice has its
        lower mean; ``FAILED_RUN_SECS`` marks a failure. Kept up to date by :meth:`commit`, so a
        search can ask every round without reading every trace again."""
        return sorted(self._index(workload)[1].items(), key=lambda kv: kv[1])

    def _index(self, workload: ms.database.Workload) -> tuple[set[str], dict[str, float]]:
        """The keys and lowest mean seconds of ``workload``'s candidates, read from its records once."""
        h = str(structural_hash(workload.mod))
        if h not in self._by_workload:
            secs: dict[str, float] = {}
            for rec in self.records(workload):
                _lower(secs, candidate_key(rec.trace), rec.run_secs)
            self._by_workload[h] = (set(secs), secs)
        return self._by_workload[h]

    # -- records -------------------------------------------------------------------------------
    def commit(
        self,
        workload: ms.database.Workload,
        trace: Trace,
        run_secs: Sequence[float] | None,
        target: tvm.target.Target,
        args_info: Sequence[ms.arg_info.ArgInfo],
        key: str | None = None,
    ) -> ms.database.TuningRecord:
        """Append one record; ``run_secs=None`` marks a failure (stored as ``[1e10]``). ``key`` is
        the candidate's key when the caller has it (else it is computed from ``trace``)."""
        secs = [FAILED_RUN_SECS] if run_secs is None or len(run_secs) == 0 else [float(s) for s in run_secs]
        record = ms.database.TuningRecord(
            trace=trace,
            workload=workload,
            run_secs=[FloatImm("float32", s) for s in secs],
            target=target,
            args_info=list(args_info),
        )
        try:
            self.ms_database.commit_tuning_record(record)
        except Exception as exc:
            raise DatabaseError(f"cannot write tuning record to {self.record_path}: {exc}") from exc
        keys, secs_by_key = self._index(workload)
        key = candidate_key(trace) if key is None else key
        keys.add(key)
        _lower(secs_by_key, key, record.run_secs)
        return record

    def top_distinct(
        self, workload: ms.database.Workload, k: int, scan: int = 2
    ) -> list[ms.database.TuningRecord]:
        """The ``k`` fastest valid records of ``workload`` with distinct candidates, fastest
        first, found among its ``scan * k`` fastest (a candidate may be stored more than once)."""
        top: list[ms.database.TuningRecord] = []
        seen: set[str] = set()
        for rec in self.ms_database.get_top_k(workload, scan * k):
            key = candidate_key(rec.trace)
            if key not in seen:
                seen.add(key)
                top.append(rec)
            if len(top) == k:
                break
        return top

    def best(self, workload: ms.database.Workload) -> ms.database.TuningRecord | None:
        """The valid record with the lowest mean run time (TVM's ``get_top_k(workload, 1)``)."""
        top = self.ms_database.get_top_k(workload, 1)
        return top[0] if len(top) else None
