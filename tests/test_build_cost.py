"""Build cost in the search (issue 28, item 2): the build-time model learns which candidates are
slow to build, the ranking defers them, the builds are kept beside the database, and the tuning
loop feeds them to the search."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
import tvm
from fake_measure import measure_until
from fastsearch import _core as fastsearch_core
from fastsearch.cli.main import load_workload
from fastsearch.costmodel.build_time import MIN_BUILDS, BuildTimeModel
from fastsearch.database import candidate_key
from fastsearch.ir.target import resolve_target
from fastsearch.search import guided
from fastsearch.search.guided import (
    BUILD_POOL,
    BUILD_RANK_WEIGHT,
    BUILD_SLOW_LEARNED,
    BUILD_SLOW_LOG2,
    BUILD_SLOW_SHARE,
    BUILD_WIDE_POOL,
    PRIOR_FREE_STRIDED_LOG2,
    ModelGuidedSampler,
    admit_slow_builds,
    prefer_cheap_builds,
    prior_build_cost,
)
from fastsearch.search.state import SearchState
from workloads import small

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})
#: This host's CPU (its vector width decides which TBG candidates have strided lanes).
HOST = resolve_target(None)


def _proposals(keys: str) -> guided.Proposals:
    return [(k, "{}", 1.0 - i / 10, "exploit") for i, k in enumerate(keys)]


def test_prefer_cheap_builds_moves_proposals_by_predicted_build():
    props = _proposals("abcdefgh")
    same = np.ones(8)
    assert prefer_cheap_builds(props, same, 4) == props  # equal builds: the search's order
    # "a" is expected to build 8x slower than the median: its rank becomes weight x want x 3
    # (ties keep the given order).
    slow = same.copy()
    slow[0] = 8.0
    assert BUILD_RANK_WEIGHT * 4 * 3 == 3.0
    assert [p[0] for p in prefer_cheap_builds(props, slow, 4)] == list("bcadefgh")
    # Far slower falls a whole batch and no further (the log is clipped at 16x).
    slow[0] = 1000.0
    assert [p[0] for p in prefer_cheap_builds(props, slow, 4)] == list("bcdaefgh")
    # Against the task's typical build, not the proposals': when most proposals are slow, they
    # fall a batch behind the few that are not, and only BUILD_SLOW_SHARE of a batch (one here)
    # keeps its place.
    mostly_slow = np.full(8, 16.0)
    mostly_slow[[2, 6]] = 1.0
    assert [p[0] for p in prefer_cheap_builds(props, mostly_slow, 4)] == list("abcdefgh")
    assert [p[0] for p in prefer_cheap_builds(props, mostly_slow, 4, typical_s=1.0)] == list("cagbdefh")
    assert [p[0] for p in prefer_cheap_builds(props, mostly_slow, 16, typical_s=1.0)] == list("cgabdefh")
    # A build half the median's moves up weight x want = 1.5 places, past a near-equal proposal.
    cheap = same.copy()
    cheap[5] = 0.5
    assert [p[0] for p in prefer_cheap_builds(props, cheap, 6)] == list("abcdfegh")
    assert prefer_cheap_builds(props, cheap, 6, weight=0.0) == props
    # Within a factor of two of the median, builds are not told apart.
    near = same.copy()
    near[0], near[5] = 1.9, 0.6
    assert prefer_cheap_builds(props, near, 4) == props
    assert prefer_cheap_builds([], np.array([]), 4) == []


def test_slow_builds_share_a_budget_in_seconds():
    """Slow builds keep their place while they fit, together, in a batch's worth of typical
    builds (BUILD_SLOW_BUDGET); the first one always does. Two 5x builds fit a batch of 16;
    of two 40x builds (TBG:0's 7.5 s against 0.2), only the first."""
    props = _proposals("abcdefghijklmnopqrstuvwx")
    for factor, b_kept in ((5.0, True), (40.0, False)):
        predicted = np.ones(len(props))
        predicted[[0, 1]] = factor
        out = [p[0] for p in prefer_cheap_builds(props, predicted, 16, typical_s=1.0)]
        assert out.index("a") < len(props) - 2
        assert (out[-1] != "b") == b_kept, out


def test_slow_builds_wait_for_the_budget_once_the_task_has_seen_some():
    """The first slow build of a batch is let in whatever it costs only while the task has made
    fewer than BUILD_SLOW_LEARNED slow builds; afterwards a 40x build (TBG:0's 7.5 s against
    0.2) waits for a batch whose budget it fits, which a batch of 16 never has, while a 5x build
    still fits. The sampler counts the slow builds it has recorded."""
    props = _proposals("abcdefghijklmnopqrstuvwx")
    for factor, learned_kept in ((5.0, True), (40.0, False)):
        predicted = np.ones(len(props))
        predicted[0] = factor
        order = np.arange(len(props))
        kept, deferred = admit_slow_builds(order, predicted, 16, 1.0, learning=True)
        assert 0 in kept and not deferred
        kept, deferred = admit_slow_builds(order, predicted, 16, 1.0, learning=False)
        assert (0 in kept) == learned_kept and (deferred == [0]) != learned_kept
        out = [p[0] for p in prefer_cheap_builds(props, predicted, 16, typical_s=1.0, learning=False)]
        assert (out[-1] == "a") != learned_kept

    sampler = ModelGuidedSampler(small("GMM"), TARGET, "evolutionary", lambda: iter(()), rerank=False)
    assert sampler._learning_slow_builds()
    fast = {f"fast{i}": 0.2 for i in range(20)}
    sampler.record_builds(fast.items())
    assert sampler._learning_slow_builds()
    sampler.record_builds((f"slow{i}", 7.5) for i in range(BUILD_SLOW_LEARNED - 1))
    assert sampler._learning_slow_builds()
    sampler.record_builds([("slow_last", 1.0)])  # 5x the median
    assert not sampler._learning_slow_builds()


def test_code_sizes_count_strided_lanes_after_unrolling():
    """A transpose vectorized along its strided axis: every lane of its vector load is strided,
    and unrolling multiplies them (the pattern behind TBG:0's 8 s builds)."""
    from fastsearch import _core
    from fastsearch.ir.tir_import import program_json
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def transpose(a: T.Buffer((64, 32), "float32"), b: T.Buffer((32, 64), "float32")):
        for i, j in T.grid(32, 64):
            with T.sblock("b"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vj, vi]

    program = _core.Program(program_json(transpose))
    sch = tvm.s_tir.Schedule(transpose)
    i, j = sch.get_loops(sch.get_sblock("b"))
    i0, _ = sch.split(i, [None, 4])
    sch.vectorize(j)
    names = list(_core.CODE_SIZE_NAMES)
    assert names == ["log_statements", "log_strided_lanes", "log_vector_lanes", "log_max_copies"]

    def counts() -> dict[str, float]:
        (row,) = program.code_sizes([candidate_key(sch.trace)], postprocess=False)
        return {n.removeprefix("log_"): round(float(2**v - 1)) for n, v in zip(names, row, strict=True)}

    # One vector store (contiguous) and one vector load (stride 32) of 64 lanes each.
    assert counts() == {"statements": 1, "strided_lanes": 64, "vector_lanes": 128, "max_copies": 1}
    sch.annotate(i0, "pragma_auto_unroll_max_step", 16)
    # The 4-iteration loop under the pragma is copied; the outer one (8 x 4 steps) stays a loop.
    assert counts() == {"statements": 4, "strided_lanes": 256, "vector_lanes": 512, "max_copies": 4}
    assert np.isnan(program.code_sizes(["not a trace"])).all()


def _tvm_code_size(mod: tvm.IRModule, target: tvm.target.Target) -> tuple[int, int]:
    """(strided vector lanes, stores) in TVM's own lowering of ``mod`` up to UnrollLoop: the
    lanes of every ``Ramp`` whose stride is not 1 (LLVM expands those lane by lane), and the
    buffer stores left after unrolling."""
    from tvm import s_tir, tirx

    passes = [
        s_tir.transform.CanonicalizeLoop(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.StmtSimplify(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.NarrowDataType(32),
        s_tir.transform.LoopPartition(),
        tirx.transform.VectorizeLoop(True),
        tirx.transform.StorageRewrite(),
        s_tir.transform.HoistIfThenElse(),
        tirx.transform.UnrollLoop(),
        tirx.transform.StmtSimplify(),
        tirx.transform.RemoveNoOp(),
    ]
    with tvm.transform.PassContext(opt_level=3):
        lowered = tvm.ir.transform.Sequential(passes)(tirx.transform.BindTarget(target)(mod))
    text = lowered.script()
    ramps = re.finditer(r"T\.Ramp\((?:[^()]|\([^()]*\))*?, (\d+), (\d+)\)", text)
    strided = sum(int(m.group(2)) for m in ramps if m.group(1) != "1")
    return strided, len(re.findall(r"^\s+\w+\[[^\n]*\] = ", text, re.MULTILINE))


@pytest.mark.parametrize("family", ["TBG", "GMM", "C2D", "DEP", "NRM", "SFM"])
def test_code_sizes_agree_with_tvm_lowering(family):
    """Differential: on sampled candidates (postprocessed, auto-unrolled), the engine's count of
    strided vector lanes equals what TVM's vectorization and unrolling leave in the code, and so
    does its count of stores where no padding is computed (TVM's LoopPartition splits padded
    loops; the engine does not model that)."""
    from fastsearch import _core
    from fastsearch.ir.tir_import import program_json
    from fastsearch.search.sample import sample_candidates

    func = small(family)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    program = _core.Program(program_json(func))
    candidates = sample_candidates(func, target, 12, seed=3)
    assert len(candidates) >= 8
    rows = program.code_sizes([c.key for c in candidates])
    ours = [(round(float(2 ** row[1] - 1)), round(float(2 ** row[0] - 1))) for row in rows]
    theirs = [_tvm_code_size(c.schedule.mod, target) for c in candidates]
    assert [o[0] for o in ours] == [t[0] for t in theirs]
    if family not in ("C2D", "DEP"):
        assert [o[1] for o in ours] == [t[1] for t in theirs]
    if family == "TBG":  # transposes vectorized along their strided axis
        assert sum(o[0] > 0 for o in ours) >= 4


def test_build_time_model_ranks_unseen_builds():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(80, 35)).astype(np.float32)
    # Build seconds driven by two features (as unroll depth and body size drive LLVM's).
    secs = 0.1 * np.exp2(1.5 * rows[:, 3] + 0.5 * rows[:, 7] + rng.normal(scale=0.2, size=80))
    model = BuildTimeModel()
    assert not model.trained
    with pytest.raises(ValueError):
        model.predict(rows[:2])
    assert not model.fit(rows[: MIN_BUILDS - 1], secs[: MIN_BUILDS - 1])  # too few to learn from
    assert model.fit(rows[:40], secs[:40]) and model.trained_on == 40
    predicted = model.predict(rows[40:])
    assert predicted.shape == (40,) and (predicted > 0).all()
    ranks = [np.argsort(np.argsort(x)) for x in (predicted, secs[40:])]
    assert np.corrcoef(*ranks)[0, 1] > 0.8
    # Non-positive and non-finite times (builds that did not record) are left out.
    bad = secs[:40].copy()
    bad[:30] = np.nan
    assert not model.fit(rows[:40], bad)


def test_search_state_keeps_builds(tmp_path):
    state = SearchState(tmp_path, "fused/conv")
    assert state.load_builds() == {}
    state.add_builds([("k1", 0.25), ("k2", 7.5)])
    state.add_builds([])
    with state.builds_path.open("a") as f:
        f.write('{"key": "k3", "build')  # torn by a kill
    assert SearchState(tmp_path, "fused/conv").load_builds() == {"k1": 0.25, "k2": 7.5}


def _gmm_with_builds() -> tuple[Any, dict[str, float], ModelGuidedSampler, dict[str, float], float]:
    """A small GMM task with 48 (fake) measured candidates, its warm-up sampler, and builds that
    follow the code's size, as LLVM's do: the largest third takes 40x longer than the rest
    (statements above ``cut``)."""
    func = small("GMM")
    history: dict[str, float] = {}
    warmup = ModelGuidedSampler(
        func, TARGET, "evolutionary", lambda: history.items(), population=64, generations=2, build_cost=False
    )
    measure_until(warmup, func, TARGET, history, 48)
    statements = dict(zip(history, warmup.program.code_sizes(list(history))[:, 0], strict=True))
    cut = float(np.quantile(list(statements.values()), 2 / 3))
    builds = {k: (4.0 if statements[k] > cut else 0.1) for k in history}
    return func, history, warmup, builds, cut


def test_search_defers_candidates_expected_to_build_slowly(monkeypatch):
    """With builds recorded where the largest code builds 40x slower, the build-time model learns
    it, the search proposes BUILD_POOL times the batch, and the batch holds fewer such
    candidates than the same search without build cost."""
    func, history, warmup, builds, cut = _gmm_with_builds()
    assert 0 < sum(s > 1 for s in builds.values()) < len(builds) / 2  # typically fast
    pools: list[int] = []

    def spy(proposals, predicted, want, typical_s=None, weight=BUILD_RANK_WEIGHT, learning=True):
        pools.append(len(proposals))
        assert typical_s == pytest.approx(np.median(list(builds.values())))
        return prefer_cheap_builds(proposals, predicted, want, typical_s, weight, learning)

    monkeypatch.setattr(guided, "prefer_cheap_builds", spy)

    def batch(build_cost: bool) -> tuple[ModelGuidedSampler, list[int]]:
        s = ModelGuidedSampler(
            func,
            TARGET,
            "evolutionary",
            lambda: history.items(),
            population=64,
            generations=2,
            rerank=False,
            build_cost=build_cost,
        )
        s.genomes.update(warmup.genomes)
        s.record_builds(builds.items())
        out = s(func, TARGET, 16, 7, set(history))
        return s, [bool(row[0] > cut) for row in s.program.code_sizes([c.key for c in out])]

    _, off = batch(False)
    assert not pools
    sampler, on = batch(True)
    assert sampler.build_model is not None and sampler.build_model.trained
    assert pools == [BUILD_POOL * 16]
    slow_off, slow_on = sum(off), sum(on)
    assert slow_off > 0, off  # the search alone does propose them here
    assert slow_on < slow_off, (on, off)
    assert slow_on <= max(1, int(16 * BUILD_SLOW_SHARE))


def test_search_ranks_a_wider_pool_when_slow_builds_crowd_the_batch(monkeypatch):
    """When the pool's fast proposals cannot fill the batch, the deferred slow ones would: the
    sampler then ranks a pool BUILD_WIDE_POOL times the batch once, whose fast proposals fill it.
    Here the first pool is the batch itself and no slow build is allowed (room 0), so any slow
    proposal in it (the search alone proposes some here, as in the test above) crowds it."""
    func, history, warmup, builds, _ = _gmm_with_builds()
    spied: list[tuple] = []

    def spy(proposals, predicted, want, typical_s=None, weight=BUILD_RANK_WEIGHT, learning=True):
        spied.append((proposals, predicted, want, typical_s, weight, learning))
        return prefer_cheap_builds(proposals, predicted, want, typical_s, weight, learning)

    monkeypatch.setattr(guided, "prefer_cheap_builds", spy)
    monkeypatch.setattr(guided, "slow_build_room", lambda want: 0)
    monkeypatch.setattr(guided, "BUILD_POOL", 1)
    sampler = ModelGuidedSampler(
        func, TARGET, "evolutionary", lambda: history.items(), population=64, generations=2, rerank=False
    )
    sampler.genomes.update(warmup.genomes)
    sampler.record_builds(builds.items())
    out = sampler(func, TARGET, 16, 7, set(history))
    assert len(out) == 16
    assert [len(p) for p, *_ in spied] == [16, BUILD_WIDE_POOL * 16]
    assert sampler._deferred_builds(prefer_cheap_builds(*spied[0]), 16) > 0
    assert sampler._deferred_builds([(c.key, "", 0.0, "") for c in out], 16) == 0


def test_prior_build_cost_follows_strided_lanes():
    names = fastsearch_core.CODE_SIZE_NAMES
    rows = np.zeros((4, len(names)), dtype=np.float32)
    rows[:, names.index("log_statements")] = 12.0  # large code without strided lanes: typical
    rows[:, names.index("log_strided_lanes")] = [0.0, PRIOR_FREE_STRIDED_LOG2, 10.0, 14.0]
    assert prior_build_cost(rows).tolist() == [1.0, 1.0, 4.0, 64.0]
    rows[1, :] = np.nan  # code the engine could not size
    assert prior_build_cost(rows).tolist() == [1.0, 1.0, 4.0, 64.0]
    assert prior_build_cost(rows[:0]).shape == (0,)


def _prior_slow(sampler: ModelGuidedSampler, keys: list[str]) -> int:
    return int((np.log2(prior_build_cost(sampler.program.code_sizes(keys))) >= BUILD_SLOW_LOG2).sum())


def test_first_batch_keeps_prior_slow_builds_to_their_share():
    """Before a task has builds to learn from, the prior holds candidates with many strided
    vector lanes (TBG's transposes vectorized along their strided axis) to BUILD_SLOW_SHARE of
    the batch; the same first batches without build cost hold more of them."""
    func = load_workload("TBG:0").func
    room = max(1, int(16 * BUILD_SLOW_SHARE))
    off, on = [], []
    for seed in range(4):
        for build_cost, out in ((False, off), (True, on)):
            sampler = ModelGuidedSampler(
                func, HOST, "evolutionary", lambda: {}.items(), rerank=False, build_cost=build_cost
            )
            batch = sampler(func, HOST, 16, seed, set())
            assert len(batch) == 16
            out.append(_prior_slow(sampler, [c.key for c in batch]))
    assert max(on) <= room, on
    assert max(off) > room, off  # the search alone proposes them here


def test_search_proposes_the_cheapest_unroll_the_model_scores_alike():
    """A C1D:2 proposal with unroll 512 whose 80-step body the model scores alike at 64 is proposed
    with 64 (such kernels ran 0.99-1.01x as fast and built 7x faster); one whose 160-step body
    only 512 unrolls keeps it, as does one whose unroll-64 variant is already measured."""
    func = load_workload("C1D:2").func
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "skylake-avx512"})
    sampler = ModelGuidedSampler(func, target, "evolutionary", list, population=64)

    def genome(l_tiles: list[int], co_tiles: list[int], reduction: list[list[int]], unroll: int) -> str:
        rules = {"1": {"ComputeAt": {"host": 2, "depth": 1}}, "2": {"Tile": {"cache": "Global", "level": 0}}}
        tiles = {"2": [[1, 1, 1, 1], l_tiles, co_tiles, *reduction]}
        return json.dumps({"rules": rules, "tiles": tiles, "parallel": 32, "vectorize": 64, "unroll": unroll})

    def proposal(g: str) -> tuple[str, str, float, str]:
        moved = sampler.program.transfer_genomes([g])[0]
        assert moved is not None
        return (moved[0], moved[1], 1.0, "exploit")

    eighty = [[2, 4, 2, 4], [4, 2, 1, 32], [[1, 5], [256, 1]]]
    measured_eighty = [[4, 2, 2, 4], [4, 2, 1, 32], [[1, 5], [256, 1]]]
    one_sixty = [[8, 1, 1, 8], [4, 1, 4, 16], [[1, 5], [256, 1]]]
    proposals = [proposal(genome(*tiles, 3)) for tiles in (eighty, measured_eighty, one_sixty)]
    known = {proposal(genome(*measured_eighty, 2))[0]: 1e-4}
    out = sampler._cheapest_equal_unroll(proposals, known)
    assert [json.loads(g)["unroll"] for _, g, _, _ in out] == [2, 3, 3]
    assert out[0][0] == proposal(genome(*eighty, 2))[0]
    assert out[1:] == proposals[1:]
    assert [p[2:] for p in out] == [p[2:] for p in proposals]
