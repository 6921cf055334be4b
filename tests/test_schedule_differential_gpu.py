"""Differential test of the schedule engine against TVM on CUDA schedules (no GPU needed).

The CUDA counterpart of ``test_schedule_differential.py``. Each case is a trace TVM applied to a
workload of the te_workload suite (every family, every listed shape), from two sources:

* TVM's CUDA design spaces (multi-level tiling SSSRRSRS bound to blockIdx/vthread/threadIdx,
  shared-memory read caches with cooperative fetch, local write caches, cross-thread
  reduction, auto-bind, unroll; on sm_90 also the software-pipelined variants), re-sampled
  with fresh random decisions, on two targets: the H100 tag (sm_90) and a smaller sm_75 GPU;
* random sequences of primitives built through TVM's schedule API, with random thread
  bindings, which leave blocks unbound for RewriteUnboundBlock to bind;
* fastsearch's own GPU sketches (``Program.sample_gpu_sketches``) on both targets.

For every trace, the loop nests (loop order, extents, kinds, thread bindings, annotations,
block placement, allocated buffers with their storage scopes) are compared three ways:

* ``pre``: the trace before postprocessing, replayed by our engine;
* ``post-replay``: the trace after TVM's CUDA postprocessors (DisallowDynamicLoop,
  RewriteCooperativeFetch, RewriteUnboundBlock, RewriteParallelVectorizeUnroll,
  RewriteReductionBlock), replayed by our engine;
* ``post-ours``: the pre-postprocessing trace with the engine's own CUDA postprocessors.

Where TVM's postprocessors refuse a schedule (a dynamic loop, or an unsupported binding), the
engine's postprocessors must refuse it too, with ``ScheduleError``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fastsearch
import pytest
import tvm
from fastsearch import _core
from fastsearch.ir.loop_nest import first_difference, loop_nest_from_tvm, trace_json
from fastsearch.ir.target import cuda_limits
from fastsearch.ir.tir_import import program_json
from gpu_workloads import FAMILIES, TARGETS, cuda_context, resampled_design_spaces
from test_schedule_differential import _OPS as CPU_OPS
from test_schedule_differential import Case, _is_dynamic, check_family
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

pytestmark = pytest.mark.slow

#: Fresh random decisions per design space and target: 53 workloads x ~2.9 spaces x 2 targets x 3.
SEEDS = (1, 2, 3)
#: TVM's default CUDA postprocessors but VerifyGPUCode (which only accepts or rejects).
SCHEDULING_POSTPROCS = (
    "DisallowDynamicLoop",
    "RewriteCooperativeFetch",
    "RewriteUnboundBlock",
    "RewriteParallelVectorizeUnroll",
    "RewriteReductionBlock",
)


@dataclass
class GpuCase(Case):
    """A case with the outcome of TVM's CUDA postprocessors: "ok", "refused" or "error"."""

    postprocessed: str = "ok"


def gpu_target(target: tvm.target.Target) -> _core.GpuTarget:
    return cuda_limits(target)


_context = cuda_context


def _postprocess(ctx: ms.TuneContext, sch: s_tir.Schedule) -> str:
    """TVM's CUDA postprocessors (VerifyGPUCode left out) on ``sch``: ``"ok"``, ``"refused"``
    where one returns False, or ``"error"`` where one raises (RewriteUnboundBlock finds blocks by
    name, so two blocks of one name from the fuzzer's cache reads break it; it also asserts
    that no block has blockIdx without threadIdx). An error leaves nothing to compare."""
    posts = [p for p in ms.postproc.Postproc.create("cuda") if type(p).__name__ in SCHEDULING_POSTPROCS]
    assert len(posts) == len(SCHEDULING_POSTPROCS)
    for p in posts:
        p._initialize_with_tune_context(ctx)
    try:
        return "ok" if all(p.apply(sch) for p in posts) else "refused"
    except (tvm.error.InternalError, s_tir.ScheduleError, ValueError):
        return "error"


def _case(
    workload: str, source: str, func: Any, sch: s_tir.Schedule, ctx: ms.TuneContext, label: str
) -> GpuCase:
    case = GpuCase(
        workload=workload,
        source=source,
        func=func,
        pre_trace=trace_json(sch.trace),
        pre_nest=loop_nest_from_tvm(sch.mod["main"]),
        label=label,
    )
    outcome = _postprocess(ctx, sch)
    if outcome == "ok":
        case.post_trace = trace_json(sch.trace)
        case.post_nest = loop_nest_from_tvm(sch.mod["main"])
    case.postprocessed = outcome
    return case


def design_space_traces(workload: str, func: Any) -> Iterator[tuple[str, GpuCase]]:
    """TVM's CUDA design spaces of ``func`` on each target, re-sampled under several seeds."""
    for tname, target in TARGETS.items():
        for si, seed, ctx, sch in resampled_design_spaces(func, target, SEEDS):
            yield tname, _case(workload, "design-space", func, sch, ctx, f"{tname} space {si} seed {seed}")


def _op_bind(sch: Any, rng: random.Random) -> None:
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    blocks_of_loop = rng.choice(blocks)
    loops = list(sch.get_loops(blocks_of_loop))
    if not loops:
        raise ValueError("block without loops")
    i = rng.randrange(len(loops))
    tag = "blockIdx.x" if i == 0 and rng.random() < 0.7 else "threadIdx.x"
    # Loops of one tag with different extents, or nested in one another, are no kernel TVM
    # lowers correctly: LiftThreadBinding silently gives them all one loop's extent, and
    # VerifyGPUCode then passes what computes the wrong result (the engine rejects it). The
    # fuzzer leaves them out, so that both verdicts mean the same thing.
    extent = int(sch.get(loops[i]).extent)
    for block in blocks:
        for j, other in enumerate(sch.get_loops(block)):
            binding = sch.get(other).thread_binding
            if binding is None or str(binding.thread_tag) != tag:
                continue
            if int(sch.get(other).extent) != extent or (block == blocks_of_loop and j != i):
                raise ValueError(f"another loop is bound to {tag}")
    sch.bind(loops[i], tag)


def _check_extents(sch: Any) -> None:
    """Refuses a schedule whose loops around a block iterate 2**31 times or more: TVM's 32-bit
    loop variables would wrap around when they are fused (the engine refuses such a fuse)."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        total = 1
        for loop in sch.get_loops(block):
            total *= int(sch.get(loop).extent)
        if total > 2**31 - 1:
            raise ValueError("the loops around a block iterate more than 2**31 - 1 times")


#: The CPU fuzzer's primitives with thread bindings in place of parallel/vectorize/unroll.
GPU_OPS = [op for op in CPU_OPS if op.__name__ != "_op_kind"] + [_op_bind, _op_bind]
FUZZ_TRACES_PER_WORKLOAD = 6
FUZZ_STEPS = 8


def random_primitive_traces(workload: str, func: Any) -> Iterator[tuple[str, GpuCase]]:
    """Random primitive sequences TVM accepts, with random thread bindings, on the H100."""
    target = TARGETS["sm_90"]
    ctx = _context(func, target, design_spaces=False)
    for t in range(FUZZ_TRACES_PER_WORKLOAD):
        rng = random.Random(f"gpu/{workload}/{t}")
        sch = s_tir.Schedule(func)
        for _ in range(FUZZ_STEPS):
            before = sch.trace.as_json()
            try:
                rng.choice(GPU_OPS)(sch, rng)
                _check_extents(sch)
            except (RuntimeError, ValueError, IndexError, TypeError):  # refused: back to before the step
                sch = s_tir.Schedule(func)
                s_tir.Trace.apply_json_to_schedule(before, sch)
        yield "sm_90", _case(workload, "random-primitives", func, sch, ctx, f"sequence {t}")


#: fastsearch's GPU sketches drawn per workload and target.
GPU_SKETCH_TRACES_PER_WORKLOAD = 3


def gpu_sketch_traces(workload: str, func: Any) -> Iterator[tuple[str, GpuCase]]:
    """Candidates drawn from fastsearch's GPU sketches (Rust) on each target, replayed by TVM."""
    for tname, target in TARGETS.items():
        ctx = _context(func, target, design_spaces=False)
        program = _core.Program(program_json(func))
        keys = program.sample_gpu_sketches(gpu_target(target), GPU_SKETCH_TRACES_PER_WORKLOAD, 17)
        for i, key in enumerate(keys):
            sch = s_tir.Schedule(tvm.ir.load_json(tvm.ir.save_json(func)))
            s_tir.Trace.apply_json_to_schedule(json.loads(key), sch)
            yield (
                tname,
                _case(workload, "fastsearch-gpu-sketch", func, sch, ctx, f"{tname} sketch candidate {i}"),
            )


TRACE_SOURCES: list[Callable[[str, Any], Iterator[tuple[str, GpuCase]]]] = [
    design_space_traces,
    random_primitive_traces,
    gpu_sketch_traces,
]


def _compare(
    case: GpuCase, trace: str, expected: dict[str, Any] | None, gpu: _core.GpuTarget | None
) -> str | None:
    """``None`` when the engine agrees with TVM (``expected`` None: TVM refused the schedule)."""
    refused = expected is None or _is_dynamic(expected)
    try:
        got = json.loads(
            _core.Program(program_json(case.func)).apply_trace(trace, postprocess=gpu is not None, gpu=gpu)
        )
    except fastsearch.ScheduleError as e:
        return None if refused else f"engine refused the trace: {e}"
    except fastsearch.FastsearchError as e:
        return f"engine failed: {type(e).__name__}: {e}"
    if refused:
        return "TVM refused the schedule but the engine accepted it"
    assert expected is not None
    return first_difference(expected, got)


_RESULTS: dict[str, list[tuple[GpuCase, str, str | None]]] = {}


def _family_results(family: str) -> list[tuple[GpuCase, str, str | None]]:
    if family not in _RESULTS:
        out = []
        for idx in range(len(te_workload.CONFIGS[family][1])):
            func = te_workload.create_te_workload(family, idx)
            for source in TRACE_SOURCES:
                for tname, case in source(f"{family}[{idx}]", func):
                    out.append((case, "pre", _compare(case, case.pre_trace, case.pre_nest, None)))
                    if case.post_trace is not None:
                        out.append(
                            (case, "post-replay", _compare(case, case.post_trace, case.post_nest, None))
                        )
                    if case.postprocessed != "error" and not _is_dynamic(case.pre_nest):
                        gpu = gpu_target(TARGETS[tname])
                        out.append((case, "post-ours", _compare(case, case.pre_trace, case.post_nest, gpu)))
        _RESULTS[family] = out
    return _RESULTS[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_matches_tvm_on_cuda(family: str) -> None:
    check_family(family, list(_family_results(family)))


def test_at_least_600_cuda_traces() -> None:
    total = sum(len({id(c) for c, _, _ in _family_results(f)}) for f in FAMILIES)
    assert total >= 600, f"only {total} traces across the suite"


def test_the_unbound_block_rewrite_is_exercised() -> None:
    """The random sequences leave blocks unbound, so post-ours really runs RewriteUnboundBlock:
    at least a few dozen of their postprocessed nests bind a loop the trace did not."""
    rewritten = 0
    for family in FAMILIES:
        for case, mode, diff in _family_results(family):
            if mode == "post-ours" and case.source == "random-primitives" and diff is None:
                pre, post = json.dumps(case.pre_nest), json.dumps(case.post_nest)
                rewritten += post.count('"blockIdx.x"') > pre.count('"blockIdx.x"')
    assert rewritten >= 30, f"only {rewritten} random sequences had blocks bound by RewriteUnboundBlock"


def test_gpu_target_rejects_non_positive_limits() -> None:
    with pytest.raises(ValueError, match="warp_size"):
        _core.GpuTarget(max_threads_per_block=1024, warp_size=0, max_shared_memory_per_block=49152)
