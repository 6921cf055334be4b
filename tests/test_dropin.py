"""fastsearch.metaschedule: the drop-in FeatureExtractor, CostModel and SearchStrategy inside MetaSchedule.

Small shapes and 8-16 trials: these check that MetaSchedule accepts the classes and that what
they do is right (features equal to PerStoreFeature's, a model that ranks better than chance
and saves and loads, a search whose best schedule compiles to a correct kernel), not speed.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import tvm
from fastsearch import metaschedule as fst
from fastsearch.costmodel.features import N_FEATURES, design_space_candidates
from fastsearch.costmodel.learned import pairwise_accuracy
from fastsearch.errors import FastsearchError, ScheduleError
from fastsearch.ir.loop_nest import trace_json
from fastsearch.measure.measurer import (
    MeasureConfig,
    Measurer,
    build_module,
    compare_outputs,
    random_arguments,
    run_function,
)
from fastsearch.search.sample import sample_candidates
from test_features import first_difference
from tvm.s_tir import meta_schedule as ms
from workloads import matmul, small

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": tvm.target.codegen.llvm_get_system_cpu()})


def context(func: tvm.tirx.PrimFunc) -> ms.TuneContext:
    return ms.TuneContext(mod=tvm.IRModule({"main": func}), target=TARGET, num_threads=1)


def candidates(func: tvm.tirx.PrimFunc, schedules: list) -> list[ms.MeasureCandidate]:
    args = ms.arg_info.ArgInfo.from_prim_func(func)
    return [ms.MeasureCandidate(s, args) for s in schedules]


def tune(func: tvm.tirx.PrimFunc, work_dir: Path, trials: int, **kwargs) -> ms.database.Database:
    """MetaSchedule's tune_tir with builds that skip the tensor-intrinsic import and short timings."""
    # tune_tir's logging setup lists its logger's handlers by name and fails on an unnamed one;
    # pytest's log capture leaves unnamed ones there once a test has run
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in [h for h in ms_logger.handlers if h.get_name() is None]:
        ms_logger.removeHandler(handler)
    return ms.tune_tir(
        func,
        TARGET,
        str(work_dir),
        trials,
        num_trials_per_iter=8,
        builder=ms.builder.LocalBuilder(f_build=build_module, max_workers=1),
        runner=ms.runner.LocalRunner(
            evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=5)
        ),
        num_tuning_cores=1,
        **kwargs,
    )


def records_of(db: ms.database.Database) -> list:
    return list(db.get_all_tuning_records())


def mean_secs(record) -> float:
    secs = [float(s) for s in record.run_secs] if record.run_secs else []
    return sum(secs) / len(secs) if secs and sum(secs) / len(secs) < 1e9 else math.inf


# --- FeatureExtractor ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["GMM", "C2D", "SFM", "CBR"])
def test_feature_extractor_equals_per_store_feature(family):
    func = small(family)
    schedules = [s for s in design_space_candidates(func, TARGET, 6)]
    schedules += [c.schedule for c in sample_candidates(func, TARGET, 6, seed=5)]
    ctx = context(func)
    cands = candidates(func, schedules)
    extractor = fst.FeatureExtractor()
    ours = extractor.extract_from(ctx, cands)
    theirs = ms.feature_extractor.PerStoreFeature().extract_from(ctx, cands)
    assert len(ours) == len(theirs) == len(schedules)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        assert isinstance(o, tvm.runtime.Tensor) and o.shape[1] == N_FEATURES and o.dtype == t.dtype
        d = first_difference(o.numpy(), t.numpy(), same_names=False)
        assert d is None, f"{family} candidate {i}: {d}"
    assert extractor.fallbacks == 0
    # the search's fast trace -> JSON conversion writes what fastsearch's reference one does
    for sch in schedules:
        assert json.loads(fst.trace_text(sch.trace)) == json.loads(trace_json(sch.trace))
        pre = sch.trace.simplified(remove_postproc=True)
        assert json.loads(fst.trace_text(pre)) == json.loads(trace_json(pre))


def _blockized(func: tvm.tirx.PrimFunc) -> tvm.s_tir.Schedule:
    """A schedule with an instruction fastsearch's engine does not model (Blockize)."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    block = sch.get_child_blocks(sch.get_sblock("root"))[0]
    sch.blockize(sch.get_loops(block)[-1])
    return sch


def test_feature_extractor_falls_back_to_per_store_feature():
    func = small("GMM")
    ctx = context(func)
    (cand,) = candidates(func, [_blockized(func)])
    extractor = fst.FeatureExtractor()
    (ours,) = extractor.extract_from(ctx, [cand])
    (theirs,) = ms.feature_extractor.PerStoreFeature().extract_from(ctx, [cand])
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert extractor.fallbacks == 1
    # without the fallback the engine's typed error is raised, through MetaSchedule's C++ layer
    with pytest.raises(ScheduleError, match="Blockize"):
        fst.FeatureExtractor(fallback=False).extract_from(ctx, [cand])


def test_xgbmodel_with_our_extractor_tunes(tmp_path):
    func = small("GMM")
    model = ms.cost_model.XGBModel(extractor=fst.FeatureExtractor(), num_warmup_samples=0, verbose_eval=0)
    db = tune(func, tmp_path, 16, cost_model=model)
    assert len(records_of(db)) == 16


# --- CostModel ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured_matmul():
    """80 of fastsearch's sketch candidates for a 64^3 matmul, measured: (func, schedules, seconds)."""
    func = matmul(64)
    cands = sample_candidates(func, TARGET, 80, seed=11)
    config = MeasureConfig(repeat=3, min_repeat_ms=5, build_workers=1)
    with Measurer(TARGET, config) as m:
        results = m.measure([c.schedule.mod for c in cands], ms.arg_info.ArgInfo.from_prim_func(func))
        Measurer.release(results)
    secs = np.array([r.mean_us * 1e-6 if r.ok else math.inf for r in results])
    return func, [c.schedule for c in cands], secs


def _runner_results(secs: np.ndarray) -> list[ms.runner.RunnerResult]:
    return [
        ms.runner.RunnerResult(None, "failed")
        if not math.isfinite(s)
        else ms.runner.RunnerResult([float(s)], None)
        for s in secs
    ]


def test_cost_model_ranks_held_out_candidates_and_round_trips(measured_matmul, tmp_path):
    func, schedules, secs = measured_matmul
    assert np.isfinite(secs).sum() >= 72
    ctx = context(func)
    cands = candidates(func, schedules)
    model = fst.CostModel()
    # Trained in two updates, as during tuning; the last 48 candidates are held out. Timings on
    # this machine vary 20-40% from run to run, so with 16 held out (120 pairs) the accuracy
    # ranged 0.50-0.68 over runs; 48 (1128 pairs) keeps chance far from the measured figure.
    model.update(ctx, cands[:16], _runner_results(secs[:16]))
    model.update(ctx, cands[16:32], _runner_results(secs[16:32]))
    predicted = model.predict(ctx, cands[32:])
    assert predicted.dtype == np.float64 and predicted.shape == (48,)
    accuracy = pairwise_accuracy(predicted, secs[32:])
    print(f"held-out pairwise accuracy {accuracy:.3f}")
    assert accuracy > 0.5

    path = tmp_path / "model.json"
    model.save(str(path))
    doc = json.loads(path.read_text())
    assert doc["booster"] is not None and sum(len(t["latencies"]) for t in doc["tasks"].values()) == 32
    loaded = fst.CostModel()
    loaded.load(str(path))
    np.testing.assert_array_equal(loaded.predict(ctx, cands[32:]), predicted)
    # a loaded model keeps its records: the next update trains on all of them
    loaded.update(ctx, cands[32:40], _runner_results(secs[32:40]))
    assert sum(len(r.latencies) for r in loaded.records.values()) == 40


def test_cost_model_in_tune_tir_with_evolutionary_search(tmp_path):
    func = small("C2D")
    strategy = ms.search_strategy.EvolutionarySearch(population_size=64, init_min_unmeasured=16)
    model = fst.CostModel()
    db = tune(func, tmp_path, 16, cost_model=model, strategy=strategy)
    assert len(records_of(db)) == 16
    assert sum(len(r.latencies) for r in model.records.values()) == 16
    assert model.model.trained


# --- SearchStrategy -----------------------------------------------------------------------------


def _check_best_compiles(func: tvm.tirx.PrimFunc, db: ms.database.Database, family: str) -> None:
    """The database's best schedule, compiled by MetaSchedule, computes what the untuned function
    (and, for GMM, numpy) does."""
    sch = ms.tir_integration.compile_tir(db, func, TARGET)
    assert sch is not None, "no valid schedule in the database"
    lib = tvm.compile(sch.mod, target=TARGET)
    ref = tvm.compile(tvm.IRModule({"main": func}), target=TARGET)
    arrays = random_arguments(ms.arg_info.ArgInfo.from_prim_func(func), seed=1)
    dev = tvm.cpu()
    got = run_function(lib, arrays, dev)
    expected = run_function(ref, arrays, dev)
    if family == "GMM":  # batch_matmul_nkkm: C[b, i, j] = sum_k A[b, i, k] * B[b, k, j]
        np.testing.assert_allclose(got[2], np.matmul(arrays[0], arrays[1]), rtol=1e-4, atol=1e-4)
    assert compare_outputs(expected, got) is None


@pytest.mark.parametrize("family", ["GMM", "C2D", "CBR"])
def test_search_strategy_tunes_and_best_is_correct(family, tmp_path):
    func = small(family)
    strategy = fst.SearchStrategy(population_size=32, generations=2, seed=0)
    db = tune(func, tmp_path, 16, strategy=strategy, cost_model=fst.CostModel())
    records = records_of(db)
    assert len(records) == 16
    keys = [trace_json(r.trace.simplified(remove_postproc=True)) for r in records]
    assert len(set(keys)) == len(keys), "a candidate was proposed twice"
    (batches,) = strategy.stats.batches.values()
    assert [len(b) for b in batches] == [8, 8]
    assert not any(strategy.stats.unmatched.values()) and not any(strategy.stats.unreplayable.values())
    best = min(mean_secs(r) for r in records)
    assert math.isfinite(best) and best <= min(batches[0])
    print(
        f"{family}: best per batch (us) {[round(min(b) * 1e6, 2) for b in batches]}, "
        f"median {[round(float(np.median(b)) * 1e6, 2) for b in batches]}"
    )
    _check_best_compiles(func, db, family)


def test_search_strategy_improves_over_its_first_batch(tmp_path):
    """On a 64^3 matmul (tens of microseconds: above the noise of tiny kernels), the batches the
    trained model picks beat the first, unguided one. Measured best of the first batch vs the
    later ones: 11.8 -> 5.9, 10.2 -> 5.9, 9.1 -> 6.4, 6.2 -> 6.1 us: the first batch's best
    moves with the machine's load, so the check is against its median (about 25 us), which
    the guided batches beat several times over."""
    func = matmul(64)
    strategy = fst.SearchStrategy(population_size=64, generations=2, seed=0)
    tune(func, tmp_path, 24, strategy=strategy, cost_model=fst.CostModel())
    (batches,) = strategy.stats.batches.values()
    assert len(batches) == 3
    first, later = min(batches[0]), min(min(b) for b in batches[1:])
    typical = float(np.median(batches[0]))
    print(
        f"matmul 64: first batch best {first * 1e6:.1f} us, median {typical * 1e6:.1f} us; "
        f"later batches best {later * 1e6:.1f} us"
    )
    assert later < typical


def test_search_strategy_resumes_without_repeating(tmp_path):
    """A second run on the same database proposes nothing already measured, and starts from
    the best measured candidates. The second run has no cost model (``"none"``): the strategy
    scores with its own StoreFeatureModel, trained on its results."""
    func = small("GMM")
    strategy = fst.SearchStrategy(population_size=32, generations=2, seed=0)
    tune(func, tmp_path, 8, strategy=strategy, cost_model=fst.CostModel())
    again = fst.SearchStrategy(population_size=32, generations=2, seed=0)
    db = tune(func, tmp_path, 16, strategy=again, cost_model="none")
    records = records_of(db)
    assert len(records) == 24
    keys = {trace_json(r.trace.simplified(remove_postproc=True)) for r in records}
    assert len(keys) == 24
    (batches,) = again.stats.batches.values()
    assert [len(b) for b in batches] == [8, 8] and not any(again.stats.unmatched.values())


def test_design_space_the_engine_cannot_replay_fails_at_pre_tuning(tmp_path):
    func = small("GMM")

    def space(sch: tvm.s_tir.Schedule) -> None:
        block = sch.get_child_blocks(sch.get_sblock("root"))[0]
        sch.blockize(sch.get_loops(block)[-1])

    generator = ms.space_generator.ScheduleFn(space, sch_rules=[], postprocs=[], mutator_probs={})
    with pytest.raises(ScheduleError, match="design space 0 of 1.*Blockize") as info:
        tune(func, tmp_path, 4, space=generator, strategy=fst.SearchStrategy(population_size=8))
    assert isinstance(info.value, FastsearchError)
    assert not records_of(ms.database.JSONDatabase(work_dir=str(tmp_path)))


def test_store_feature_model_predicts_as_xgboost():
    """The pooled-feature model evaluated by the Rust forest predicts what XGBoost does."""
    import xgboost as xgb
    from fastsearch.costmodel.learned import StoreFeatureModel, pool_store_features

    rng = np.random.default_rng(0)
    rows = [
        rng.uniform(0, 10, size=(int(rng.integers(1, 4)), N_FEATURES)).astype(np.float32) for _ in range(60)
    ]
    pooled = pool_store_features(rows)
    assert pooled.shape == (60, 2 * N_FEATURES)
    np.testing.assert_array_equal(pooled[0, :N_FEATURES], rows[0].sum(axis=0))
    lat = 1.0 / (1.0 + pooled[:, 3]) + rng.uniform(0, 0.01, size=60)
    lat[5] = np.inf
    model = StoreFeatureModel()
    model.fit([(pooled[:30], lat[:30]), (pooled[30:], lat[30:])])
    booster = xgb.Booster()
    booster.load_model(bytearray(model.booster_json.encode()))
    np.testing.assert_allclose(
        model.predict(pooled), booster.predict(xgb.DMatrix(pooled)), rtol=1e-5, atol=1e-5
    )
    assert len(pool_store_features([np.zeros((0, N_FEATURES), dtype=np.float32)])) == 1


def test_module_name_does_not_shadow_tvm():
    """``fastsearch.tvm`` is the earlier name of the drop-in module, and every fastsearch module's
    ``tvm`` is TVM itself."""
    import importlib
    import pkgutil

    import fastsearch
    from fastsearch import tvm as alias

    assert alias is fst and fst.__name__ == "fastsearch.metaschedule" and tvm.__name__ == "tvm"
    assert fst.tvm is tvm  # the drop-in module's own ``import tvm`` is TVM, not the alias
    for info in pkgutil.walk_packages(fastsearch.__path__, "fastsearch."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "tvm") and info.name != "fastsearch":
            assert module.tvm is tvm, f"{info.name}.tvm is {module.tvm!r}"


def test_local_tile_mutation_moves_one_prime_factor():
    """With ``local_tile_prob=1`` a mutated tile decision keeps its product and differs from
    the parent's in two levels, one divided and one multiplied by the same prime; every other
    tile decision is the parent's, and the innermost level stays within its limit."""
    func = small("C2D")
    strategy = fst.SearchStrategy(population_size=8, local_tile_prob=1.0, seed=3)
    ctx = ms.TuneContext(
        mod=tvm.IRModule({"main": func}),
        target=TARGET,
        space_generator="post-order-apply",
        search_strategy=strategy,
        task_name="c2d",
    )
    strategy.pre_tuning(8, 8, ctx.generate_design_space(), None, None)

    def tiles(trace: tvm.s_tir.Trace) -> list[tuple[list[int], int]]:
        return [
            ([int(x) for x in trace.decisions[i]], int(i.attrs[1]))
            for i in trace.insts
            if str(i.kind.name) == "SamplePerfectTile"
        ]

    parent = strategy._sample()
    moved = 0
    for _ in range(60):
        child = strategy._mutate(parent)
        if child is None:
            continue
        changed = [(a, b) for (a, _), (b, _) in zip(tiles(parent.trace), tiles(child.trace)) if a != b]
        assert len(changed) <= 1
        for tile, limit in tiles(child.trace):
            assert limit <= 0 or tile[-1] <= limit
        if changed:
            ((a, b),) = changed
            assert math.prod(a) == math.prod(b)
            diff = [i for i in range(len(a)) if a[i] != b[i]]
            assert len(diff) == 2
            up, down = sorted(diff, key=lambda i: b[i] / a[i])[::-1]
            p = b[up] // a[up]
            assert b[up] == a[up] * p and a[down] == b[down] * p
            assert p > 1 and all(p % q for q in range(2, p))
            moved += 1
    assert moved >= 10
