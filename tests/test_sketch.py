"""fastsearch's CPU sketches: every candidate is a schedule TVM accepts, builds, and computes
what the untuned function computes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import fastsearch
import numpy as np
import pytest
import tvm
from fastsearch import _core
from fastsearch.cli.main import load_workload
from fastsearch.ir.tir_import import program_json
from fastsearch.search.sample import Postprocessor, base_schedule, replay, replay_all, sample_candidates
from tvm.s_tir import Schedule
from tvm_ffi import structural_equal
from workloads import FAMILIES, small, suite

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def test_every_suite_candidate_applies_in_tvm():
    """All sampled candidates of all suite workloads replay in TVM and pass its postprocessors."""
    total = 0
    for family, idx, func in suite():
        keys = _core.Program(program_json(func)).sample_sketches(_core.Target(2), 8, idx)
        assert len(keys) == 8, f"{family}[{idx}]: only {len(keys)} distinct candidates"
        post = Postprocessor(func, TARGET)
        cands = sample_candidates(func, TARGET, 8, seed=idx, postprocessor=post)
        assert [c.key for c in cands] == keys, f"{family}[{idx}]: TVM refused a candidate"
        total += len(cands)
    assert total == 8 * 52


def _random_args(func, rng):
    args = []
    for param in func.params:
        shape = [int(d) for d in param.shape]
        args.append(rng.uniform(0.5, 1.5, size=shape).astype(str(param.dtype)))
    return args


def _run(mod, args):
    lib = tvm.compile(mod, target=TARGET)
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_candidates_compute_what_the_untuned_function_computes(family):
    func = small(family)
    rng = np.random.default_rng(0)
    args = _random_args(func, rng)
    expected = _run(tvm.IRModule({"main": func}), [a.copy() for a in args])
    cands = sample_candidates(func, TARGET, 4, seed=11)
    assert len(cands) == 4
    for cand in cands:
        got = _run(cand.schedule.mod, [a.copy() for a in args])
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"{family}: {cand.key}")


def test_gmm_matches_numpy():
    func = small("GMM")
    rng = np.random.default_rng(1)
    x, y, z = _random_args(func, rng)
    for cand in sample_candidates(func, TARGET, 3, seed=5):
        got = _run(cand.schedule.mod, [x, y, z.copy()])
        np.testing.assert_allclose(got, np.matmul(x, y), rtol=1e-4)


def test_same_seed_same_candidates_and_distinct():
    func = small("C2D")
    doc = program_json(func)
    a = _core.Program(doc).sample_sketches(_core.Target(2), 32, 3)
    b = _core.Program(doc).sample_sketches(_core.Target(2), 32, 3)
    c = _core.Program(doc).sample_sketches(_core.Target(2), 32, 4)
    assert a == b
    assert a != c
    assert len(set(a)) == len(a) == 32
    assert set(_core.Program(doc).sample_sketches(_core.Target(2), 32, 3, exclude=a[:16])).isdisjoint(a[:16])


def test_same_candidates_on_one_thread():
    """Determinism does not depend on the number of threads of the Rust pool."""
    func = small("CBR")
    doc = program_json(func)
    here = _core.Program(doc).sample_sketches(_core.Target(2), 64, 9)
    code = (
        "import sys, json; from fastsearch import _core; "
        "print(json.dumps(_core.Program(sys.stdin.read()).sample_sketches(_core.Target(2), 64, 9)))"
    )
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", code], input=doc, capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(out.stdout) == here


def test_public_sample_returns_traces_tvm_applies():
    func = small("GMM")
    traces = fastsearch.sample(func, TARGET, n=4, seed=0)
    assert len(traces) == 4
    for trace in traces:
        sch = Schedule(tvm.IRModule({"main": func}))
        trace.apply_to_schedule(sch, remove_postproc=False)
        assert "parallel" in sch.mod.script() or "vectorized" in sch.mod.script()


def test_sketch_rules_cover_the_families():
    """Tiling on contractions, rfactor on low-parallelism reductions, inlining of padding."""

    def kinds(func, n=64):
        found = set()
        for key in _core.Program(program_json(func)).sample_sketches(_core.Target(2), n, 0):
            found.update(inst[0] for inst in json.loads(key)[0])
        return found

    gmm = kinds(small("GMM"))
    assert {"SamplePerfectTile", "Split", "Reorder", "CacheWrite", "ReverseComputeAt"} <= gmm
    assert "RFactor" in kinds(small("NRM"))
    assert "ComputeInline" in kinds(small("C2D"))
    assert {"ComputeInline", "ReverseComputeAt"} <= kinds(small("CBR"))
    assert "ComputeAt" in kinds(small("SFM"))


def test_softmax_rfactors_under_the_normalisation_loop():
    """An rfactored reduction computed under its consumer's loop (the rule's `at`): both of
    softmax's reductions and the exponential run inside the normalisation's row loop, TVM
    accepts the schedule, and it computes softmax."""
    func = small("SFM")
    norm = 4  # blocks: maxelem, exp, expsum, norm (block 0 is the root)
    fused = []
    for trace, genome in _core.Program(program_json(func)).sample_genomes(
        _core.Target(2, vector_bytes=32), 400, 0
    ):
        rules = json.loads(genome)["rules"]
        rfactored_at = [
            (rules[b]["RFactor"]["at"], rules[b]["RFactor"].get("partial")) if "RFactor" in rules[b] else None
            for b in ("1", "3")
        ]
        under_rows = rfactored_at == [([norm, 0], None)] * 2
        if under_rows and rules["2"] == {"ComputeAt": {"host": norm, "depth": 0}}:
            fused.append(trace)
    assert fused, "no candidate computes both rfactored reductions under the row loop"
    sch = replay(func, fused[0], None)
    assert sch is not None
    row = sch.get_loops(sch.get_sblock("T_softmax_norm"))[0]
    blocks = [
        "T_softmax_maxelem_rf",
        "T_softmax_maxelem",
        "T_softmax_exp",
        "T_softmax_expsum_rf",
        "T_softmax_expsum",
    ]
    for name in blocks:
        assert sch.get(sch.get_loops(sch.get_sblock(name))[0]).same_as(sch.get(row)), name
    built = replay(func, fused[0], Postprocessor(func, TARGET))
    assert built is not None
    a = _random_args(func, np.random.default_rng(0))[0]
    got = _run(built.mod, [a, np.zeros(a.shape, a.dtype)])
    e = np.exp(a - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def _same_loop(sch, block, host, depth):
    return sch.get(sch.get_loops(sch.get_sblock(block))[depth]).same_as(
        sch.get(sch.get_loops(sch.get_sblock(host))[depth])
    )


@pytest.mark.parametrize(
    ("at", "partial"),
    [([4, 0], "Root"), ([4, 1], "Root"), ([4, 1], {"At": 0})],
    ids=[
        "final-under-rows-partial-at-root",
        "final-per-element-partial-at-root",
        "final-per-element-partial-per-row",
    ],
)
def test_softmax_places_final_reduction_apart_from_its_partial_results(at, partial):
    """MetaSchedule samples the compute location of an rfactor block apart from its final
    reduction's; the sketches offer the same: the expsum's final reduction under the
    normalisation's row or element loop, its partial sums at the root or under the row loop.
    TVM accepts each placement where the genome puts it, and the kernel computes softmax."""
    func = small("SFM")
    found = None
    for trace, genome in _core.Program(program_json(func)).sample_genomes(
        _core.Target(2, vector_bytes=32), 400, 0
    ):
        rule = json.loads(genome)["rules"]["3"]
        if "RFactor" in rule and rule["RFactor"]["at"] == at and rule["RFactor"].get("partial") == partial:
            found = trace
            break
    assert found is not None, (
        f"no candidate places the expsum's final reduction at {at} with partials {partial}"
    )
    sch = replay(func, found, None)
    assert sch is not None
    final, rf, norm = "T_softmax_expsum", "T_softmax_expsum_rf", "T_softmax_norm"
    assert _same_loop(sch, final, norm, at[1])
    if partial == "Root":
        assert not _same_loop(sch, rf, norm, 0)
    else:
        assert _same_loop(sch, rf, norm, partial["At"]) and not _same_loop(sch, rf, norm, at[1])
    built = replay(func, found, Postprocessor(func, TARGET))
    assert built is not None
    a = _random_args(func, np.random.default_rng(1))[0]
    got = _run(built.mod, [a, np.zeros(a.shape, a.dtype)])
    e = np.exp(a - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_transposes_are_inlined_computed_at_the_root_or_under_the_matmul():
    """TBG's two transposes read out of their loops' order, so MetaSchedule's AutoInline leaves
    them to a sampled compute location; the sketches place them the same three ways, and each
    placement builds and computes the transposed batch matmul."""
    func = small("TBG")
    program = program_json(func)
    names = [b["name"] for b in json.loads(program)["blocks"]]
    transposes = [str(names.index(n)) for n in ("query_T", "value_T")]
    by_rule: dict[str, str] = {}
    for trace, genome in _core.Program(program).sample_genomes(_core.Target(2, vector_bytes=32), 300, 0):
        rules = json.loads(genome)["rules"]
        for b in transposes:
            kind = rules[b] if isinstance(rules[b], str) else next(iter(rules[b]))
            by_rule.setdefault(kind, trace)
    assert set(by_rule) == {"Inline", "Root", "ComputeAt"}
    rng = np.random.default_rng(0)
    args = _random_args(func, rng)
    expected = _run(tvm.IRModule({"main": func}), [a.copy() for a in args])
    post = Postprocessor(func, TARGET)
    for kind, trace in by_rule.items():
        sch = replay(func, trace, post)
        assert sch is not None, kind
        got = _run(sch.mod, [a.copy() for a in args])
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=kind)


def _padding_root_over_inline(workload: str) -> float:
    """Median over sampled candidates with inlined padding of the analytical estimate with the
    padding moved to a pass of its own at the root, over the estimate as drawn."""
    prog = program_json(load_workload(workload).func)
    blocks = json.loads(prog)["blocks"]
    pad = next(str(i) for i, b in enumerate(blocks) if b["name"].lower().startswith("pad"))
    ratios = []
    for _, text in _core.Program(prog).sample_genomes(_core.Target(2, vector_bytes=64), 200, 0):
        g = json.loads(text)
        if g["rules"][pad] != "Inline":
            continue
        root = dict(g, rules={**g["rules"], pad: "Root"})
        inline_score, root_score = _core.Program(prog).analytical_scores(
            _core.Target(2, vector_bytes=64), [text, json.dumps(root)]
        )
        ratios.append(math.exp(inline_score - root_score))
    assert len(ratios) > 40
    return float(np.median(ratios))


def test_padding_at_the_root_costs_the_bytes_it_streams():
    # A small input (C1D: 64 x 256) padded in a pass of its own stays in cache: cheaper than a
    # select in the convolution's inner loops. A depthwise convolution over 112 x 112 x 64 does
    # little arithmetic per input byte: a pass that writes the padded copy to memory and reads
    # it back costs more than the convolution.
    assert _padding_root_over_inline("C1D:2") < 0.9
    assert _padding_root_over_inline("DEP:1") > 1.2


def test_replaying_in_threads_gives_the_schedules_replayed_one_by_one():
    """TVM releases the GIL while it replays; schedules replayed on 4 threads are the ones
    replayed in order on one, in the same order."""
    func = small("C2D")
    keys = _core.Program(program_json(func)).sample_sketches(_core.Target(2), 24, 3)
    post = Postprocessor(func, TARGET)
    base = base_schedule(func)
    one_by_one = [replay(base, k, post) for k in keys]
    threaded = replay_all(base, keys, post, threads=4)
    assert [s is None for s in threaded] == [s is None for s in one_by_one]
    for a, b in zip(one_by_one, threaded, strict=True):
        if a is not None:
            assert structural_equal(a.mod, b.mod)
            assert str(a.trace) == str(b.trace)
