"""The tuning database: MetaSchedule's JSON format that TVM reads and compiles from, failed
candidates stored as MetaSchedule stores them, resume keys, and corrupt files reported by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tvm
from fastsearch import DatabaseError, DatabaseWarning
from fastsearch.database import (
    FAILED_RUN_SECS,
    RECORD_FILE,
    SUPERSEDE_MARGIN,
    WORKLOAD_FILE,
    TuningDatabase,
    candidate_key,
    is_failed,
    mean_run_secs,
    superseding_run_secs,
)
from fastsearch.ir.target import resolve_target
from fastsearch.measure.measurer import (
    MeasureConfig,
    Measurer,
    compare_outputs,
    random_arguments,
    run_function,
)
from fastsearch.search.sample import sample_candidates
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

TARGET = resolve_target(None)


@pytest.fixture(scope="module")
def gmm():
    return _normalize_mod(te_workload.create_te_workload("GMM", 0))  # (1, 128, 128, 128)


@pytest.fixture(scope="module")
def measured(gmm, tmp_path_factory):
    """Two fastsearch candidates and one the LLVM backend cannot build, measured and stored."""
    func = gmm["main"]
    cands = sample_candidates(func, TARGET, 2, seed=3)
    impossible = Schedule(gmm)
    loops = impossible.get_loops(impossible.get_sblock("Z"))
    impossible.bind(loops[1], "threadIdx.x")  # GPU thread binding on a CPU target
    schedules = [c.schedule for c in cands] + [impossible]
    args_info = ms.arg_info.ArgInfo.from_prim_func(func)
    with Measurer(TARGET, MeasureConfig(repeat=3)) as measurer:
        results = measurer.measure([s.mod for s in schedules], args_info)
        Measurer.release(results)
    work = tmp_path_factory.mktemp("db")
    db = TuningDatabase(work)
    workload = db.commit_workload(gmm)
    for sch, res in zip(schedules, results):
        db.commit(workload, sch.trace, res.run_secs if res.ok else None, TARGET, args_info)
    return work, schedules, results, [c.key for c in cands]


def test_measurer_reports_failures_and_goes_on(measured):
    _, _, results, _ = measured
    good, good2, bad = results
    assert good.ok and good2.ok
    assert len(good.run_secs) == 3
    assert 0 < good.min_us <= good.median_us
    assert not bad.ok and bad.run_secs is None
    assert "LocalBuilder" in bad.error  # the build error message is kept


def test_files_are_metaschedule_json_that_tvm_loads(measured, gmm):
    work, _, results, _ = measured
    assert (work / WORKLOAD_FILE).is_file() and (work / RECORD_FILE).is_file()
    db = ms.database.JSONDatabase(
        path_workload=str(work / WORKLOAD_FILE), path_tuning_record=str(work / RECORD_FILE)
    )
    assert len(db) == 3
    records = db.get_all_tuning_records()
    failed = [r for r in records if is_failed([float(s) for s in r.run_secs])]
    assert len(failed) == 1
    assert [float(s) for s in failed[0].run_secs] == [FAILED_RUN_SECS]  # MetaSchedule's stub
    workload = db.commit_workload(gmm)
    top = db.get_top_k(workload, 5)
    assert len(top) == 2  # TVM itself skips the failed record
    best = min((r for r in results if r.ok), key=lambda r: r.mean_us)
    assert float(top[0].run_secs[0]) == pytest.approx(best.run_secs[0], rel=1e-6)


def test_compile_tir_builds_a_correct_kernel_from_the_database(measured, gmm):
    work, _, _, _ = measured
    db = ms.database.JSONDatabase(work_dir=str(work))
    sch = ms.tir_integration.compile_tir(db, gmm["main"], TARGET)
    assert sch is not None
    lib = tvm.compile(sch.mod, target=TARGET)
    x, y, z = random_arguments(ms.arg_info.ArgInfo.from_prim_func(gmm["main"]), seed=1)
    out = run_function(lib, [x, y, z], tvm.cpu())
    assert compare_outputs([np.matmul(x, y)], [out[2]]) is None


def test_reload_keys_best_and_resume(measured, gmm):
    work, schedules, results, keys = measured
    db = TuningDatabase(work)
    workload = db.commit_workload(gmm)
    assert len(db.records(workload)) == 3
    stored = db.measured_keys(workload)
    assert set(keys) <= stored  # the sampler's keys come back from the stored traces
    assert candidate_key(schedules[2].trace) in stored
    assert len(stored) == 3
    best = db.best(workload)
    fastest = min((r for r in results if r.ok), key=lambda r: r.mean_us)
    assert float(best.run_secs[0]) == pytest.approx(fastest.run_secs[0], rel=1e-6)
    # the sampler never proposes a stored candidate again
    again = sample_candidates(gmm["main"], TARGET, 4, seed=3, exclude=stored)
    assert not {c.key for c in again} & stored


def test_results_kept_by_commits_equal_the_stored_records(measured, gmm, tmp_path):
    """The per-candidate results a search reads every round are kept up to date by commits, and
    equal what a fresh load of the files gives: fastest first, a candidate stored twice (a final
    round's winner) at its lower mean, failures at MetaSchedule's stub."""
    work, schedules, _, keys = measured
    db = TuningDatabase(_copy(work, tmp_path))
    workload = db.commit_workload(gmm)
    before = dict(db.results(workload))
    assert before[candidate_key(schedules[2].trace)] == FAILED_RUN_SECS
    args_info = ms.arg_info.ArgInfo.from_prim_func(gmm["main"])
    slower, faster = sorted(keys, key=before.__getitem__, reverse=True)
    i = keys.index(slower)
    lower = [before[faster] / 2] * 2  # stored again, now the fastest
    db.commit(workload, schedules[i].trace, lower, TARGET, args_info, slower)
    db.commit(workload, schedules[i].trace, [1.0], TARGET, args_info)  # a slower repeat changes nothing
    kept = db.results(workload)
    assert [k for k, _ in kept] == [slower, faster, candidate_key(schedules[2].trace)]
    assert kept[0][1] == pytest.approx(before[faster] / 2, rel=1e-6)
    reloaded = TuningDatabase(db.path)
    again = reloaded.results(reloaded.commit_workload(gmm))
    assert [k for k, _ in again] == [k for k, _ in kept]
    assert [v for _, v in again] == pytest.approx([v for _, v in kept], rel=1e-6)
    assert db.measured_keys(workload) == set(before)


@pytest.mark.parametrize("own_over_replaced", [0.5, 0.9998, 1.0, 1.077, 3.0])
def test_a_superseding_runner_up_ranks_first_and_is_never_stored_below_what_was_measured(
    measured, gmm, tmp_path, own_over_replaced
):
    """A final or model round's winner is stored again so that TVM's ``get_top_k`` ranks it
    above the record it replaces, which stays in the append-only file: at its own time when that
    is lower, else just under the replaced one (a 1024-cube matmul once read 634 GFLOP/s on a
    542 GFLOP/s machine when the replaced time was scaled by a side-by-side ratio)."""
    work, schedules, _, keys = measured
    db = TuningDatabase(_copy(work, tmp_path))
    workload = db.commit_workload(gmm)
    best = db.best(workload)
    replaced = mean_run_secs([float(s) for s in best.run_secs])
    loser = next(i for i, k in enumerate(keys) if k != candidate_key(best.trace))
    own = [replaced * own_over_replaced * f for f in (0.97, 1.0, 1.03)]
    secs = superseding_run_secs(own, replaced)
    mean = sum(secs) / len(secs)
    assert mean == pytest.approx(min(sum(own) / len(own), replaced * (1 - SUPERSEDE_MARGIN)), rel=1e-9)
    assert [s / secs[0] for s in secs] == pytest.approx([f / 0.97 for f in (0.97, 1.0, 1.03)])
    args_info = ms.arg_info.ArgInfo.from_prim_func(gmm["main"])
    db.commit(workload, schedules[loser].trace, secs, TARGET, args_info)
    for database in (db, TuningDatabase(db.path)):  # in memory, and read back from float32 JSON
        top = database.best(database.commit_workload(gmm))
        assert candidate_key(top.trace) == keys[loser]
        assert mean_run_secs([float(s) for s in top.run_secs]) < replaced
    with pytest.raises(ValueError):
        superseding_run_secs([FAILED_RUN_SECS], replaced)
    with pytest.raises(ValueError):
        superseding_run_secs(own, FAILED_RUN_SECS)


def _copy(work, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(work, dst)
    return dst


def test_corrupt_record_file_names_the_file(measured, tmp_path):
    work = _copy(measured[0], tmp_path)
    path = work / RECORD_FILE
    lines = path.read_text().splitlines()
    lines.insert(1, '[0, ["truncated')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatabaseError, match=str(path)):
        TuningDatabase(work)
    assert len(path.read_text().splitlines()) == 4  # nothing stored is touched


def test_corrupt_workload_file_names_the_file(measured, tmp_path):
    work = _copy(measured[0], tmp_path)
    (work / WORKLOAD_FILE).write_text("garbage{\n")
    with pytest.raises(DatabaseError, match=str(work / WORKLOAD_FILE)):
        TuningDatabase(work)


def test_record_of_a_missing_workload_is_corrupt(measured, tmp_path):
    work = _copy(measured[0], tmp_path)
    path = work / RECORD_FILE
    row = json.loads(path.read_text().splitlines()[0])
    row[0] = 7
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    with pytest.raises(DatabaseError, match="workload index 7"):
        TuningDatabase(work)


def test_torn_last_line_of_a_killed_run_is_set_aside(measured, gmm, tmp_path):
    work = _copy(measured[0], tmp_path)
    path = work / RECORD_FILE
    whole = path.read_text()
    last = whole.splitlines()[-1]
    path.write_text(whole + last[: len(last) // 2])  # killed in the middle of an append
    with pytest.warns(DatabaseWarning, match="torn last line 4"):
        db = TuningDatabase(work)
    assert len(db.repairs) == 1 and str(path) in db.repairs[0]  # reported, not only repaired
    assert len(db.records(db.commit_workload(gmm))) == 3
    assert path.read_text() == whole
    assert (work / (RECORD_FILE + ".torn")).read_text() == last[: len(last) // 2] + "\n"


def test_a_hanging_candidate_times_out_and_the_runner_goes_on(gmm):
    """An untuned 1024^3 matmul runs for seconds: past the run timeout it is a failure, and the
    runner's next candidate still runs."""
    slow = _normalize_mod(te_workload.create_te_workload("GMM", 3))
    config = MeasureConfig(run_timeout_s=0.5, min_repeat_ms=1, repeat=1)
    with Measurer(TARGET, config) as measurer:
        (hung,) = measurer.measure([slow], ms.arg_info.ArgInfo.from_prim_func(slow["main"]))
        (fine,) = measurer.measure([gmm], ms.arg_info.ArgInfo.from_prim_func(gmm["main"]))
        Measurer.release([hung, fine])
    assert not hung.ok and "Timeout" in hung.error
    assert fine.ok and fine.mean_us > 0


def test_flushed_measurements_time_every_call_alone_also_side_by_side(gmm):
    """With ``enable_cpu_cache_flush``, every repeat is one call after the flush (``repeat`` per
    candidate), and the final round's side-by-side timing runs the same way."""
    config = MeasureConfig(number=1, repeat=4, min_repeat_ms=0, enable_cpu_cache_flush=True)
    func = gmm["main"]
    cands = sample_candidates(func, TARGET, 2, seed=5)
    args_info = ms.arg_info.ArgInfo.from_prim_func(func)
    with Measurer(TARGET, config) as measurer:
        results = measurer.measure([c.schedule.mod for c in cands], args_info)
        assert all(r.ok and len(r.run_secs) == 4 for r in results)
        arrays = random_arguments(args_info, seed=0)
        rounds = measurer.side_by_side([r.artifact_path for r in results], arrays, rounds=2)
        Measurer.release(results)
    assert [len(r) for r in rounds] == [2, 2] and all(t > 0 for row in rounds for t in row)


def test_side_by_side_in_a_fresh_process_stops_the_kept_worker(gmm):
    """``fresh=True`` times the candidates in a worker process started for the call: the one kept
    until then is stopped and replaced (the final round's later processes)."""
    func = gmm["main"]
    cands = sample_candidates(func, TARGET, 2, seed=5)
    args_info = ms.arg_info.ArgInfo.from_prim_func(func)
    with Measurer(TARGET, MeasureConfig()) as measurer:
        results = measurer.measure([c.schedule.mod for c in cands], args_info)
        paths = [r.artifact_path for r in results]
        arrays = random_arguments(args_info, seed=0)
        kept = measurer.side_by_side(paths, arrays, rounds=2)
        first = measurer._isolated._proc.pid
        again = measurer.side_by_side(paths, arrays, rounds=2)
        assert measurer._isolated._proc.pid == first  # kept between calls
        fresh = measurer.side_by_side(paths, arrays, rounds=2, fresh=True)
        assert measurer._isolated._proc.pid != first
        Measurer.release(results)
    for rounds in (kept, again, fresh):
        assert [len(r) for r in rounds] == [2, 2] and all(t > 0 for row in rounds for t in row)
