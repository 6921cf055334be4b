"""The model-guided search: forest evaluation in Rust agrees with XGBoost, proposals are new,
valid and deterministic, and the model retrains on what was measured."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
import xgboost as xgb
from fastsearch import _core
from fastsearch.cost_model import CostModel, pairwise_accuracy
from fastsearch.search import MIN_RECORDS, ModelGuidedSampler, SearchState
from fastsearch.tir_import import program_json
from workloads import small

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


@pytest.mark.parametrize("objective", ["reg:squarederror", "rank:pairwise"])
def test_rust_forest_matches_xgboost(objective):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 34)).astype(np.float32)
    y = x[:, 0] * 2 + x[:, 3] ** 2 + rng.normal(size=400) * 0.1
    x[rng.random(x.shape) < 0.1] = np.nan  # missing values take the default branch
    d = xgb.DMatrix(x, label=y if objective.startswith("reg") else np.argsort(np.argsort(y)) // 40)
    if objective.startswith("rank"):
        d.set_group([400])
    booster = xgb.train({"objective": objective, "max_depth": 6, "eta": 0.3}, d, 40)
    expected = booster.predict(xgb.DMatrix(x), output_margin=True)
    got = np.array(_core.forest_predict(bytes(booster.save_raw("json")).decode(), x))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_malformed_model_is_a_typed_error():
    import fastsearch

    with pytest.raises(fastsearch.MalformedInput):
        _core.forest_predict('{"learner": {}}', np.zeros((1, 3), dtype=np.float32))


def test_pairwise_accuracy():
    lat = np.array([1.0, 2.0, 3.0, np.inf])
    assert pairwise_accuracy(np.array([3.0, 2.0, 1.0, 0.0]), lat) == 1.0
    assert pairwise_accuracy(np.array([1.0, 2.0, 3.0, 0.0]), lat) == 0.0


def test_sketch_features_are_finite_and_named():
    func = small("CBR")
    doc = program_json(func)
    genomes = [g for _, g in _core.sample_genomes(doc, 2, 64, 16, 0)]
    rows = _core.sketch_feature_rows(doc, 2, 64, genomes)
    assert rows.shape == (16, len(_core.SKETCH_FEATURE_NAMES))
    assert rows.dtype == np.float32
    assert np.isfinite(rows).all()
    assert len(np.unique(rows, axis=0)) > 1


def _fake_latency(key: str) -> float:
    """A deterministic stand-in for a measurement: prefers wide innermost tiles."""
    decisions = json.loads(key)[1]
    tiles = [d[1] for d in decisions if isinstance(d[1], list) and len(d[1]) == 4]
    return 1.0 / (1.0 + sum(t[-1] for t in tiles))


@pytest.mark.parametrize("strategy", ["evolutionary", "annealing"])
def test_model_guided_sampler_proposes_new_valid_candidates(strategy):
    func = small("GMM")
    history: dict[str, float] = {}
    sampler = ModelGuidedSampler(
        func, TARGET, strategy, lambda: history.items(), population=128, generations=2
    )
    for round_index in range(3):
        cands = sampler(func, TARGET, 8, round_index, set(history))
        assert cands, "no proposals"
        keys = [c.key for c in cands]
        assert len(set(keys)) == len(keys)
        assert not set(keys) & set(history), "a measured candidate was proposed again"
        for c in cands:
            history[c.key] = _fake_latency(c.key)
    assert len(history) >= MIN_RECORDS
    assert sampler.model.trained_on >= MIN_RECORDS


def test_model_guided_sampler_is_deterministic():
    func = small("C2D")

    def run():
        history: dict[str, float] = {}
        sampler = ModelGuidedSampler(func, TARGET, "evolutionary", lambda: history.items(), population=64)
        out = []
        for r in range(2):
            cands = sampler(func, TARGET, 6, r, set(history))
            out.extend(c.key for c in cands)
            history.update((c.key, _fake_latency(c.key)) for c in cands)
        return out

    assert run() == run()


def test_cost_model_learns_a_ranking():
    func = small("GMM")
    doc = program_json(func)
    pairs = _core.sample_genomes(doc, 2, 64, 200, 1)
    rows = _core.sketch_feature_rows(doc, 2, 64, [g for _, g in pairs])
    lat = np.array([_fake_latency(k) for k, _ in pairs])
    model = CostModel()
    model.fit(rows[:150], lat[:150])
    assert pairwise_accuracy(model.predict(rows[150:]), lat[150:]) > 0.8


def test_search_state_makes_a_later_run_start_warm(tmp_path):
    """Genomes and the trained model persist next to the database; a new sampler on the same
    directory trains on the earlier records and seeds its population from them at once."""
    func = small("GMM")
    history: dict[str, float] = {}
    first = ModelGuidedSampler(
        func,
        TARGET,
        "evolutionary",
        lambda: history.items(),
        population=64,
        generations=2,
        state=SearchState(tmp_path, "main"),
    )
    for r in range(3):
        cands = first(func, TARGET, 6, r, set(history))
        history.update((c.key, _fake_latency(c.key)) for c in cands)
    saved = SearchState(tmp_path, "main")
    assert set(history) <= set(saved.load_genomes())
    model = saved.load_model()
    assert model is not None and model[1] >= MIN_RECORDS

    # a killed run leaves a torn last line: skipped, the rest still loads
    with saved.genomes_path.open("a") as f:
        f.write('{"key": "[[], []]", "gen')
    assert set(history) <= set(SearchState(tmp_path, "main").load_genomes())

    second = ModelGuidedSampler(
        func,
        TARGET,
        "evolutionary",
        lambda: history.items(),
        population=64,
        generations=2,
        state=SearchState(tmp_path, "main"),
    )
    model_json, weight, seeds = second._train(dict(history))
    assert model_json is not None and weight > 0
    best = min(history, key=history.__getitem__)
    assert seeds[0] == saved.load_genomes()[best]  # the best measured seeds the population

    # with too few records of its own, a fresh sampler still starts from the saved model
    third = ModelGuidedSampler(func, TARGET, "evolutionary", dict, state=SearchState(tmp_path, "main"))
    model_json, weight, _ = third._train({})
    assert model_json is not None and weight > 0
    rows = _core.sketch_feature_rows(third.program, 2, 64, list(saved.load_genomes().values())[:4])
    assert np.isfinite(_core.forest_predict(model_json, rows)).all()  # the booster Rust evaluates


def test_analytical_model_waits_on_short_fma_chains_only_without_independent_work():
    """One accumulator vector fed by a 64-long reduction leaves the FMA units waiting on latency
    (8x slower than 8 vectors); the same vector with the reduction outside and 8 independent
    iterations of S2 around it does not, as out-of-order execution overlaps them. Loads count
    too: per reduction step, 8 vectors load 8 broadcasts of A and one vector of B (9 loads for 8
    FMAs), one vector a broadcast and a vector (2 loads for 1 FMA)."""
    from workloads import matmul

    program = program_json(matmul(64))

    def genome(i: list[int], j: list[int], k: list[int]) -> str:
        rules = {"1": {"Tile": {"cache": "Global", "level": 1}}}
        return json.dumps(
            {"rules": rules, "tiles": {"1": [i, j, k]}, "parallel": 32, "vectorize": 64, "unroll": 0}
        )

    one_chain = genome([8, 4, 2, 1], [1, 4, 1, 16], [1, 64])
    eight_vectors = genome([2, 4, 1, 8], [1, 4, 1, 16], [1, 64])
    overlapped = genome([2, 4, 8, 1], [1, 4, 1, 16], [64, 1])
    a, b, c = _core.analytical_scores(program, 2, 64, [one_chain, eight_vectors, overlapped])
    assert b - a == pytest.approx(np.log(8 / (9 / 8)), rel=0.05)
    assert c - a == pytest.approx(np.log(8 / 2), rel=0.05)
