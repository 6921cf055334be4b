"""Warm starts: records of earlier databases (fastsearch's and MetaSchedule's) start a new task.

Small shapes and few trials: these check what the warm start does (genomes refitted to the new
shape and measured first, a model trained on the records, same-workload traces re-measured,
clear errors), not how much it saves; benches/warm_start.py measures that.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from fastsearch import _core, tune
from fastsearch.database import candidate_key
from fastsearch.errors import DatabaseError
from fastsearch.ir.tir_import import program_json
from fastsearch.measure.measurer import MeasureConfig
from fastsearch.search.warm_start import SEED_SHARE, WarmStart
from test_dropin import TARGET
from test_dropin import tune as tune_tir
from workloads import matmul, small

FAST = MeasureConfig(repeat=2, min_repeat_ms=5, build_workers=1)


def _genome_tiles(genome: str) -> dict:
    return json.loads(genome)["tiles"]


def test_transferred_genomes_fit_the_new_shape_and_replay_in_tvm():
    src, dst = matmul(48), matmul(40)
    genomes = [
        g for _, g in _core.Program(program_json(src)).sample_genomes(_core.Target(2, vector_bytes=64), 40, 3)
    ]
    moved = _core.Program(program_json(dst)).transfer_genomes(genomes)
    assert all(m is not None for m in moved)
    for (key, genome), old in zip(moved, genomes):
        for loops, old_loops in zip(_genome_tiles(genome).values(), _genome_tiles(old).values()):
            # i, j and k are 40 long now: every tiling is a perfect one of 40
            assert [int(np.prod(f)) for f in loops] == [40] * len(loops)
            assert [len(f) for f in loops] == [len(f) for f in old_loops]
        assert json.loads(genome)["rules"] == json.loads(old)["rules"]
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": dst}))
        tvm.s_tir.Trace.apply_json_to_schedule(json.loads(key), sch)  # TVM accepts it


def test_genomes_of_another_operator_do_not_transfer():
    genomes = [
        g
        for _, g in _core.Program(program_json(matmul(32))).sample_genomes(
            _core.Target(2, vector_bytes=64), 10, 0
        )
    ]
    assert _core.Program(program_json(small("DEP"))).transfer_genomes(genomes) == [None] * 10
    assert _core.Program(program_json(matmul(16))).transfer_genomes(["{not a genome"]) == [None]


def test_warm_run_measures_refitted_seeds_first_and_is_correct(tmp_path):
    source = tune(matmul(48), TARGET, trials=8, work_dir=tmp_path / "src", measure=FAST, progress=False)
    warm = WarmStart(tmp_path / "src")
    assert warm.num_records == 8 and len(warm.sources) == 1
    dst = matmul(40)
    expected = _core.Program(program_json(dst)).transfer_genomes(
        [warm.sources[0].genomes[k] for k, s in warm.sources[0].valid]
    )
    seeds = [key for key, _ in filter(None, expected)]
    assert seeds, "the source run's valid candidates carry over"

    result = tune(
        dst,
        TARGET,
        trials=8,
        batch_size=4,
        work_dir=tmp_path / "dst",
        measure=FAST,
        progress=False,
        warm_start=warm,
    )
    assert result.warm_start is warm
    # The first batch opens with the best source candidates, refitted (a share of the batch).
    n_seeds = max(1, int(4 * SEED_SHARE))
    first = [candidate_key(r.trace) for r in _records_in_order(result)][:n_seeds]
    assert first == seeds[:n_seeds]
    # The search's model trained on the source's records from the first round on.
    assert warm.sources[0].genomes and result.tasks["main"].trials_measured == 8
    assert result.best_latency_us is not None and source.best_latency_us is not None
    a, b = (np.random.default_rng(0).uniform(-1, 1, (40, 40)).astype("float32") for _ in range(2))
    out = tvm.runtime.tensor(np.zeros((40, 40), "float32"))
    result.compile()["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def _records_in_order(result) -> list:
    lines = (result.work_dir / "database_tuning_record.json").read_text().splitlines()
    wl = result.database.commit_workload(result.tasks["main"].mod)
    return [
        tvm.s_tir.meta_schedule.database.TuningRecord.from_json(json.loads(line)[1], wl)
        for line in lines
        if line
    ]


def test_metaschedule_database_trains_the_model_and_seeds_its_own_workload(tmp_path):
    func = matmul(32)
    tune_tir(func, tmp_path / "ms", 8)
    warm = WarmStart(tmp_path / "ms")
    assert warm.num_records == 8
    program = _core.Program(program_json(func))
    task = warm.for_task(func, program)
    # MetaSchedule keeps no genomes: nothing to refit, but the same workload's best traces are
    # measured as they are.
    assert task.seeds == [] and 1 <= len(task.same_workload) <= 4
    assert task.train({})
    keys = [k for k, _ in program.sample_genomes(_core.Target(2, vector_bytes=64), 16, 5)]
    predicted = task.predict(keys)
    assert predicted.shape == (16,) and np.isfinite(predicted).all()

    result = tune(
        func, TARGET, trials=4, work_dir=tmp_path / "fs", measure=FAST, progress=False, warm_start=warm
    )
    measured = {candidate_key(r.trace) for r in _records_in_order(result)}
    n_seeds = max(1, int(4 * SEED_SHARE))
    assert {candidate_key(t) for t in task.same_workload[:n_seeds]} <= measured
    assert result.best_latency_us is not None


def test_warm_start_errors(tmp_path):
    with pytest.raises(DatabaseError, match="holds no tuning database"):
        WarmStart(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatabaseError, match="holds no tuning database"):
        tune(matmul(16), TARGET, trials=1, work_dir=tmp_path / "w", warm_start=tmp_path / "empty")
    source = tmp_path / "src"
    source.mkdir()
    (source / "database_workload.json").write_text("")
    (source / "database_tuning_record.json").write_text("")
    with pytest.raises(ValueError, match="model-guided strategy"):
        tune(matmul(16), TARGET, trials=1, work_dir=tmp_path / "w", strategy="random", warm_start=source)
