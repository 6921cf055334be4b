"""Differential test of fastsearch's Rust schedule engine against TVM.

Each case is a trace TVM applied to a workload of the te_workload suite (every family, every
listed shape), from two sources: TVM's own CPU design spaces re-sampled with fresh random
decisions, and random sequences of primitives built through TVM's schedule API (TVM validates
each step; refused steps are dropped). For every trace, three comparisons of the loop
nest (loop order and nesting, extents, kinds, annotations, block placement and names, allocated
buffers):

* ``pre``: the trace before postprocessing, replayed by our engine;
* ``post-replay``: the trace after TVM's postprocessors RewriteParallelVectorizeUnroll and
  RewriteReductionBlock (the instructions they recorded), replayed by our engine;
* ``post-ours``: the pre-postprocessing trace replayed by our engine with its own
  implementation of those postprocessors.

Where TVM's schedule has a loop with a non-constant extent (MetaSchedule's DisallowDynamicLoop
postprocessor rejects it), the engine must refuse the trace with ``ScheduleError``.

More trace sources (for example fastsearch's own sketches) plug in by adding a generator to
``TRACE_SOURCES``: it yields :class:`Case` objects for a (family, shape index, PrimFunc).
"""

from __future__ import annotations

import collections
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fastsearch
import pytest
import tvm
from fastsearch import _core
from fastsearch.ir.loop_nest import first_difference, loop_nest_from_tvm, trace_json
from fastsearch.ir.tir_import import program_json
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload
from workloads import space_context

FAMILIES = ["C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG"]
TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
# Random re-samplings of each design space: 53 workloads x ~3.4 spaces x 3 seeds > 500 traces.
SEEDS = (1, 2, 3)


@dataclass
class Case:
    """One trace on one workload, with TVM's loop nests before and after postprocessing."""

    workload: str
    source: str
    func: Any
    pre_trace: str
    pre_nest: dict[str, Any]
    post_trace: str | None = None
    post_nest: dict[str, Any] | None = None
    label: str = field(default="")


def _is_dynamic(nest: Any) -> bool:
    """Whether a loop nest has a loop whose extent is not a constant."""
    if isinstance(nest, dict):
        loop = nest.get("loop")
        if isinstance(loop, dict) and not isinstance(loop.get("extent"), int):
            return True
        return any(_is_dynamic(v) for v in nest.values())
    if isinstance(nest, list):
        return any(_is_dynamic(v) for v in nest)
    return False


def _context(func: Any, design_spaces: bool) -> ms.TuneContext:
    """A TuneContext of ``func`` on ``TARGET``, with TVM's default CPU design space when asked.

    The space's rules are TVM's defaults for the "llvm" kind, given explicitly: left to the
    target, an AVX-512 CPU gets the x86 set, whose int8 tensor-intrinsic rule needs every tensor
    intrinsic registered first (a 35 s import on 2 cores). The workloads here are float32, on
    which that rule never applies, so the spaces are the same."""
    return space_context(func, TARGET, "llvm", design_spaces)


def _postprocessors(ctx: ms.TuneContext) -> list[Any]:
    posts = [ms.postproc.RewriteParallelVectorizeUnroll(), ms.postproc.RewriteReductionBlock()]
    for p in posts:
        p._initialize_with_tune_context(ctx)
    return posts


def design_space_traces(workload: str, func: Any) -> Iterator[Case]:
    """TVM's CPU design spaces of ``func``, each replayed without its decisions under several
    seeds (fresh random decisions), then postprocessed by TVM."""
    ctx = _context(func, design_spaces=True)
    for si, space in enumerate(ctx.generate_design_space()):
        for seed in SEEDS:
            sch = s_tir.Schedule(func, seed=seed)
            s_tir.Trace(space.trace.insts, {}).apply_to_schedule(sch, remove_postproc=False)
            case = Case(
                workload=workload,
                source="design-space",
                func=func,
                pre_trace=trace_json(sch.trace),
                pre_nest=loop_nest_from_tvm(sch.mod["main"]),
                label=f"space {si} seed {seed}",
            )
            if all(p.apply(sch) for p in _postprocessors(ctx)):
                case.post_trace = trace_json(sch.trace)
                case.post_nest = loop_nest_from_tvm(sch.mod["main"])
            yield case


# -- random primitive sequences -----------------------------------------------------------------
# Random schedules built through TVM's Python API: splits (perfect or not), fuses, reorders, loop
# kinds, annotations, cache_read/cache_write, inlining, compute_at/reverse_compute_at,
# decompose_reduction, rfactor. Steps TVM refuses are dropped (TVM validates every step); the
# trace of the accepted steps is then compared.
FUZZ_TRACES_PER_WORKLOAD = 3
FUZZ_STEPS = 8


def _blocks(sch: Any) -> list[Any]:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def _rand_loop(sch: Any, rng: random.Random, block: Any = None) -> Any:
    loops = sch.get_loops(block if block is not None else rng.choice(_blocks(sch)))
    if not loops:
        raise ValueError("block without loops")
    return rng.choice(list(loops))


def _op_split(sch: Any, rng: random.Random) -> None:
    loop = _rand_loop(sch, rng)
    ext = int(sch.get(loop).extent)
    divisors = [d for d in range(1, ext + 1) if ext % d == 0]
    n = rng.choice([2, 2, 3])
    factors: list[int | None] = [
        rng.choice(divisors) if rng.random() < 0.8 else rng.randint(1, ext) for _ in range(n)
    ]
    factors[rng.randrange(n)] = None
    sch.split(loop, factors)


def _op_fuse(sch: Any, rng: random.Random) -> None:
    loops = list(sch.get_loops(rng.choice(_blocks(sch))))
    i = rng.randrange(max(len(loops) - 1, 1))
    sch.fuse(*loops[i : i + rng.choice([2, 2, 3])])


def _op_reorder(sch: Any, rng: random.Random) -> None:
    loops = list(sch.get_loops(rng.choice(_blocks(sch))))
    sch.reorder(*rng.sample(loops, min(len(loops), rng.choice([2, 3]))))


def _op_kind(sch: Any, rng: random.Random) -> None:
    getattr(sch, rng.choice(["parallel", "vectorize", "unroll"]))(_rand_loop(sch, rng))


def _op_annotate(sch: Any, rng: random.Random) -> None:
    sch.annotate(_rand_loop(sch, rng), "pragma_auto_unroll_max_step", rng.choice([16, 64]))


def _op_cache(sch: Any, rng: random.Random) -> None:
    block = rng.choice(_blocks(sch))
    if rng.random() < 0.5:
        sch.cache_read(block, rng.randrange(max(len(sch.get(block).reads), 1)), "global")
    else:
        sch.cache_write(block, 0, "global")


def _op_inline(sch: Any, rng: random.Random) -> None:
    block = rng.choice(_blocks(sch))
    (sch.compute_inline if rng.random() < 0.6 else sch.reverse_compute_inline)(block)


def _op_compute_at(sch: Any, rng: random.Random) -> None:
    block = rng.choice(_blocks(sch))
    if rng.random() < 0.5:
        loop = _rand_loop(sch, rng, rng.choice(list(sch.get_consumers(block))))
        sch.compute_at(block, loop, preserve_unit_loops=rng.random() < 0.5)
    else:
        loop = _rand_loop(sch, rng, rng.choice(list(sch.get_producers(block))))
        sch.reverse_compute_at(block, loop, preserve_unit_loops=rng.random() < 0.5)


def _op_decompose(sch: Any, rng: random.Random) -> None:
    block = rng.choice(_blocks(sch))
    sch.decompose_reduction(block, _rand_loop(sch, rng, block))


def _op_rfactor(sch: Any, rng: random.Random) -> None:
    sch.rfactor(_rand_loop(sch, rng), rng.choice([0, 1]))


_OPS = [
    _op_split,
    _op_split,
    _op_fuse,
    _op_reorder,
    _op_kind,
    _op_annotate,
    _op_cache,
    _op_inline,
    _op_compute_at,
    _op_compute_at,
    _op_decompose,
    _op_rfactor,
]


def random_primitive_traces(workload: str, func: Any) -> Iterator[Case]:
    """Random sequences of primitives that TVM accepts, then TVM's RewriteReductionBlock."""
    ctx = _context(func, design_spaces=False)
    for t in range(FUZZ_TRACES_PER_WORKLOAD):
        rng = random.Random(f"{workload}/{t}")
        sch = s_tir.Schedule(func)
        for _ in range(FUZZ_STEPS):
            try:
                rng.choice(_OPS)(sch, rng)
            except (RuntimeError, ValueError, IndexError, TypeError):  # TVM refused the step: drop it
                fresh = s_tir.Schedule(func)
                sch.trace.apply_to_schedule(fresh, remove_postproc=False)
                sch = fresh
        case = Case(
            workload=workload,
            source="random-primitives",
            func=func,
            pre_trace=trace_json(sch.trace),
            pre_nest=loop_nest_from_tvm(sch.mod["main"]),
            label=f"sequence {t}",
        )
        if all(p.apply(sch) for p in _postprocessors(ctx)):
            case.post_trace = trace_json(sch.trace)
            case.post_nest = loop_nest_from_tvm(sch.mod["main"])
        yield case


# -- fastsearch's own sketches ----------------------------------------------------------------
SKETCH_TRACES_PER_WORKLOAD = 4


def sketch_traces(workload: str, func: Any) -> Iterator[Case]:
    """Candidates drawn from fastsearch's CPU sketches (Rust), replayed by TVM, then postprocessed."""
    ctx = _context(func, design_spaces=True)
    keys = _core.Program(program_json(func)).sample_sketches(_core.Target(2), SKETCH_TRACES_PER_WORKLOAD, 17)
    for i, key in enumerate(keys):
        sch = s_tir.Schedule(tvm.ir.load_json(tvm.ir.save_json(func)))
        s_tir.Trace.apply_json_to_schedule(json.loads(key), sch)
        case = Case(
            workload=workload,
            source="fastsearch-sketch",
            func=func,
            pre_trace=trace_json(sch.trace),
            pre_nest=loop_nest_from_tvm(sch.mod["main"]),
            label=f"sketch candidate {i}",
        )
        if all(p.apply(sch) for p in _postprocessors(ctx)):
            case.post_trace = trace_json(sch.trace)
            case.post_nest = loop_nest_from_tvm(sch.mod["main"])
        yield case


# Each source: (family, shape index, PrimFunc) -> cases.
TRACE_SOURCES: list[Callable[[str, Any], Iterator[Case]]] = [
    design_space_traces,
    random_primitive_traces,
    sketch_traces,
]


def _compare(case: Case, trace: str, expected: dict[str, Any], postprocess: bool) -> str | None:
    """``None`` when the engine agrees with TVM, else a description of the first difference."""
    dynamic = _is_dynamic(expected)
    try:
        got = json.loads(_core.Program(program_json(case.func)).apply_trace(trace, postprocess=postprocess))
    except fastsearch.ScheduleError as e:
        return None if dynamic else f"engine refused the trace: {e}"
    except fastsearch.FastsearchError as e:
        return f"engine failed: {type(e).__name__}: {e}"
    if dynamic:
        return "TVM made a dynamic loop (DisallowDynamicLoop rejects it) but the engine accepted the trace"
    return first_difference(expected, got)


_RESULTS: dict[str, list[tuple[Case, str, str | None]]] = {}


def _family_results(family: str) -> list[tuple[Case, str, str | None]]:
    if family not in _RESULTS:
        out = []
        for idx in range(len(te_workload.CONFIGS[family][1])):
            func = te_workload.create_te_workload(family, idx)
            for source in TRACE_SOURCES:
                for case in source(f"{family}[{idx}]", func):
                    out.append((case, "pre", _compare(case, case.pre_trace, case.pre_nest, False)))
                    if case.post_trace is not None and case.post_nest is not None:
                        out.append(
                            (case, "post-replay", _compare(case, case.post_trace, case.post_nest, False))
                        )
                        out.append((case, "post-ours", _compare(case, case.pre_trace, case.post_nest, True)))
        _RESULTS[family] = out
    return _RESULTS[family]


def check_family(family: str, results: list[tuple[Case, str, str | None]]) -> None:
    """Prints a family's comparisons by source and mode, and fails on the first difference."""
    traces = {id(c) for c, _, _ in results}
    assert len(traces) >= 20, f"{family}: only {len(traces)} traces"
    by_source = collections.Counter(c.source for c in {id(c): c for c, _, _ in results}.values())
    failures = [(c, mode, d) for c, mode, d in results if d is not None]
    by_mode = collections.Counter(mode for _, mode, _ in results)
    failed_by_mode = collections.Counter(mode for _, mode, _ in failures)
    summary = ", ".join(f"{m} {by_mode[m] - failed_by_mode[m]}/{by_mode[m]}" for m in sorted(by_mode))
    print(f"\n{family}: {len(traces)} traces ({dict(by_source)}); {summary}")
    if failures:
        case, mode, diff = failures[0]
        trace = case.pre_trace if mode != "post-replay" else case.post_trace
        pytest.fail(
            f"{len(failures)} of {len(results)} comparisons differ ({summary}). First: workload {case.workload} "
            f"({case.source}, {case.label}), mode {mode}: {diff}\ntrace: {trace}"
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_matches_tvm(family: str) -> None:
    check_family(family, _family_results(family))


def test_at_least_500_traces() -> None:
    total = sum(len({id(c) for c, _, _ in _family_results(f)}) for f in FAMILIES)
    assert total >= 500, f"only {total} traces across the suite"


# -- invalid instructions and traces ------------------------------------------------------------


def _matmul_relu() -> Any:
    from tvm import te

    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((64, 64), lambda i, j: te.max(c[i, j], tvm.tirx.const(0, "float32")), name="D")
    return te.create_prim_func([a, b, d])


def _get(block: str, out: str) -> list[Any]:
    return ["GetSBlock", [], [block, "main"], [out]]


def _loops(block: str, outs: list[str]) -> list[Any]:
    return ["GetLoops", [block], [], outs]


INVALID = {
    "reorder loops of different blocks": [
        _get("C", "b0"),
        _get("D", "b1"),
        _loops("b0", ["l0", "l1", "l2"]),
        _loops("b1", ["l3", "l4"]),
        ["Reorder", ["l1", "l3"], [], []],
    ],
    "split with factors whose product is too small": [
        _get("C", "b0"),
        _loops("b0", ["l0", "l1", "l2"]),
        ["Split", ["l0", 4, 4], [1, 0], ["l3", "l4"]],
    ],
    "split with a non-positive factor": [
        _get("C", "b0"),
        _loops("b0", ["l0", "l1", "l2"]),
        ["Split", ["l0", 0, "None"], [1, 0], ["l3", "l4"]],
    ],
    "vectorize a reduction loop": [
        _get("C", "b0"),
        _loops("b0", ["l0", "l1", "l2"]),
        ["Vectorize", ["l2"], [], []],
    ],
    "parallelize a reduction loop": [
        _get("C", "b0"),
        _loops("b0", ["l0", "l1", "l2"]),
        ["Parallel", ["l2"], [], []],
    ],
    "fuse loops that are not nested": [
        _get("C", "b0"),
        _get("D", "b1"),
        _loops("b0", ["l0", "l1", "l2"]),
        _loops("b1", ["l3", "l4"]),
        ["Fuse", ["l0", "l4"], [1], ["l5"]],
    ],
    "compute_at a block under its own loop": [
        _get("C", "b0"),
        _loops("b0", ["l0", "l1", "l2"]),
        ["ComputeAt", ["b0", "l1"], [1, -1], []],
    ],
    "compute_inline an output block": [_get("D", "b0"), ["ComputeInline", ["b0"], [], []]],
    "decompose_reduction of a spatial block": [
        _get("D", "b0"),
        _loops("b0", ["l0", "l1"]),
        ["DecomposeReduction", ["b0", "l0"], [], ["b1"]],
    ],
    "an unknown block": [_get("nope", "b0")],
    "an unsupported instruction kind": [_get("C", "b0"), ["Tensorize", ["b0"], ["x"], []]],
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_instruction_raises_schedule_error(name: str) -> None:
    program = program_json(_matmul_relu())
    with pytest.raises(fastsearch.ScheduleError):
        _core.Program(program).apply_trace(json.dumps([INVALID[name], []]))


def test_valid_handwritten_trace_applies() -> None:
    """The same program accepts a correct trace (the invalid ones fail for their own reason)."""
    trace = [
        _get("C", "b0"),
        _get("D", "b1"),
        _loops("b0", ["l0", "l1", "l2"]),
        ["Split", ["l0", "None", 8], [1, 0], ["l3", "l4"]],
        ["Reorder", ["l3", "l1", "l4"], [], []],
        ["ReverseComputeAt", ["b1", "l1"], [1, -1], []],
        ["Vectorize", ["l4"], [], []],
    ]
    nest = json.loads(_core.Program(program_json(_matmul_relu())).apply_trace(json.dumps([trace, []])))
    outer = nest["body"][0]["loop"]
    assert outer["extent"] == 8
    inner = outer["body"][0]["loop"]
    assert inner["extent"] == 64
    assert [next(iter(n)) for n in inner["body"]] == ["loop", "loop"]


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "{}",
        "[1, 2, 3]",
        '[[["GetSBlock"]], []]',
        '[[["GetSBlock", [], ["C", "main"], [7]]], []]',
        '[[["GetLoops", ["b9"], [], ["l0"]]], []]',
        '[[["GetSBlock", [], ["C", "main"], ["b0"]]], [[5, 1]]]',
    ],
)
def test_garbage_trace_raises_invalid_trace(text: str) -> None:
    with pytest.raises(fastsearch.InvalidTrace):
        _core.Program(program_json(_matmul_relu())).apply_trace(text)
