"""The model-guided search: forest evaluation in Rust agrees with XGBoost, proposals are new,
valid and deterministic, and the model retrains on what was measured."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
import xgboost as xgb
from fake_measure import fake_latency, measure_until
from fastsearch import _core
from fastsearch.costmodel.learned import CostModel, pairwise_accuracy
from fastsearch.ir.machine import Machine, fma_per_cycle, machine_of, vector_registers
from fastsearch.ir.tir_import import program_json
from fastsearch.search.guided import (
    EXPLORING_ROLES,
    MIN_RECORDS,
    RERANK_AFTER,
    RERANK_POOL,
    WARM_MODEL_WEIGHT,
    ModelGuidedSampler,
    SiblingRecords,
    anchor_distance,
    anchor_extents,
    blend_ranks,
    keep_exploring,
)
from fastsearch.search.state import SearchState, state_file, state_name
from workloads import matmul, matmul_relu, small, softmax

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})
MACHINE = Machine(cores=2, vector_bytes=64, fma_per_cycle=2.0, parallel_speedup=None)


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
    got = np.array(_core.Forest(bytes(booster.save_raw("json")).decode()).predict(x))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_malformed_model_is_a_typed_error():
    import fastsearch

    with pytest.raises(fastsearch.MalformedInput):
        _core.Forest('{"learner": {}}').predict(np.zeros((1, 3), dtype=np.float32))


def test_pairwise_accuracy():
    lat = np.array([1.0, 2.0, 3.0, np.inf])
    assert pairwise_accuracy(np.array([3.0, 2.0, 1.0, 0.0]), lat) == 1.0
    assert pairwise_accuracy(np.array([1.0, 2.0, 3.0, 0.0]), lat) == 0.0


def test_sketch_features_are_finite_and_named():
    func = small("CBR")
    doc = program_json(func)
    genomes = [g for _, g in _core.Program(doc).sample_genomes(_core.Target(2, vector_bytes=64), 16, 0)]
    rows = _core.Program(doc).sketch_feature_rows(_core.Target(2, vector_bytes=64), genomes)
    assert rows.shape == (16, len(_core.SKETCH_FEATURE_NAMES))
    assert rows.dtype == np.float32
    assert np.isfinite(rows).all()
    assert len(np.unique(rows, axis=0)) > 1


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
            history[c.key] = fake_latency(c.key)
    assert len(history) >= MIN_RECORDS
    assert sampler.model.trained_on >= MIN_RECORDS


def test_blend_ranks():
    props = [(k, "", 0.0) for k in "abcd"]  # the search's order
    predicted = np.array([0.0, 3.0, 2.0, 1.0])  # the model's order: b, c, d, a
    assert [p[0] for p in blend_ranks(props, predicted, 0.0)] == list("abcd")
    assert [p[0] for p in blend_ranks(props, predicted, 1.0)] == list("bcda")
    # Blended ranks a 1.5, b 0.5, c 1.5, d 2.5: ties keep the search's order.
    assert [p[0] for p in blend_ranks(props, predicted, 0.5)] == list("bacd")


def test_keep_exploring_keeps_each_exploring_roles_share():
    roles = ["exploit"] * 4 + ["shape"] * 2 + ["structure"] * 2
    props = [(k, "", 0.0, role) for k, role in zip("abcdefgh", roles, strict=True)]
    by_key = {p[0]: p for p in props}
    reordered = [by_key[k] for k in "hdcfabeg"]  # a re-ranking that puts e and g last
    # Half the pool is wanted: half of each exploring role (its best scored) goes first.
    out = keep_exploring(props, reordered, 4)
    assert [p[0] for p in out] == list("eghdcfab")
    # Without exploring roles (early batches) the re-ranking is left as it is.
    plain = [(k, "", 0.0, "exploit") for k in "abcd"]
    assert keep_exploring(plain, plain[::-1], 2) == plain[::-1]


def test_late_batches_are_reranked_by_the_task_store_model(monkeypatch):
    """With RERANK_AFTER valid records, the search proposes RERANK_POOL times the batch and the
    batch is the head of those proposals blended with a store-feature model trained on the
    records."""
    from fastsearch.search import guided as search

    func = small("GMM")
    history: dict[str, float] = {}
    warmup = ModelGuidedSampler(
        func, TARGET, "evolutionary", lambda: history.items(), population=64, generations=2, rerank=False
    )
    measure_until(warmup, func, TARGET, history, RERANK_AFTER)
    seen: list[tuple[list[str], list[str]]] = []

    def spy(proposals, predicted, weight):
        out = blend_ranks(proposals, predicted, weight)
        seen.append(([p[0] for p in proposals], [p[0] for p in out]))
        return out

    monkeypatch.setattr(search, "blend_ranks", spy)

    def batch(rerank: bool) -> tuple[ModelGuidedSampler, list[str]]:
        s = ModelGuidedSampler(
            func, TARGET, "evolutionary", lambda: history.items(), population=64, generations=2, rerank=rerank
        )
        s.genomes.update(warmup.genomes)  # as a resumed run knows them: the search's model trains
        return s, [c.key for c in s(func, TARGET, 8, 99, set(history))]

    plain_sampler, plain = batch(False)
    assert plain_sampler.store_ranker is None and not seen
    sampler, reranked = batch(True)
    assert sampler.store_ranker is not None and sampler.store_ranker.model.trained
    ((pool, blended),) = seen
    assert len(pool) == RERANK_POOL * 8
    assert reranked == blended[:8] != plain
    assert not set(reranked) & set(history)


def test_late_reranked_batches_keep_their_exploring_share(monkeypatch):
    """Once the run has the search's `novel_after` records (64), the search gives shares of the
    batch to coarse shapes and structures hardly measured; re-ranking by the store-feature model
    keeps those shares instead of dropping them for the structures it knows, even when it ranks
    them last."""
    from fastsearch.search import guided as search

    func = small("GMM")
    history: dict[str, float] = {}
    warmup = ModelGuidedSampler(
        func, TARGET, "evolutionary", lambda: history.items(), population=64, generations=1, rerank=False
    )
    measure_until(warmup, func, TARGET, history, 64)
    seen = []

    def spy(proposals, reordered, want):
        out = keep_exploring(proposals, reordered, want)
        seen.append((proposals, reordered, out))
        return out

    def exploring_last(proposals, predicted, weight):
        # The store-feature model as an adversary: it ranks every exploring proposal last.
        low = np.array([p[3] in EXPLORING_ROLES for p in proposals], dtype=float) * 1e3
        return blend_ranks(proposals, np.asarray(predicted) - low, weight)

    monkeypatch.setattr(search, "keep_exploring", spy)
    monkeypatch.setattr(search, "blend_ranks", exploring_last)
    # The batch as ranked: no proposal moved to a cheaper unroll depth (a new key).
    monkeypatch.setattr(
        ModelGuidedSampler, "_cheapest_equal_unroll", lambda self, proposals, known: proposals
    )
    sampler = ModelGuidedSampler(func, TARGET, "evolutionary", lambda: history.items(), population=64)
    sampler.genomes.update(warmup.genomes)
    batch = [c.key for c in sampler(func, TARGET, 8, 99, set(history))]
    ((pool, reordered, out),) = seen
    assert len(pool) == RERANK_POOL * 8 and reordered != pool
    roles = {p[0]: p[3] for p in pool}
    # A quarter of the pool explores new coarse shapes: a quarter of the batch still does, first
    # (the re-ranked rest may hold more of them).
    assert [roles[k] for k in batch[:2]] == ["shape", "shape"]
    assert sum(roles[k] == "shape" for k in batch) >= 2
    assert batch == [p[0] for p in out[:8]]
    assert not set(batch) & set(history)


def test_model_guided_sampler_is_deterministic():
    func = small("C2D")

    def run():
        history: dict[str, float] = {}
        sampler = ModelGuidedSampler(func, TARGET, "evolutionary", lambda: history.items(), population=64)
        out = []
        for r in range(2):
            cands = sampler(func, TARGET, 6, r, set(history))
            out.extend(c.key for c in cands)
            history.update((c.key, fake_latency(c.key)) for c in cands)
        return out

    assert run() == run()


def test_cost_model_learns_a_ranking():
    func = small("GMM")
    doc = program_json(func)
    pairs = _core.Program(doc).sample_genomes(_core.Target(2, vector_bytes=64), 200, 1)
    rows = _core.Program(doc).sketch_feature_rows(_core.Target(2, vector_bytes=64), [g for _, g in pairs])
    lat = np.array([fake_latency(k) for k, _ in pairs])
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
        history.update((c.key, fake_latency(c.key)) for c in cands)
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
    model, weight, seeds = second._train(dict(history))
    assert model is not None and weight > 0
    best = min(history, key=history.__getitem__)
    assert seeds[0] == saved.load_genomes()[best]  # the best measured seeds the population

    # with too few records of its own, a fresh sampler still starts from the saved model
    third = ModelGuidedSampler(func, TARGET, "evolutionary", dict, state=SearchState(tmp_path, "main"))
    model, weight, _ = third._train({})
    assert model is not None and weight > 0
    rows = third.program.sketch_feature_rows(third.core_target, list(saved.load_genomes().values())[:4])
    assert np.isfinite(model.predict(rows)).all()  # the booster Rust evaluates


def test_state_files_are_per_task_and_shape(tmp_path):
    """Two tasks of one name and different shapes (two models' ``fused_conv2d_add_relu``) keep
    their search state apart; a task's name and module always name the same files."""
    a, b = matmul(32), matmul(48)
    assert state_name("main", a) == state_name("main", matmul(32)) != state_name("main", b)
    first, second = SearchState.of_task(tmp_path, "main", a), SearchState.of_task(tmp_path, "main", b)
    first.add_builds([("k1", 0.5)])
    assert second.load_builds() == {}
    assert SearchState.found(tmp_path, "main", "builds.jsonl").load_builds() == {"k1": 0.5}
    second.add_builds([("k2", 1.5)])
    with pytest.raises(ValueError, match="2 tasks named 'main'"):
        state_file(tmp_path, "main", "builds.jsonl")
    with pytest.raises(FileNotFoundError):
        state_file(tmp_path, "other", "builds.jsonl")
    # A run from before the hash (its files named after the task alone) is still found.
    legacy = tmp_path / "legacy"
    SearchState(legacy, "main").add_genomes([("k", "{}")])
    assert state_file(legacy, "main", "genomes.jsonl").name == "fastsearch_search.main.genomes.jsonl"


def test_analytical_model_waits_on_short_fma_chains_only_without_independent_work():
    """One accumulator vector fed by a 64-long reduction leaves the FMA units waiting on latency
    (8x slower than 8 vectors); the same vector with the reduction outside and 32 independent
    iterations of S2 around it (written straight into the output, so that LLVM keeps the loop)
    does not, as out-of-order execution overlaps them. Loads count
    too: per reduction step, 8 vectors load 8 broadcasts of A and one vector of B (9 loads for 8
    FMAs), one vector a broadcast and a vector (2 loads for 1 FMA); with S2 around it, the
    vector is also stored and loaded again around each one-FMA step (from L1: 1 + 0.4 x 2 the
    FMA's time). With 8 iterations of S2, LLVM unrolls them whole: one body of 8 accumulators
    and 9 loads, as 8 vectors at S3. The limits combine as a soft maximum (``issue``): a tile
    exactly at one limit is slower than one with slack."""
    from workloads import matmul

    program = program_json(matmul(64))

    def genome(i: list[int], j: list[int], k: list[int], cache: str = "Global") -> str:
        rules = {"1": {"Tile": {"cache": cache, "level": 1}}}
        return json.dumps(
            {"rules": rules, "tiles": {"1": [i, j, k]}, "parallel": 32, "vectorize": 64, "unroll": 0}
        )

    one_chain = genome([8, 4, 2, 1], [1, 4, 1, 16], [1, 64])
    eight_vectors = genome([2, 4, 1, 8], [1, 4, 1, 16], [1, 64])
    overlapped = genome([2, 4, 8, 1], [1, 1, 4, 16], [64, 1], cache="None")
    unrolled = genome([2, 4, 8, 1], [1, 4, 1, 16], [64, 1])
    unrolled_32 = genome([2, 4, 8, 1], [1, 1, 4, 16], [64, 1])
    a, b, c, d, e = _core.Program(program).analytical_scores(
        _core.Target(2, vector_bytes=64), [one_chain, eight_vectors, overlapped, unrolled, unrolled_32]
    )

    def issue(latency: float, loads: float) -> float:
        return float((1 + latency**4 + loads**4) ** 0.25)

    assert b - a == pytest.approx(np.log(issue(8, 2) / issue(1, 9 / 8)), rel=0.05)
    assert c - a == pytest.approx(np.log(issue(8, 2) / (issue(8 / 32, 2) * 1.8)), rel=0.05)
    assert d - a == pytest.approx(np.log(issue(8, 2) / issue(1, 9 / 8)), rel=0.05)
    # Into a write cache, LLVM unrolls the 32 steps of S2 on its own: 32 accumulator vectors
    # (4 more than the registers left for them) and 12 loads per 32 FMAs.
    spill = (32 / 28) ** 2
    assert e - a == pytest.approx(np.log(issue(8, 2) / (issue(8 / 32, 12 / 32) * spill)), rel=0.05)
    # A core issuing one 512-bit FMA a cycle (Zen 4) needs half the chains: one vector waits
    # about 4x, not 8x, and four vectors nearly keep it busy.
    four_vectors = genome([4, 4, 1, 4], [1, 4, 1, 16], [1, 64])
    one, four, eight = _core.Program(program).analytical_scores(
        _core.Target(2, vector_bytes=64, fma_per_cycle=1.0), [one_chain, four_vectors, eight_vectors]
    )
    assert four - one == pytest.approx(np.log(issue(4, 2) / issue(1, 5 / 4)), rel=0.05)
    assert eight - four == pytest.approx(np.log(issue(1, 5 / 4) / issue(1 / 2, 9 / 8)), abs=0.05)


def test_target_fma_rate():
    assert fma_per_cycle(tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})) == 1.0
    assert fma_per_cycle(tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})) == 2.0
    assert fma_per_cycle(tvm.target.Target({"kind": "llvm", "num-cores": 2})) == 2.0


def test_target_vector_registers():
    """32 with AVX-512, 16 with AVX2 (Zen 3), whatever the host: the LLVM CPU says."""
    for mcpu, registers in (("znver4", 32), ("skylake-avx512", 32), ("znver3", 16), ("haswell", 16)):
        target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
        assert vector_registers(target) == registers
        assert machine_of(target).core_target().vector_registers == registers


def test_anchor_of_a_fused_function_is_its_reduction():
    assert anchor_extents(program_json(matmul(32))) == ("SSR", [32, 32, 32])
    relu = anchor_extents(program_json(matmul_relu(32)))
    assert anchor_distance(anchor_extents(program_json(matmul(32))), relu) == 0.0
    assert anchor_distance(relu, anchor_extents(program_json(matmul(64)))) == pytest.approx(1.0)
    assert anchor_distance(relu, anchor_extents(program_json(softmax()))) == float("inf")


def _matmul_sampler(siblings: SiblingRecords, history: dict[str, float]) -> ModelGuidedSampler:
    """The 32x32 matmul task "mm" of a run with ``siblings``, its records read from ``history``."""
    return ModelGuidedSampler(
        matmul(32),
        TARGET,
        "evolutionary",
        lambda: history.items(),
        population=64,
        siblings=siblings,
        name="mm",
    )


def test_sibling_tasks_train_each_others_models():
    """A task with no records of its own starts from a model trained on its siblings' records,
    weighted by anchor distance; an operator of another kind learns nothing from them."""
    siblings = SiblingRecords()
    history: dict[str, float] = {}
    first = _matmul_sampler(siblings, history)
    for r in range(2):
        cands = first(matmul(32), TARGET, 8, r, set(history))
        history.update((c.key, fake_latency(c.key)) for c in cands)
    assert len(history) >= MIN_RECORDS

    relu = ModelGuidedSampler(
        matmul_relu(32), TARGET, "evolutionary", {}.items, siblings=siblings, name="mm_relu"
    )
    model_json, weight, seeds = relu._train({})
    assert model_json is not None and seeds == []
    assert weight == WARM_MODEL_WEIGHT
    assert relu.model.trained_on == len(history)
    rows, labels, weights = siblings.training("mm_relu", MACHINE)
    assert len(rows) == len(labels) == len(history)
    np.testing.assert_allclose(weights, 1.0)  # the same matmul with another epilogue
    assert labels.max() == 1.0

    ModelGuidedSampler(matmul(64), TARGET, "evolutionary", {}.items, siblings=siblings, name="mm64")
    far = siblings.training("mm64", MACHINE)
    assert far is not None
    np.testing.assert_allclose(far[2], np.exp(-2.0))  # twice the extents: distance 1

    ModelGuidedSampler(softmax(), TARGET, "evolutionary", {}.items, siblings=siblings, name="softmax")
    assert siblings.training("softmax", MACHINE) is None

    alone = ModelGuidedSampler(matmul_relu(32), TARGET, "evolutionary", {}.items)
    assert alone._train({}) == (None, 0.0, [])


def test_siblings_with_the_same_anchor_share_their_best_candidates():
    """The best of a sibling computing the same matmul is carried over block by block and
    measured in the task's next batch (one per batch); other shapes share no candidates."""
    siblings = SiblingRecords()
    history: dict[str, float] = {}
    first = _matmul_sampler(siblings, history)
    cands = first(matmul(32), TARGET, 8, 0, set())
    history.update((c.key, fake_latency(c.key)) for c in cands)
    relu = ModelGuidedSampler(
        matmul_relu(32), TARGET, "evolutionary", {}.items, population=64, siblings=siblings, name="mm_relu"
    )
    moved = siblings.transfers("mm_relu")
    assert 1 <= len(moved) <= 2
    best = min((lat, k) for k, lat in history.items())[1]  # ties go to the smaller key
    genome = json.loads(first.genomes[best])
    assert json.loads(moved[0][1])["tiles"] == genome["tiles"]  # same extents: same tiles
    batch = relu(matmul_relu(32), TARGET, 4, 0, set())
    assert batch[0].key == moved[0][0]
    assert sum(c.key in {k for k, _ in moved} for c in batch) == 1
    ModelGuidedSampler(matmul(64), TARGET, "evolutionary", {}.items, siblings=siblings, name="mm64")
    assert siblings.transfers("mm64") == []


def test_sibling_genomes_carry_over_only_between_the_same_anchor():
    src, dst = program_json(matmul(32)), program_json(matmul_relu(32))
    genomes = [g for _, g in _core.Program(src).sample_genomes(_core.Target(2, vector_bytes=64), 16, 0)]
    moved = _core.Program(dst).transfer_sibling_genomes(_core.Program(src), genomes)
    assert sum(m is not None for m in moved) >= len(genomes) // 2
    for m, g in zip(moved, genomes, strict=True):
        if m is not None:
            assert json.loads(m[1])["tiles"] == json.loads(g)["tiles"]
    assert all(
        m is None
        for m in _core.Program(program_json(softmax())).transfer_sibling_genomes(_core.Program(src), genomes)
    )
    assert _core.Program(dst).transfer_sibling_genomes(_core.Program(src), ["not a genome"]) == [None]


def test_cold_first_batch_is_the_analytical_best_of_the_random_population():
    """With no records and no saved model, the first batch is not evolved (COLD_GENERATIONS):
    it is the analytical model's best of the random population; once records exist the search
    evolves again."""
    func = matmul(32)
    history: dict[str, float] = {}
    sampler = ModelGuidedSampler(func, TARGET, "evolutionary", lambda: history.items(), population=64)
    first = [c.key for c in sampler(func, TARGET, 8, 3, set())]
    program = _core.Program(program_json(func))
    cpu = machine_of(TARGET).core_target()
    cold = {"strategy": "evolutionary", "n": 8, "seed": 3, "measured": {}, "seeds": [], "population": 64}
    unevolved = program.propose(cpu, generations=0, **cold)
    evolved = program.propose(cpu, generations=4, **cold)
    # As the batch proposes them: each at the cheapest unroll depth the model scores alike.
    assert first == [key for key, _, _, _ in sampler._cheapest_equal_unroll(unevolved, {})]
    assert first != [key for key, _, _, _ in sampler._cheapest_equal_unroll(evolved, {})]
