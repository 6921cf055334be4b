"""Faults during a run: candidates that cannot be replayed or built, that kill or hang their build
or run worker, or that compute a wrong answer are stored as failed, counted by kind, and the run
completes with the good candidates measured and the best one correct."""

from __future__ import annotations

import json

import cloudpickle
import faults
import numpy as np
import pytest
import tvm
from fastsearch.cli.main import summary
from fastsearch.database import FAILED_RUN_SECS, RECORD_FILE
from fastsearch.ir.target import resolve_target
from fastsearch.measure.measurer import CandidateFault, MeasureConfig, Measurer, random_arguments
from fastsearch.search.sample import sample_candidates
from fastsearch.tuning.loop import APPLY_FAILURES_FILE
from fastsearch.tuning.tune import tune
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from workloads import matmul, small

TARGET = resolve_target({"kind": "llvm", "num-cores": 1})

# The build workers are fresh processes that cannot import this test directory: ship the module.
cloudpickle.register_pickle_by_value(faults)


def _unbuildable(mod):
    """GPU thread binding on a CPU target: LLVM refuses to build it."""
    sch = Schedule(mod)
    sch.bind(sch.get_loops(sch.get_sblock("Z"))[1], "threadIdx.x")
    return sch.trace


def _foreign():
    """A trace of another function (its block is "C"): it cannot be replayed on the GMM."""
    sch = Schedule(_normalize_mod(matmul(16)))
    sch.parallel(sch.get_loops(sch.get_sblock("C"))[0])
    return sch.trace


def test_faulty_candidates_are_recorded_by_kind_and_the_run_completes(tmp_path):
    func = small("GMM")  # (1, 16, 16, 16)
    mod = _normalize_mod(func)
    bad = [_foreign(), _unbuildable(mod)] + [faults.faulty_trace(mod, kind) for kind in faults.KINDS]
    calls: list[int] = []

    def sampler(f, target, n, seed, exclude):
        calls.append(n)
        good = sample_candidates(f, target, n - len(bad) if len(calls) == 1 else n, seed, exclude)
        return (bad if len(calls) == 1 else []) + list(good)

    config = MeasureConfig(
        repeat=1, min_repeat_ms=1, build_workers=2, build_timeout_s=10, run_timeout_s=4,
        build_func=faults.faulty_build, final_candidates=0,  # the best stays the fastest trial
    )  # fmt: skip
    result = tune(
        func, TARGET, trials=10, work_dir=tmp_path, strategy=sampler, batch_size=10, measure=config,
        progress=False,
    )  # fmt: skip

    assert result.trials_measured == 10
    assert result.failures == {
        "apply error": 1,
        "build error": 1,
        "build timeout": 1,
        "build crash": 1,
        "run timeout": 1,
        "run crash": 1,
        "wrong answer": 1,
    }
    assert result.failed == 7
    kinds = [h.failure for h in result.history]
    assert kinds[:7] == ["apply error", "build error", "build crash", "build timeout"] + [
        "run crash",
        "run timeout",
        "wrong answer",
    ]
    good = result.history[7:]
    assert all(h.ok and h.latency_us and h.latency_us > 0 for h in good)  # measured after the faults
    # the database keeps float32 seconds: equal up to rounding
    assert result.best_latency_us == pytest.approx(min(h.latency_us for h in good), rel=1e-6)

    rows = [json.loads(line) for line in (tmp_path / RECORD_FILE).read_text().splitlines()]
    assert len(rows) == 9  # the unreplayable trace goes to the side file instead
    assert sum(r[1][1] == [FAILED_RUN_SECS] for r in rows) == 6
    assert len((tmp_path / APPLY_FAILURES_FILE).read_text().splitlines()) == 1

    text = summary("GMM", (1, 16, 16, 16), result, None)
    assert "failed       apply error 1, build error 1, build timeout 1, build crash 1" in text
    assert "run timeout 1, run crash 1, wrong answer 1" in text
    # Each kind's first error is kept and printed, naming its task.
    assert set(result.failure_examples) == set(result.failures)
    task_name = next(iter(result.tasks))
    assert all(e.startswith(f"{task_name}: ") for e in result.failure_examples.values())
    assert "values differ" in result.failure_examples["wrong answer"]
    assert "\n  wrong answer: " in text

    lib = result.compile()  # the best record is a good candidate, and correct
    rng = np.random.default_rng(3)
    x, y = (rng.uniform(-1, 1, (1, 16, 16)).astype("float32") for _ in range(2))
    z = tvm.runtime.tensor(np.zeros((1, 16, 16), "float32"))
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y), z)
    np.testing.assert_allclose(z.numpy(), np.matmul(x, y), rtol=1e-5, atol=1e-5)


def test_a_candidate_crashing_or_hanging_while_checked_spares_the_tuner(tmp_path):
    """The output check runs a candidate on other inputs than the runner did; a crash or hang
    there kills only the check's worker process, which the next check restarts."""
    mod = _normalize_mod(small("GMM"))
    arrays = random_arguments(ms.arg_info.ArgInfo.from_prim_func(mod["main"]), seed=5)
    paths = {}
    for kind in ("run crash", "run hang", "good"):
        built = mod if kind == "good" else faults.fault_module(mod, kind)
        paths[kind] = str(tmp_path / f"{kind.replace(' ', '_')}.so")
        tvm.compile(built, target=TARGET).export_library(paths[kind])
    with Measurer(TARGET, MeasureConfig(run_timeout_s=2)) as measurer:
        with pytest.raises(CandidateFault) as crash:
            measurer.run_isolated(paths["run crash"], arrays)
        with pytest.raises(CandidateFault) as hang:
            measurer.run_isolated(paths["run hang"], arrays)
        out = measurer.run_isolated(paths["good"], arrays)
    assert (crash.value.kind, hang.value.kind) == ("run crash", "run timeout")
    x, y, _ = arrays
    np.testing.assert_allclose(out[2], np.matmul(x, y), rtol=1e-5, atol=1e-5)
