"""fastsearch.tune end to end on a small GMM: a correct kernel, a database TVM compiles from,
resume without re-measuring, failed and wrong candidates recorded while the search goes on."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest
import tvm
from fastsearch import InvalidTarget, MeasurementError, UnsupportedWorkload
from fastsearch.database import FAILED_RUN_SECS, RECORD_FILE, SUPERSEDE_MARGIN, TuningDatabase, candidate_key
from fastsearch.ir.machine import SPEEDUP_ENV, machine_of
from fastsearch.ir.target import host_cpu, resolve_target
from fastsearch.measure.measurer import MeasureConfig
from fastsearch.search.sample import sample_candidates
from fastsearch.tuning.tune import TuneResult, tune
from tvm import te
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from workloads import matmul

TARGET = resolve_target(None)
#: Without the final round, which may store a runner-up again (tested on its own below).
NO_FINAL = MeasureConfig(final_candidates=0)


def gmm():
    return te_workload.create_te_workload("GMM", 0)  # (1, 128, 128, 128)


def _check_gmm(result: TuneResult, name: str = "main") -> None:
    lib = result.compile()
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (1, 128, 128)).astype("float32")
    y = rng.uniform(-1, 1, (1, 128, 128)).astype("float32")
    args = [tvm.runtime.tensor(a) for a in (x, y, np.zeros((1, 128, 128), "float32"))]
    lib[name](*args)
    np.testing.assert_allclose(args[2].numpy(), np.matmul(x, y), rtol=1e-4, atol=1e-4)


def _stored(work_dir) -> list[list]:
    return [json.loads(line) for line in (work_dir / RECORD_FILE).read_text().splitlines() if line]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("gmm")
    return work, tune(gmm(), TARGET, trials=8, seed=0, work_dir=work, progress=False, measure=NO_FINAL)


def test_tune_finds_a_correct_kernel(first_run):
    work, result = first_run
    assert result.trials_measured == 8
    assert len(result.history) == 8
    assert result.best_latency_us is not None and result.best_latency_us > 0
    ok = [h.latency_us for h in result.history if h.ok]
    assert result.best_latency_us == pytest.approx(min(ok))
    assert result.history[-1].best_us == pytest.approx(result.best_latency_us)
    curve = [h.best_us for h in result.history if h.best_us is not None]
    assert curve == sorted(curve, reverse=True)  # a tuning curve only goes down
    assert result.best_trace is not None
    assert result.work_dir == work and result.database.path == work
    assert {"search", "build", "run", "model", "total"} <= set(result.timing)
    assert result.timing["build"] > 0 and result.timing["run"] > 0
    # The best was confirmed by more runs, each on fresh arguments: its timing pools them all.
    config = MeasureConfig()
    best = result.database.best(result.database.commit_workload(_normalize_mod(gmm())))
    assert len(best.run_secs) == config.repeat * (1 + config.confirm_runs)
    _check_gmm(result)


def test_database_is_what_tvm_compiles_from(first_run):
    work, result = first_run
    db = ms.database.JSONDatabase(work_dir=str(work))
    assert len(db) == 8
    sch = ms.tir_integration.compile_tir(db, gmm(), TARGET)
    assert sch is not None
    assert candidate_key(sch.trace) == candidate_key(result.best_trace)


def test_resume_continues_without_measuring_again(first_run, tmp_path):
    work, _ = first_run
    copy = tmp_path / "resumed"
    copy.mkdir()
    for f in work.iterdir():
        copy.joinpath(f.name).write_bytes(f.read_bytes())
    again = tune(gmm(), TARGET, trials=12, seed=0, work_dir=copy, progress=False, measure=NO_FINAL)
    assert again.trials_measured == 4  # the 8 stored count toward the 12
    rows = _stored(copy)
    assert len(rows) == 12
    db = TuningDatabase(copy)
    keys = [candidate_key(r.trace) for r in db.records(db.commit_workload(_normalize_mod(gmm())))]
    assert len(set(keys)) == 12  # nothing measured twice
    done = tune(gmm(), TARGET, trials=12, seed=0, work_dir=copy, progress=False)
    assert done.trials_measured == 0 and len(_stored(copy)) == 12
    assert done.best_latency_us == pytest.approx(again.best_latency_us)


def _impossible_trace(func):
    """A schedule the LLVM backend cannot build (GPU thread binding on a CPU target)."""
    sch = Schedule(_normalize_mod(func))
    loops = sch.get_loops(sch.get_sblock("Z"))
    sch.bind(loops[1], "threadIdx.x")
    return sch.trace


def _imprecise_trace(func):
    """A schedule that builds and runs fast enough but accumulates in float16: a wrong answer."""
    sch = Schedule(_normalize_mod(func))
    block = sch.get_sblock("Z")
    sch.cache_write(block, 0, "global")
    sch.unsafe_set_dtype(block, 0, "float16")
    i = sch.get_loops(block)[1]
    sch.parallel(i)
    return sch.trace


def test_failed_and_wrong_candidates_are_recorded_and_the_search_goes_on(tmp_path, capfd):
    func = gmm()
    rounds: list[int] = []

    def sampler(f, target, n, seed, exclude):
        rounds.append(n)
        if len(rounds) == 1:
            return [_impossible_trace(f), _imprecise_trace(f)]
        return sample_candidates(f, target, n, seed, exclude)

    result = tune(func, TARGET, trials=5, work_dir=tmp_path, strategy=sampler, batch_size=3, measure=NO_FINAL)
    assert result.trials_measured == 5
    first, second = result.history[0], result.history[1]
    assert first.error is not None and "LocalBuilder" in first.error
    assert second.error is not None and second.error.startswith("wrong answer")
    assert result.failed >= 2
    rows = _stored(tmp_path)
    assert len(rows) == 5
    assert rows[0][1][1] == [FAILED_RUN_SECS] and rows[1][1][1] == [FAILED_RUN_SECS]
    assert result.best_latency_us is not None
    _check_gmm(result)
    err = capfd.readouterr().err
    assert "5/5 trials" in err  # the progress bar


def test_no_candidate_measurable_raises(tmp_path):
    with pytest.raises(MeasurementError, match="none of the 1 candidates"):
        tune(
            gmm(),
            TARGET,
            trials=1,
            work_dir=tmp_path,
            progress=False,
            strategy=lambda f, t, n, s, e: [_impossible_trace(f)],
        )


def test_kernels_are_measured_on_the_targets_cores(tmp_path, monkeypatch):
    """The processes a run starts inherit TVM_NUM_THREADS = the target's num-cores (the user's
    setting wins), the cost model assumes what they run, and the environment is restored after
    the run, also one that fails (tests/test_threads.py times a worker's threads)."""
    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv(SPEEDUP_ENV, raising=False)
    two = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})
    seen = set()

    def sampler(f, target, n, seed, exclude):
        seen.add((os.environ.get("TVM_NUM_THREADS"), machine_of(target).parallel_speedup))
        return sample_candidates(f, target, n, seed, exclude)

    def run(where: str, strategy=sampler) -> TuneResult:
        return tune(
            gmm(), two, trials=2, batch_size=2, work_dir=tmp_path / where, strategy=strategy,
            progress=False, measure=NO_FINAL, verify=False,
        )  # fmt: skip

    run("default")
    assert seen == {("2", None)}  # the runtime runs both cores: linear speedup
    assert "TVM_NUM_THREADS" not in os.environ
    seen.clear()
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    run("user")
    assert seen == {("1", 1.0)}
    assert os.environ["TVM_NUM_THREADS"] == "1"
    monkeypatch.delenv("TVM_NUM_THREADS")
    with pytest.raises(MeasurementError):
        run("failing", strategy=lambda f, t, n, s, e: [_impossible_trace(f)])
    assert "TVM_NUM_THREADS" not in os.environ


def test_irmodule_of_two_primfuncs(tmp_path):
    a = te.placeholder((64, 64), name="A")
    b = te.compute((64, 64), lambda i, j: a[i, j] * 2.0 + 1.0, name="B")
    scale = te.create_prim_func([a, b]).with_attr("global_symbol", "scale")
    mod = tvm.IRModule({"gemm": gmm().with_attr("global_symbol", "gemm"), "scale": scale})
    result = tune(mod, TARGET, trials=4, work_dir=tmp_path, progress=False)
    assert set(result.tasks) == {"gemm", "scale"}
    assert [t.trials_measured for t in result.tasks.values()] == [2, 2]
    assert result.best_latency_us == pytest.approx(sum(t.best_latency_us for t in result.tasks.values()))
    _check_gmm(result, "gemm")
    lib = result.compile()
    x = np.random.default_rng(0).uniform(size=(64, 64)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((64, 64), "float32"))
    lib["scale"](tvm.runtime.tensor(x), out)
    np.testing.assert_allclose(out.numpy(), x * 2 + 1, rtol=1e-6)


def test_bad_inputs_raise_typed_errors(tmp_path):
    with pytest.raises(InvalidTarget, match="nope"):
        tune(gmm(), {"kind": "nope"}, trials=1, work_dir=tmp_path)
    with pytest.raises(UnsupportedWorkload):
        tune("not a function", trials=1, work_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strategy"):
        tune(gmm(), TARGET, trials=1, work_dir=tmp_path, strategy="no-such-strategy")
    n = tvm.tirx.Var("n", "int32")
    a = te.placeholder((n, 16), name="A")
    dynamic = te.create_prim_func([a, te.compute((n, 16), lambda i, j: a[i, j] * 2.0, name="B")])
    with pytest.raises(UnsupportedWorkload, match="dynamic shape"):
        tune(dynamic, TARGET, trials=1, work_dir=tmp_path / "dynamic")
    assert not (tmp_path / "dynamic").exists()  # rejected before anything is written


class _Recorder:
    """A strategy with feedback: draws fastsearch's candidates and records what tune() reports."""

    def __init__(self) -> None:
        self.updates: list[list[tuple[str, float | None]]] = []

    def __call__(self, func, target, n, seed, exclude):
        return sample_candidates(func, target, n, seed, exclude)

    def update(self, func, measured):
        self.updates.append(list(measured))


def test_strategy_feedback_and_warm_start(tmp_path):
    def run(strategy: _Recorder, trials: int):
        return tune(
            gmm(),
            TARGET,
            trials=trials,
            work_dir=tmp_path,
            strategy=strategy,
            batch_size=2,
            progress=False,
            measure=NO_FINAL,
        )

    first = _Recorder()
    result = run(first, 4)
    assert [len(u) for u in first.updates] == [2, 2]
    reported = [item for u in first.updates for item in u]
    db = TuningDatabase(tmp_path)
    stored = db.records(db.commit_workload(_normalize_mod(gmm())))
    assert sorted(k for k, _ in reported) == sorted(candidate_key(r.trace) for r in stored)
    for (_, secs), h in zip(reported, result.history):
        assert secs is not None and secs * 1e6 == pytest.approx(h.latency_us)

    second = _Recorder()
    run(second, 6)
    assert sorted(second.updates[0]) == sorted(reported)  # warm start with the stored records
    assert [len(u) for u in second.updates] == [4, 2]
    assert result.timing["model"] >= 0


def _naive_trace(func):
    """The function's own loops: one thread, no vectorization (a trace TVM keeps needs an
    instruction)."""
    sch = Schedule(_normalize_mod(func))
    sch.get_sblock("Z")
    return sch.trace


def test_final_round_replaces_a_lucky_best(tmp_path):
    """A best whose measurement was lucky loses the final round to a runner-up timed side by
    side with it, which then is what TVM compiles from the database.

    The luck is written into the database: the naive loops' record says 1 us."""
    func = gmm()
    naive = _naive_trace(func)

    def sampler(f, target, n, seed, exclude):
        return [naive] + sample_candidates(f, target, n - 1, seed, exclude)

    tune(func, TARGET, trials=3, work_dir=tmp_path, strategy=sampler, progress=False, measure=NO_FINAL)
    rows = _stored(tmp_path)
    db = TuningDatabase(tmp_path)
    workload = db.commit_workload(_normalize_mod(func))
    keys = [candidate_key(ms.database.TuningRecord.from_json(r[1], workload).trace) for r in rows]
    lucky = keys.index(candidate_key(naive))
    rows[lucky][1][1] = [1e-6]
    (tmp_path / RECORD_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))

    result = tune(func, TARGET, trials=5, work_dir=tmp_path, progress=False)
    assert result.trials_measured == 2
    final = result.tasks["main"].final
    assert final is not None and final.rounds == MeasureConfig().final_rounds
    assert final.processes == MeasureConfig().final_processes == 2  # the kept worker, then a fresh one
    assert len(final.ratios) == MeasureConfig().final_candidates - 1 and final.chosen is not None
    assert final.ratios[final.chosen] == min(final.ratios) < 0.5  # against the naive loops
    assert "final" in result.timing and len(result.history) == 2  # no trial
    # Its own side-by-side time is above the lucky 1 us, so the winner is stored just under the
    # lucky record (never below both): TVM's pick too.
    assert len(final.times_us) == MeasureConfig().final_candidates
    assert final.times_us[final.chosen + 1] < final.times_us[0]
    assert final.times_us[final.chosen + 1] > result.best_latency_us
    assert result.best_latency_us == pytest.approx(1.0 - SUPERSEDE_MARGIN, rel=1e-6)
    chosen = ms.tir_integration.compile_tir(ms.database.JSONDatabase(work_dir=str(tmp_path)), func, TARGET)
    assert candidate_key(chosen.trace) == candidate_key(result.best_trace) != candidate_key(naive)
    _check_gmm(result)
    # A resumed run counts candidates, not records: the stored five are all of its trials.
    again = tune(func, TARGET, trials=5, work_dir=tmp_path, progress=False)
    assert again.trials_measured == 0 and len(_stored(tmp_path)) == 6


def test_final_round_off(tmp_path):
    result = tune(gmm(), TARGET, trials=4, work_dir=tmp_path, progress=False, measure=NO_FINAL)
    assert result.tasks["main"].final is None and "final" not in result.timing
    assert len(_stored(tmp_path)) == 4


def test_two_workloads_of_one_name_keep_their_own_search_state(tmp_path):
    """Two PrimFuncs both called ``main`` tuned in one work directory: each task's genomes are
    kept under its own structural hash, and neither run reads the other's."""
    first = tune(gmm(), TARGET, trials=2, work_dir=tmp_path, progress=False, measure=NO_FINAL)
    second = tune(matmul(32), TARGET, trials=2, work_dir=tmp_path, progress=False, measure=NO_FINAL)
    assert first.trials_measured == second.trials_measured == 2
    files = sorted(tmp_path.glob("fastsearch_search.main.*.genomes.jsonl"))
    assert len(files) == 2
    keys = [{json.loads(line)["key"] for line in f.read_text().splitlines()} for f in files]
    assert keys[0] and keys[1] and not keys[0] & keys[1]


def test_build_stages_are_recorded(tmp_path):
    """Each measured candidate carries the seconds its build spent in TVM's passes, in code
    generation and in export (issue 28: build time as a quantity the search can use)."""
    from fastsearch.measure.measurer import read_build_stages

    result = tune(gmm(), TARGET, trials=3, work_dir=tmp_path, progress=False, measure=NO_FINAL)
    built = [h for h in result.history if h.ok]
    assert built
    for h in built:
        assert h.build_passes_s and h.build_codegen_s and h.build_export_s, h
        assert h.build_s == pytest.approx(h.build_passes_s + h.build_codegen_s + h.build_export_s)
    with open(result.write_history(tmp_path / "curve.csv")) as f:
        rows = list(csv.DictReader(f))
    assert float(rows[0]["build_codegen_s"]) == pytest.approx(result.history[0].build_codegen_s)
    assert read_build_stages(str(tmp_path / "no-such-artifact")) is None
    # The loop hands them to the search, which keeps them beside the database for its
    # build-time model (a resumed run reads them back).
    (kept,) = tmp_path.glob("fastsearch_search.*.builds.jsonl")
    builds = [json.loads(line)["build_s"] for line in kept.read_text().splitlines()]
    assert sorted(builds) == pytest.approx(sorted(h.build_s for h in built), abs=1e-3)


def test_cold_weights(tmp_path, monkeypatch):
    """A task whose weights outgrow twice a core's L2 is timed with them flushed, one call per
    repeat (``MeasureConfig.cold_weights``): by default only in a whole model."""
    from fastsearch.measure import measurer

    info = ms.arg_info.ArgInfo.from_prim_func(gmm())  # 3 x 64 KiB: input, weight, output
    monkeypatch.setattr(measurer, "l2_cache_bytes", lambda: 30_000)
    assert MeasureConfig().times_cold(info, whole_model=True)
    assert not MeasureConfig().times_cold(info, whole_model=False)
    assert MeasureConfig(cold_weights=True).times_cold(info, whole_model=False)
    assert not MeasureConfig(cold_weights=False).times_cold(info, whole_model=True)
    assert not MeasureConfig(enable_cpu_cache_flush=True).times_cold(info, whole_model=True)
    monkeypatch.setattr(measurer, "l2_cache_bytes", lambda: 40_000)  # the output is not counted
    assert not MeasureConfig().times_cold(info, whole_model=True)

    monkeypatch.setattr(measurer, "l2_cache_bytes", lambda: 1024)
    config = MeasureConfig(cold_weights=True, cold_repeat=4, final_candidates=2, final_rounds=2)
    result = tune(gmm(), TARGET, trials=4, work_dir=tmp_path, progress=False, measure=config)
    assert result.tasks["main"].cold
    # Each record holds one time per cold call: 4, or 4 more per confirming run of a best; a
    # runner-up the final round (timed cold too) makes the best is stored with one per round.
    counts = {len(row[1][1]) for row in _stored(tmp_path)}
    allowed = {4 * (1 + k) for k in range(config.confirm_runs + 1)} | {config.final_rounds}
    assert counts <= allowed and 4 in counts, counts
    _check_gmm(result)


def test_l2_cache_size_is_read():
    from fastsearch.ir.machine import l2_cache_bytes

    assert 64 * 1024 <= l2_cache_bytes() <= 64 * 1024 * 1024
