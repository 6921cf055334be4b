"""Per-store features of CUDA candidates: fastsearch's engine against MetaSchedule's
``PerStoreFeature`` for CUDA targets (no GPU needed).

The candidates are postprocessed CUDA schedules, as MetaSchedule measures them, of every
te_workload family and shape, on the H100 tag (sm_90) and a smaller sm_75 GPU, from two sources:

* TVM's CUDA design spaces re-sampled with fresh seeds;
* fastsearch's GPU sketches (``Program.sample_gpu_sketches``), replayed by TVM;

each kept where TVM's CUDA postprocessors (VerifyGPUCode included) accept it. TVM extracts from
the scheduled module with a CUDA ``TuneContext`` (``is_gpu``, the thread extents, its lowering
passes); fastsearch replays the postprocessed trace through the public
``fastsearch.extract_features(func, traces, target)``. Row counts must be equal and values
within ``TOLERANCE`` (log scale), as on CPUs.
"""

from __future__ import annotations

import collections
import json
from typing import Any

import fastsearch
import numpy as np
import pytest
import tvm
from fastsearch import _core
from fastsearch.costmodel.feature_parity import FAMILIES, feature_difference
from fastsearch.costmodel.features import FEATURE_NAMES
from fastsearch.errors import InvalidTarget, UnsupportedTarget
from fastsearch.ir.target import cuda_limits
from fastsearch.ir.tir_import import program_json
from gpu_workloads import TARGETS, cuda_context
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

#: Per workload and target: design-space candidates kept (of at most ``SPACE_SEEDS`` seeds per
#: space) and sketch candidates drawn.
SPACE_CANDIDATES = 6
SPACE_SEEDS = 12
SKETCH_CANDIDATES = 8
#: The column of ``is_gpu``; blockIdx.x/y/z, threadIdx.x/y/z and vthread follow it.
IS_GPU = FEATURE_NAMES.index("is_gpu")
#: A CUDA target without the per-block limits (a ready Target: fastsearch fills them in only for
#: a dict naming the architecture).
CUDA_WITHOUT_LIMITS = tvm.target.Target({"kind": "cuda", "arch": "sm_50"})
#: The share of candidates whose rows must all equal TVM's: issue 27 asks for 0.99. The engine
#: gets 1,071 of 1,077 (0.994; 831 before it kept, as TVM does, the bindings of blocks that are
#: not an iterator map unsimplified after a split or fuse). The misses, printed by the test, are
#: integer op counts in a few padded copies' conditions.
REQUIRED = 0.99


def _context(func: Any, tname: str, design_spaces: bool) -> ms.TuneContext:
    return cuda_context(func, TARGETS[tname], design_spaces)


def _postprocessed(ctx: ms.TuneContext, sch: s_tir.Schedule) -> bool:
    """TVM's CUDA postprocessors on ``sch`` (VerifyGPUCode last): whether all accept it."""
    posts = ms.postproc.Postproc.create("cuda")
    for p in posts:
        p._initialize_with_tune_context(ctx)
    sch.enter_postproc()
    try:
        return all(p.apply(sch) for p in posts)
    except Exception:  # noqa: BLE001  (TVM's postprocessors raise several kinds; all reject)
        return False


def space_candidates(func: Any, tname: str, n: int = SPACE_CANDIDATES) -> list[s_tir.Schedule]:
    """Up to ``n`` of TVM's CUDA design spaces with fresh decisions (seeds 1, 2, ...), taking
    the spaces in turn, postprocessed by TVM."""
    ctx = _context(func, tname, design_spaces=True)
    spaces = ctx.generate_design_space()
    out: list[s_tir.Schedule] = []
    for seed in range(1, SPACE_SEEDS + 1):
        for space in spaces:
            if len(out) >= n:
                return out
            sch = s_tir.Schedule(func, seed=seed)
            s_tir.Trace(space.trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
            if _postprocessed(ctx, sch):
                out.append(sch)
    return out


def sketch_candidates(
    func: Any, tname: str, n: int = SKETCH_CANDIDATES, seed: int = 5
) -> list[s_tir.Schedule]:
    """``n`` of fastsearch's GPU sketch candidates, replayed and postprocessed by TVM."""
    ctx = _context(func, tname, design_spaces=False)
    keys = _core.Program(program_json(func)).sample_gpu_sketches(cuda_limits(TARGETS[tname]), n, seed)
    out = []
    for key in keys:
        sch = s_tir.Schedule(tvm.ir.load_json(tvm.ir.save_json(func)))
        s_tir.Trace.apply_json_to_schedule(json.loads(key), sch)
        if _postprocessed(ctx, sch):
            out.append(sch)
    return out


def compare(func: Any, tname: str, schs: list[s_tir.Schedule]) -> list[tuple[str, ...] | None]:
    """Per candidate: ``None`` where fastsearch's rows equal TVM's, else the differing columns
    (``("rows",)`` where the row counts differ, ``("error: ...",)`` where the engine fails)."""
    if not schs:
        return []
    ctx = _context(func, tname, design_spaces=False)
    cands = [ms.MeasureCandidate(s, []) for s in schs]
    theirs = [t.numpy() for t in ms.feature_extractor.PerStoreFeature().extract_from(ctx, cands)]
    names = [str(b.name) for b in func.params]
    same_names = len(names) != len(set(names))
    try:
        ours = fastsearch.extract_features(func, [s.trace for s in schs], TARGETS[tname])
    except fastsearch.FastsearchError:
        ours = []
        for s in schs:
            try:
                ours.append(fastsearch.extract_features(func, [s.trace], TARGETS[tname])[0])
            except fastsearch.FastsearchError as e:
                ours.append(f"error: {type(e).__name__}: {e}")
    out: list[tuple[str, ...] | None] = []
    for o, t in zip(ours, theirs):
        if isinstance(o, str):
            out.append((o,))
            continue
        d = feature_difference(o, t, same_names)
        out.append(None if d is None else d.columns)
    return out


def test_gpu_columns_on_a_matmul() -> None:
    """One family, both targets, both sources: every candidate equal, the GPU columns set."""
    func = te_workload.create_te_workload("GMM", 0)
    for tname in TARGETS:
        schs = space_candidates(func, tname, 3) + sketch_candidates(func, tname, 3)
        assert len(schs) >= 3
        results = compare(func, tname, schs)
        assert all(r is None for r in results), results
        rows = fastsearch.extract_features(func, [s.trace for s in schs], TARGETS[tname])
        for r in rows:
            assert np.all(r[:, IS_GPU] == 1.0)
            assert np.all(r[:, IS_GPU + 1] > 0) and np.all(r[:, IS_GPU + 4] > 0)  # blockIdx.x, threadIdx.x


def test_cpu_and_gpu_features_differ_on_one_trace() -> None:
    """The same postprocessed CUDA trace read for a CPU target has no GPU columns."""
    func = te_workload.create_te_workload("GMM", 0)
    (sch,) = sketch_candidates(func, "sm_90", 1)
    gpu = fastsearch.extract_features(func, [sch.trace], TARGETS["sm_90"])[0]
    cpu = fastsearch.extract_features(func, [sch.trace])[0]
    assert np.all(gpu[:, IS_GPU] == 1.0) and np.all(cpu[:, IS_GPU] == 0.0)


def test_cuda_targets_are_checked() -> None:
    func = te_workload.create_te_workload("GMM", 0)
    with pytest.raises(InvalidTarget):
        fastsearch.extract_features(func, [], "not-a-target")
    with pytest.raises(InvalidTarget):
        fastsearch.extract_features(func, [], CUDA_WITHOUT_LIMITS)
    with pytest.raises(UnsupportedTarget):
        fastsearch.extract_features(func, [], {"kind": "rocm"})


@pytest.mark.slow
def test_matches_per_store_feature_on_cuda_candidates() -> None:
    counts: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    misses: collections.Counter[tuple[str, ...]] = collections.Counter()
    examples: list[str] = []
    for family in FAMILIES:
        for idx in range(len(te_workload.CONFIGS[family][1])):
            func = te_workload.create_te_workload(family, idx)
            for tname in TARGETS:
                for source, schs in (
                    ("space", space_candidates(func, tname)),
                    ("sketch", sketch_candidates(func, tname)),
                ):
                    for r in compare(func, tname, schs):
                        c = counts[(family, source)]
                        c["n"] += 1
                        c["equal" if r is None else "differ"] += 1
                        if r is not None:
                            misses[r] += 1
                            if len(examples) < 20:
                                examples.append(f"{family}[{idx}] {tname} {source}: {r}")
    total = sum(c["n"] for c in counts.values())
    equal = sum(c["equal"] for c in counts.values())
    for (family, source), c in sorted(counts.items()):
        print(f"{family:4} {source:6} {c['equal']:4}/{c['n']:4} equal")
    for cols, k in misses.most_common():
        print(f"{k:4} candidates differ in {', '.join(cols)}")
    print("\n".join(examples))
    print(f"{equal}/{total} candidates equal ({equal / max(total, 1):.4f})")
    assert total >= 1000
    assert {f for f, _ in counts} == set(FAMILIES)
    assert equal >= REQUIRED * total
