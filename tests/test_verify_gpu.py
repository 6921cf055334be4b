"""VerifyGPUCode parity: the engine's verdict on CUDA candidates equals TVM's (no GPU needed).

TVM's verdict is MetaSchedule's default CUDA postprocessors run in order on TVM's schedule,
VerifyGPUCode last (it lowers the function and checks threads per block, shared memory per
block, vector width and thread-extent bounds); a postprocessor that refuses the schedule or
raises rejects it too. Ours is ``_core.Program.verify_gpu`` on the trace before postprocessing:
the engine's own CUDA postprocessors, then its model of VerifyGPUCode.

Candidates: TVM's CUDA design spaces of every te_workload family and shape, re-sampled with
fresh random decisions on the H100 (sm_90, with software-pipelined spaces) and on a smaller
sm_75 GPU, and random primitive sequences with thread bindings (their unbound blocks bound by
RewriteUnboundBlock).
"""

from __future__ import annotations

import json
from typing import Any

import fastsearch
import pytest
import tvm
from fastsearch import _core
from fastsearch.ir.loop_nest import trace_json
from fastsearch.ir.tir_import import program_json
from gpu_workloads import FAMILIES, TARGETS, resampled_design_spaces
from gpu_workloads import cuda_context as _context
from test_schedule_differential_gpu import gpu_target, random_primitive_traces
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

pytestmark = pytest.mark.slow

SEEDS = range(1, 9)


#: TVM's verdict where it cannot judge the schedule (see ``_tvm_verdict``).
UNJUDGED = "unjudged"
#: Where TVM lowers a kernel whose loops of one thread tag have different extents.
MERGED = "merged"


def _merged_thread_extents(func: Any) -> bool:
    """Whether a kernel of ``func`` binds one thread tag with two extents: LiftThreadBinding then
    gives all of them the extent of one, silently, and VerifyGPUCode judges that other kernel."""

    def bound_loops(stmt: Any, out: list[tuple[str, int]]) -> None:
        if isinstance(stmt, tvm.tirx.For) and stmt.thread_binding is not None:
            out.append((str(stmt.thread_binding.thread_tag), int(stmt.extent)))
        for child in _children(stmt):
            bound_loops(child, out)

    def visit(stmt: Any) -> bool:
        if isinstance(stmt, tvm.tirx.For) and stmt.thread_binding is not None:
            loops: list[tuple[str, int]] = []
            bound_loops(stmt, loops)
            return any(len({e for t, e in loops if t == tag}) > 1 for tag, _ in loops)
        return any(visit(child) for child in _children(stmt))

    return visit(func.body)


def _children(stmt: Any) -> list[Any]:
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, tvm.tirx.For):
        return [stmt.body]
    if isinstance(stmt, s_tir.SBlockRealize):
        return [stmt.block.body]
    return []


def _tvm_verdict(ctx: ms.TuneContext, sch: s_tir.Schedule) -> bool | str:
    """TVM's verdict: True, False, ``UNJUDGED`` where RewriteUnboundBlock cannot find a block by
    name (the random sequences' repeated cache reads give two blocks one name), or ``MERGED``
    (``_merged_thread_extents``)."""
    posts = ms.postproc.Postproc.create("cuda")
    for p in posts:
        p._initialize_with_tune_context(ctx)
    try:
        for p in posts[:-1]:
            if not p.apply(sch):
                return False
    except Exception as e:  # noqa: BLE001  (TVM's postprocessors raise several kinds; all reject)
        return UNJUDGED if "blocks with the name" in str(e) else False
    if _merged_thread_extents(sch.mod["main"]):
        return MERGED
    return bool(posts[-1].apply(sch))


def _tvm_passes(ctx: ms.TuneContext, sch: s_tir.Schedule) -> bool:
    return _tvm_verdict(ctx, sch) is True


def _candidates(family: str) -> list[tuple[str, Any, str, str, bool | str]]:
    """(label, func, target name, trace before postprocessing, TVM's verdict) per candidate."""
    out = []
    for idx in range(len(te_workload.CONFIGS[family][1])):
        func = te_workload.create_te_workload(family, idx)
        for tname, target in TARGETS.items():
            for si, seed, ctx, sch in resampled_design_spaces(func, target, SEEDS):
                label = f"{family}[{idx}] {tname} space {si} seed {seed}"
                out.append((label, func, tname, trace_json(sch.trace), _tvm_verdict(ctx, sch)))
        for tname, case in random_primitive_traces(f"{family}[{idx}]", func):
            sch = s_tir.Schedule(func)
            s_tir.Trace.apply_json_to_schedule(json.loads(case.pre_trace), sch)
            ctx = _context(func, TARGETS[tname], design_spaces=False)
            verdict = _tvm_verdict(ctx, sch)
            if verdict != UNJUDGED:
                out.append((f"{case.workload} {case.label}", func, tname, case.pre_trace, verdict))
    return out


_RESULTS: dict[str, list[tuple[str, bool | str, str | None]]] = {}


def _family_results(family: str) -> list[tuple[str, bool | str, str | None]]:
    if family not in _RESULTS:
        out = []
        for label, func, tname, pre, tvm_verdict in _candidates(family):
            ours = _core.Program(program_json(func)).verify_gpu([pre], gpu=gpu_target(TARGETS[tname]))[0]
            out.append((label, tvm_verdict, ours))
        _RESULTS[family] = out
    return _RESULTS[family]


def _agrees(tvm_verdict: bool | str, ours: str | None) -> bool:
    if tvm_verdict == MERGED:  # TVM judges a kernel other than the schedule's; the engine rejects it
        return ours is not None and "bound to" in ours
    return tvm_verdict == (ours is None)


@pytest.mark.parametrize("family", FAMILIES)
def test_verdicts_match_tvm(family: str) -> None:
    results = _family_results(family)
    passed = sum(v is True for _, v, _ in results)
    merged = sum(v == MERGED for _, v, _ in results)
    print(f"\n{family}: {len(results)} candidates; TVM passes {passed}; merged thread extents {merged}")
    wrong = [(label, v, ours) for label, v, ours in results if not _agrees(v, ours)]
    if wrong:
        label, v, ours = wrong[0]
        pytest.fail(
            f"{len(wrong)} of {len(results)} verdicts differ. First: {label}: TVM says {v}, "
            f"the engine {'passes it' if ours is None else 'says: ' + ours}"
        )


def test_at_least_2000_candidates_with_both_verdicts() -> None:
    results = [r for f in FAMILIES for r in _family_results(f)]
    passed = sum(v is True for _, v, _ in results)
    assert len(results) >= 2000, f"only {len(results)} candidates"
    assert passed >= 300 and len(results) - passed >= 300, f"{passed} of {len(results)} pass"


def test_the_rejections_name_their_reason() -> None:
    """The kinds of rejection TVM's spaces and the random sequences produce all show up, each
    with the reason the engine wrote."""
    reasons = " | ".join(ours for f in FAMILIES for _, _, ours in _family_results(f) if ours is not None)
    for kind in ("bytes of shared memory", "outside its bounds", "threads per block", "statements for"):
        assert kind in reasons, f"no rejection for {kind!r}"


def _cuda(threads: int, shared_bytes: int) -> tvm.target.Target:
    return tvm.target.Target(
        {
            "kind": "cuda",
            "arch": "sm_75",
            "max_threads_per_block": threads,
            "max_shared_memory_per_block": shared_bytes,
            "thread_warp_size": 32,
        }
    )


def _hand_tiled_gemm(threads: int) -> tuple[Any, s_tir.Schedule]:
    """GMM (1, 128, 128, 128): rows to thread blocks, ``threads`` threads along the columns,
    the block's row of X (128 floats, 512 bytes) fetched into shared memory by its threads."""
    func = te_workload.create_te_workload("GMM", 0)
    sch = s_tir.Schedule(func)
    z = sch.get_sblock("Z")
    _, i, j, _ = sch.get_loops(z)
    _, j_inner = sch.split(j, [None, threads])
    sch.bind(i, "blockIdx.x")
    sch.bind(j_inner, "threadIdx.x")
    x_shared = sch.cache_read(z, 0, "shared")
    sch.compute_at(x_shared, i)
    lanes = sch.sample_categorical([1], [1.0])  # MetaSchedule annotates a sampled value
    sch.annotate(x_shared, "meta_schedule.cooperative_fetch", lanes)
    return func, sch


@pytest.mark.parametrize(
    ("threads", "limit_threads", "limit_shared", "reason"),
    [
        (128, 1024, 49152, None),
        (128, 64, 49152, "128 threads per block"),
        (128, 1024, 256, "512 bytes of shared memory"),
        (16, 1024, 512, None),
    ],
)
def test_hand_made_limits(threads: int, limit_threads: int, limit_shared: int, reason: str | None) -> None:
    """Threads per block and shared memory per block against the target's limits, with TVM's
    verdict on the same schedule and target."""
    func, sch = _hand_tiled_gemm(threads)
    target = _cuda(limit_threads, limit_shared)
    pre = trace_json(sch.trace)
    assert _tvm_passes(_context(func, target, design_spaces=False), sch) == (reason is None)
    (verdict,) = _core.Program(program_json(func)).verify_gpu([pre], gpu=gpu_target(target))
    if reason is None:
        assert verdict is None
    else:
        assert verdict is not None and reason in verdict, verdict


def test_an_unreadable_trace_raises() -> None:
    func = te_workload.create_te_workload("GMM", 0)
    gpu = _core.GpuTarget(max_threads_per_block=1024, warp_size=32, max_shared_memory_per_block=49152)
    with pytest.raises(fastsearch.InvalidTrace):
        _core.Program(program_json(func)).verify_gpu(["not json"], gpu=gpu)
