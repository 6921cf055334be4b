"""The build pool: worker processes kept across batches, replaced after ``max_uses`` builds or a
failure, and builds that fail the way MetaSchedule's builder reports them."""

from __future__ import annotations

import os
import time

import cloudpickle
import faults
import pytest
import tvm
from fastsearch.ir.target import resolve_target
from fastsearch.measure.builder import BuildPool
from fastsearch.measure.measurer import (
    BUILD_TIMEOUT_AFTER,
    MeasureConfig,
    Measurer,
    _failure_kind,
    _remove_artifact,
    build_module,
    export_module,
)
from tvm.s_tir import Schedule
from tvm.script import tirx as T

cloudpickle.register_pickle_by_value(faults)


@T.prim_func(s_tir=True)
def _add_one(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    for i in range(64):
        with T.sblock("b"):
            vi = T.axis.spatial(64, i)
            b[vi] = a[vi] + T.float32(1)


def _export_with_pid(mod: tvm.runtime.Module) -> str:
    """Export, and say which process built it: ``<artifact>|<pid>``."""
    return f"{export_module(mod)}|{os.getpid()}"


def _with_fault(mod: tvm.IRModule, kind: str) -> tvm.IRModule:
    sch = Schedule(mod)
    sch.annotate(sch.get_sblock("b"), faults.FAULT, kind)
    return sch.mod


def _mods(n: int) -> list[tvm.IRModule]:
    return [tvm.IRModule({"main": _add_one}) for _ in range(n)]


def _pids(pool: BuildPool, n: int) -> set[int]:
    out = pool.build(_mods(n), resolve_target())
    assert all(o.error_msg is None and o.artifact_path for o in out), [o.error_msg for o in out]
    for o in out:
        _remove_artifact(o.artifact_path.split("|")[0])
    return {int(o.artifact_path.split("|")[1]) for o in out}


def test_workers_outlive_a_batch_until_max_uses():
    with BuildPool(1, 60.0, f_build=build_module, f_export=_export_with_pid, max_uses=3) as pool:
        (first,) = _pids(pool, 2)
        assert first != os.getpid()
        # The same process builds the next batch: no process starts between them.
        assert _pids(pool, 1) == {first}
        # A worker that built max_uses candidates is replaced between batches.
        (later,) = _pids(pool, 2)
        assert later != first
        assert pool.started == 2
    with BuildPool(2, 60.0, f_build=build_module, f_export=_export_with_pid) as pool:
        assert len(_pids(pool, 6) | _pids(pool, 6)) <= 2


def test_a_failed_build_says_how_and_the_pool_goes_on():
    mods = _mods(3)
    mods[1] = _with_fault(mods[1], "build crash")
    with BuildPool(2, 60.0, f_build=faults.faulty_build, f_export=export_module) as pool:
        out = pool.build(mods, resolve_target())
        assert [o.error_msg is None for o in out] == [True, False, True]
        assert _failure_kind("build", out[1].error_msg or "") == "build crash"
        again = pool.build(_mods(2), resolve_target())
        assert all(o.error_msg is None for o in again)
        for o in out + again:
            _remove_artifact(o.artifact_path)


def test_a_hung_build_times_out():
    mods = [_with_fault(_mods(1)[0], "build hang")]
    with BuildPool(1, 3.0, f_build=faults.faulty_build, f_export=export_module) as pool:
        (out,) = pool.build(mods, resolve_target())
        assert _failure_kind("build", out.error_msg or "") == "build timeout"
        # A batch's own limit replaces the pool's.
        t0 = time.perf_counter()
        (out,) = pool.build(mods, resolve_target(), timeout_s=1.0)
        assert _failure_kind("build", out.error_msg or "") == "build timeout"
        assert "after 1.0 seconds" in (out.error_msg or "")
        assert out.killed_after_s == 1.0  # the build needed at least that long
        assert time.perf_counter() - t0 < 2.9
        # A limit that follows the builds finished before: the hang, started after two quick
        # builds, is stopped at the limit they set.
        seen: list[list[float]] = []

        def limit(done: list[float]) -> float:
            seen.append(list(done))
            return 1.0 if len(done) >= 2 else 60.0

        out = pool.build(_mods(2) + mods, resolve_target(), timeout_s=limit)
        assert [o.error_msg is None for o in out] == [True, True, False]
        assert [o.killed_after_s for o in out] == [None, None, 1.0]
        assert _failure_kind("build", out[2].error_msg or "") == "build timeout"
        assert [len(d) for d in seen] == [0, 1, 2]
        for o in out[:2]:
            _remove_artifact(o.artifact_path)
        (ok,) = pool.build(_mods(1), resolve_target())
        assert ok.error_msg is None
        _remove_artifact(ok.artifact_path)


def test_a_measurer_builds_and_times_in_its_kept_workers():
    with Measurer(resolve_target(), MeasureConfig(repeat=1, min_repeat_ms=1, build_workers=2)) as m:
        info = list(tvm.s_tir.meta_schedule.arg_info.ArgInfo.from_prim_func(_add_one))
        for _ in range(2):
            (res,) = m.measure(_mods(1), info)
            assert res.ok and res.run_secs, res.error
            Measurer.release([res])
        assert m.builder.started == 2  # both batches on the workers started with the measurer


def test_a_measurer_reports_how_long_a_stopped_build_ran():
    """A build stopped at its limit is a failure that still says it took at least that long,
    which the tuning loop hands the build-time model with the task's other builds."""
    config = MeasureConfig(repeat=1, min_repeat_ms=1, build_workers=1, build_timeout_s=1.0)
    with Measurer(resolve_target(), config, f_build=faults.faulty_build) as m:
        info = list(tvm.s_tir.meta_schedule.arg_info.ArgInfo.from_prim_func(_add_one))
        hung, fine = m.measure([_with_fault(_mods(1)[0], "build hang"), _mods(1)[0]], info)
        assert hung.failure == "build timeout" and hung.build_killed_s == 1.0
        assert fine.ok and fine.build_killed_s is None
        Measurer.release([hung, fine])


def test_a_pool_needs_a_worker():
    with pytest.raises(ValueError, match="at least one worker"):
        BuildPool(0, 10.0)


def test_a_task_build_timeout_follows_its_typical_build():
    config = MeasureConfig(build_timeout_s=60.0)
    assert config.build_timeout_for([0.1] * (BUILD_TIMEOUT_AFTER - 1)) == 60.0  # too few builds yet
    assert config.build_timeout_for([0.1] * BUILD_TIMEOUT_AFTER) == 10.0  # the floor
    assert config.build_timeout_for([0.1] * 7 + [30.0] * 2) == 10.0  # not a mean
    # TBG:0's first batch before its one pathological build: a median of 0.69 s would allow
    # 27.5 s; the lower quartile (0.21 s) stops it at the floor
    first_batch = [0.17, 0.21, 0.25, 1.13, 1.20, 1.72, 0.12, 6.05]
    assert config.build_timeout_for(first_batch) == 10.0
    assert config.build_timeout_for([0.5, 0.5, 1.0] + [2.0] * 5) == 40.0  # the lower quartile, 1.0 s
    assert config.build_timeout_for([1.0] * BUILD_TIMEOUT_AFTER) == 40.0
    assert config.build_timeout_for([5.0] * BUILD_TIMEOUT_AFTER) == 60.0  # never above build_timeout_s
