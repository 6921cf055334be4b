"""Candidates from fastsearch's own CPU sketches, drawn in Rust and checked by TVM.

The Rust core draws distinct traces (structure plus random annotation) in parallel, with the
GIL released; TVM then replays each one and runs MetaSchedule's postprocessors for the target,
so every candidate returned here is a schedule TVM accepts and can build.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import tvm
from tvm.s_tir import Schedule, Trace
from tvm.s_tir import meta_schedule as ms

from fastsearch import _core
from fastsearch.errors import InternalError
from fastsearch.tir_import import main_function, program_json


@dataclass
class Candidate:
    """One schedule: ``key`` is its trace JSON before postprocessing (what the search draws and
    deduplicates on), ``schedule`` the TVM schedule after postprocessing."""

    key: str
    schedule: Schedule

    @property
    def trace(self) -> Trace:
        return self.schedule.trace


class Postprocessor:
    """MetaSchedule's postprocessors for a target, initialized once."""

    def __init__(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> None:
        self.target = target
        context = ms.TuneContext(mod=tvm.IRModule({"main": func}), target=target)
        self.postprocs = list(ms.postproc.Postproc.create(_target_kind(target)))
        for p in self.postprocs:
            p._initialize_with_tune_context(context)

    def apply(self, sch: Schedule) -> bool:
        sch.enter_postproc()
        return all(p.apply(sch) for p in self.postprocs)


def _target_kind(target: tvm.target.Target) -> str:
    return "cuda" if str(target.kind.name) == "cuda" else "llvm"


def num_cores(target: tvm.target.Target) -> int:
    value = target.attrs.get("num-cores")
    return int(value) if value is not None else 1


def replay(func: tvm.tirx.PrimFunc, trace_json: str | list[Any], postprocessor: Postprocessor | None) -> Schedule | None:
    """Applies a trace to a fresh schedule of ``func``; None when TVM refuses it."""
    sch = Schedule(tvm.IRModule({"main": func}))
    obj = json.loads(trace_json) if isinstance(trace_json, str) else trace_json
    try:
        Trace.apply_json_to_schedule(obj, sch)
        if postprocessor is not None and not postprocessor.apply(sch):
            return None
    except tvm.TVMError:
        return None
    return sch


def sample_candidates(
    func: tvm.tirx.PrimFunc,
    target: tvm.target.Target,
    n: int,
    seed: int = 0,
    exclude: Iterable[str] = (),
    postprocessor: Postprocessor | None = None,
) -> list[Candidate]:
    """Up to ``n`` distinct candidates whose keys are not in ``exclude``, in a deterministic order."""
    program = program_json(func)
    postprocessor = postprocessor or Postprocessor(func, target)
    excluded = list(exclude)
    out: list[Candidate] = []
    rejected = 0
    draw_seed = seed
    # TVM may refuse a candidate our sketches produce; draw again (bounded) rather than return fewer.
    for _ in range(4):
        keys = _core.sample_sketches(program, num_cores(target), n - len(out), draw_seed, excluded)
        for key in keys:
            sch = replay(func, key, postprocessor)
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
    includes the postprocessing MetaSchedule does before a build.
    """
    from fastsearch.target import resolve_target

    _, func = main_function(mod)
    tgt = resolve_target(target)
    return [c.trace for c in sample_candidates(func, tgt, n, seed)]
