"""MetaSchedule's per-store features (``PerStoreFeature``: 164 values per stored buffer),
computed in Rust on fastsearch's schedule engine instead of TVM's lowered IR, for CPU targets
and CUDA ones (the GPU columns, and TVM's lowering for GPUs: cross-thread reductions, thread
loops unified per kernel).

Each trace is replayed by the engine (its postprocessing instructions included, as recorded
after ``EnterPostproc``), then the features are read off the engine's state with the effect of
TVM's pre-extraction lowering passes modelled. Candidates run in parallel with the GIL
released.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tvm.s_tir import Trace

from fastsearch import _core
from fastsearch.errors import FastsearchError, InvalidTrace, ScheduleError
from fastsearch.ir.loop_nest import features_of_traces, trace_json, traces_text
from fastsearch.ir.target import cuda_limits, require_searchable, resolve_target, target_kind
from fastsearch.ir.tir_import import imported_program

N_FEATURES = 164

# The name of each column, in PerStoreFeature's order.
FEATURE_NAMES = (
    [
        "float_mad",
        "float_add_sub",
        "float_mul",
        "float_div_mod",
        "float_cmp",
        "float_math_func",
        "float_other_func",
        "int_mad",
        "int_add_sub",
        "int_mul",
        "int_div_mod",
        "int_cmp",
        "int_math_func",
        "int_other_func",
        "bool_op",
        "select_op",
    ]
    + [
        f"{kind}.{f}"
        for kind in ("vectorize", "unroll", "parallel")
        for f in ("num", "prod", "len", *(f"pos{i}" for i in range(8)))
    ]
    + [
        "is_gpu",
        "blockIdx.x",
        "blockIdx.y",
        "blockIdx.z",
        "threadIdx.x",
        "threadIdx.y",
        "threadIdx.z",
        "vthread",
    ]
    + [
        f"buffer{i}.{f}"
        for i in range(5)
        for f in (
            "read",
            "write",
            "read_write",
            "bytes",
            "unique_bytes",
            "lines",
            "unique_lines",
            "reuse_loop",
            "reuse_serial",
            "reuse_none",
            "reuse_dis_iter",
            "reuse_dis_bytes",
            "reuse_ct",
            "bytes_d_reuse_ct",
            "unique_bytes_d_reuse_ct",
            "lines_d_reuse_ct",
            "unique_lines_d_reuse_ct",
            "stride",
        )
    ]
    + [f"arith_intensity_curve{i}" for i in range(10)]
    + ["alloc_size", "alloc_prod", "alloc_outer_prod", "alloc_inner_prod"]
    + ["outer_prod", "num_loops", "auto_unroll_max_step"]
)


def extract_features_json(
    program: str | _core.Program, traces: Sequence[str], gpu: _core.GpuTarget | None = None
) -> list[np.ndarray]:
    """Features of each trace (JSON text) on a program model (an imported ``_core.Program``, or
    the JSON of ``fastsearch.ir.tir_import.program_json``): one ``(n_stores, 164)`` float32
    array each. With ``gpu`` (:func:`fastsearch.ir.target.cuda_limits` of a CUDA target), the
    features ``PerStoreFeature`` extracts for that target."""
    if isinstance(program, str):
        program = _core.Program(program)
    return program.extract_features(list(traces), gpu=gpu)


def extract_features_each(
    program: str | _core.Program, traces: Sequence[str], gpu: _core.GpuTarget | None = None
) -> list[np.ndarray | FastsearchError]:
    """:func:`extract_features_json` of each trace, or the engine's error for one it cannot
    replay: the batch first, then, when it fails as a whole, one trace at a time."""
    try:
        return list(extract_features_json(program, traces, gpu))
    except FastsearchError:
        out: list[np.ndarray | FastsearchError] = []
        for text in traces:
            try:
                out.append(extract_features_json(program, [text], gpu)[0])
            except FastsearchError as exc:
                out.append(exc)
        return out


def extract_features(mod: Any, traces: Sequence[Any], target: Any = None) -> list[np.ndarray]:
    """Features of each ``tvm.s_tir.Trace`` (or its JSON) applied to ``mod`` (a PrimFunc or an
    IRModule holding one), in the row order of MetaSchedule's ``PerStoreFeature``.

    ``target`` is the target the candidates were scheduled for (a CPU one by default): for a
    CUDA target, the traces are replayed as CUDA schedules and the features are those
    ``PerStoreFeature`` extracts for GPUs (thread extents, TVM's GPU lowering). A CUDA target
    without its limits is an ``InvalidTarget``; other GPU targets are refused."""
    gpu = None
    if target is not None:
        resolved = resolve_target(target)
        if target_kind(resolved) == "cuda":
            gpu = cuda_limits(resolved)  # InvalidTarget where the target lacks a limit
        else:
            # An unknown or malformed target is an InvalidTarget naming it, a GPU one unsupported.
            require_searchable(resolved, "fastsearch.extract_features")
    program = imported_program(mod)
    if traces and all(isinstance(t, Trace) for t in traces):
        # Each trace written by TVM and replayed on the same engine thread, no text between.
        try:
            direct = features_of_traces(program, traces, gpu)
        except (InvalidTrace, ScheduleError):
            direct = None  # the path below names the trace that fails
        if direct is not None:
            left = [t for t, rows in zip(traces, direct) if rows is None]
            done = iter(_extract_batch(program, traces_text(left), gpu) if left else [])
            return [rows if rows is not None else next(done) for rows in direct]
    # TVM Traces as text (traces_text); text and as_json() values are taken as they are.
    tvm_traces = [t for t in traces if isinstance(t, Trace)]
    converted = iter(traces_text(tvm_traces))
    texts = [
        next(converted) if isinstance(t, Trace) else t if isinstance(t, str) else trace_json(t)
        for t in traces
    ]
    return _extract_batch(program, texts, gpu)


def _extract_batch(
    program: _core.Program, texts: Sequence[str], gpu: _core.GpuTarget | None = None
) -> list[np.ndarray]:
    try:
        return program.extract_features(list(texts), gpu=gpu)
    except (InvalidTrace, ScheduleError) as exc:
        raise _name_bad_trace(program, texts, exc, gpu) from exc


def _name_bad_trace(
    program: _core.Program, texts: Sequence[str], exc: Exception, gpu: _core.GpuTarget | None
) -> Exception:
    """The engine's error for a batch names no trace: find the first one that fails alone."""
    for i, text in enumerate(texts):
        try:
            program.apply_trace(text, gpu=gpu)
        except (InvalidTrace, ScheduleError) as one:
            excerpt = text if len(text) <= 80 else text[:77] + "..."
            return type(one)(f"trace {i} of {len(texts)} ({excerpt!r}): {one}")
    return exc


def design_space_candidates(func: Any, target: Any, n: int) -> list[Any]:
    """Up to ``n`` candidates from MetaSchedule's own design spaces for ``func`` (a PrimFunc):
    each space's trace replayed without its decisions on a schedule seeded 1, 2, ..., then
    MetaSchedule's postprocessors for the target. Deterministic for a given function."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    mod = tvm.IRModule({"main": func})
    kind = "cuda" if str(target.kind.name) == "cuda" else "llvm"
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", num_threads=1)
    spaces = ctx.generate_design_space()
    postprocs = ms.postproc.Postproc.create(kind)
    for p in postprocs:
        p._initialize_with_tune_context(ctx)
    out: list[Any] = []
    seed = 1
    while len(out) < n and seed <= 4 * n:
        space = spaces[seed % len(spaces)]
        sch = tvm.s_tir.Schedule(mod, seed=seed)
        seed += 1
        try:
            tvm.s_tir.Trace(list(space.trace.insts), {}).apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()
            if not all(p.apply(sch) for p in postprocs):
                continue
        except Exception:  # noqa: BLE001, S112  (TVM raises ValueError, RuntimeError, tvm.error.*)
            continue
        out.append(sch)
    return out
