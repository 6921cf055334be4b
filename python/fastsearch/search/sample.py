"""Candidates from fastsearch's own CPU sketches, drawn in Rust and checked by TVM.

The Rust core draws distinct traces (structure plus random annotation) in parallel, with the
GIL released; TVM then replays each one and runs MetaSchedule's postprocessors for the target,
so every candidate returned here is a schedule TVM accepts and can build.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import tvm
from tvm.s_tir import Schedule, Trace
from tvm.s_tir import meta_schedule as ms

from fastsearch import _core
from fastsearch.errors import InternalError
from fastsearch.ir.machine import num_cores
from fastsearch.ir.target import require_searchable, resolve_target
from fastsearch.ir.tir_import import main_function, program_json
from fastsearch.ir.tune_context import tune_context


@dataclass
class Candidate:
    """One schedule: ``key`` is its trace JSON before postprocessing (what the search draws and
    deduplicates on), ``schedule`` the TVM schedule after postprocessing."""

    key: str
    schedule: Schedule

    @property
    def trace(self) -> Trace:
        return self.schedule.trace


def fresh_copy(obj: Any) -> Any:
    """A deep copy of a TVM IR object.

    A TVM Schedule may rewrite the PrimFunc it was made from in place; every replay works on its
    own copy so no candidate can change the function being tuned.
    """
    return tvm.ir.load_json(tvm.ir.save_json(obj))


class Postprocessor:
    """MetaSchedule's default postprocessors for the target, initialized for one workload.

    Built by :func:`fastsearch.ir.tune_context.tune_context`: TuneContext's Python constructor
    imports every tensor intrinsic (tens of seconds per process), which replaying fastsearch's
    traces does not need.
    ``apply(sch)`` enters postprocessing and runs them all, as MetaSchedule does before a build.
    """

    def __init__(self, mod: tvm.tirx.PrimFunc | tvm.IRModule, target: tvm.target.Target) -> None:
        kind = str(target.kind.name)
        kind = kind if kind in ("cuda", "hexagon") else "llvm"
        space = ms.space_generator.PostOrderApply(
            sch_rules=[], postprocs=ms.postproc.Postproc.create(kind), mutator_probs={}
        )
        ctx = tune_context(mod, target, space)
        self.target = target
        self.postprocs = list(ctx.space_generator.postprocs)
        self.rejected_by: str | None = None

    def apply(self, sch: Schedule) -> bool:
        """Run the postprocessors on ``sch``; False (and ``rejected_by`` set) if one refuses it."""
        sch.enter_postproc()
        for post in self.postprocs:
            if not post.apply(sch):
                self.rejected_by = type(post).__name__
                return False
        return True


def base_schedule(func: tvm.tirx.PrimFunc) -> Schedule:
    """An untouched schedule of ``func`` that :func:`replay` copies for every candidate."""
    return Schedule(tvm.IRModule({"main": fresh_copy(func)}))


def replay(
    source: tvm.tirx.PrimFunc | Schedule, trace_json: str | list[Any], postprocessor: Postprocessor | None
) -> Schedule | None:
    """Applies a trace to a fresh schedule of ``source``; None when TVM refuses it.

    ``source`` is the function, or better a :func:`base_schedule` of it: copying a schedule
    shares the unchanged IR (copy on write) and costs a tenth of copying the function.
    """
    sch = source.copy() if isinstance(source, Schedule) else base_schedule(source)
    obj = json.loads(trace_json) if isinstance(trace_json, str) else trace_json
    try:
        Trace.apply_json_to_schedule(obj, sch)
        if postprocessor is not None and not postprocessor.apply(sch):
            return None
    except Exception:  # noqa: BLE001  (TVM raises ValueError, RuntimeError, tvm.error.*)
        return None
    return sch


def replay_all(
    source: Schedule, trace_jsons: Sequence[str], postprocessor: Postprocessor | None, threads: int = 1
) -> list[Schedule | None]:
    """:func:`replay` of each trace, in order, on up to ``threads`` threads: TVM releases the
    GIL inside its calls, and each trace gets a schedule of its own."""
    if threads <= 1 or len(trace_jsons) <= 1:
        return [replay(source, t, postprocessor) for t in trace_jsons]
    with ThreadPoolExecutor(max_workers=min(threads, len(trace_jsons))) as pool:
        return list(pool.map(lambda t: replay(source, t, postprocessor), trace_jsons))


def sample_candidates(
    func: tvm.tirx.PrimFunc,
    target: tvm.target.Target,
    n: int,
    seed: int = 0,
    exclude: Iterable[str] = (),
    postprocessor: Postprocessor | None = None,
) -> list[Candidate]:
    """Up to ``n`` distinct candidates whose keys are not in ``exclude``, in a deterministic order."""
    program = _core.Program(program_json(func))
    cpu = _core.Target(num_cores(target))
    postprocessor = postprocessor or Postprocessor(func, target)
    excluded = list(exclude)
    base = base_schedule(func)
    out: list[Candidate] = []
    rejected = 0
    draw_seed = seed
    # TVM may refuse a candidate our sketches produce; draw again (bounded) rather than return fewer.
    for _ in range(4):
        keys = program.sample_sketches(cpu, n - len(out), draw_seed, exclude=excluded)
        for key in keys:
            sch = replay(base, key, postprocessor)
            if sch is None:
                rejected += 1
                continue
            out.append(Candidate(key, sch))
        excluded.extend(keys)
        if len(out) >= n or not keys:
            break
        draw_seed = (draw_seed * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    if not out and rejected:
        raise InternalError(f"TVM refused all {rejected} candidates drawn from fastsearch's sketches")
    return out


def sample(mod: Any, target: Any = None, *, n: int = 32, seed: int = 0) -> list[Trace]:
    """``n`` distinct candidates for the PrimFunc in ``mod`` from fastsearch's sketches, as TVM traces.

    Each trace applies to a schedule of the function with ``Trace.apply_to_schedule`` and
    includes the postprocessing MetaSchedule does before a build. The sketches are CPU sketches:
    a GPU target is refused (:class:`fastsearch.UnsupportedTarget`).
    """

    _, func = main_function(mod)
    tgt = resolve_target(target)
    require_searchable(tgt, "fastsearch.sample")
    return [c.trace for c in sample_candidates(func, tgt, n, seed)]
