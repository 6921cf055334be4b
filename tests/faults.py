"""Real faults for the fault tests: a build function for the builder's worker processes that, for a
candidate whose block carries the annotation ``FAULT``, aborts or hangs the worker itself, or builds
a kernel that aborts, hangs or computes nothing when the runner calls it.

The annotation is an ordinary ``annotate`` instruction, so it is part of the candidate's trace (and
key), survives replay and postprocessing, and reaches the build worker inside the module.
"""

from __future__ import annotations

import os
import re
import time

import tvm
from fastsearch.measure.measurer import build_module
from tvm.s_tir import Schedule

FAULT = "fastsearch_test_fault"
KINDS = ("build crash", "build hang", "run crash", "run hang", "wrong answer")


def fault_of(mod: tvm.IRModule) -> str | None:
    """The fault requested by an annotation on a block of ``mod``, if any (read from the printed
    module: TVM's Python API has no generic statement visitor)."""
    found = re.search(rf'"{FAULT}": "([a-z ]+)"', mod.script())
    return found.group(1) if found else None


def faulty_build(mod: tvm.IRModule, target: tvm.target.Target, params: dict | None = None):
    """MetaSchedule build function (runs in a LocalBuilder worker process)."""
    fault = fault_of(mod)
    if fault == "build crash":
        os.abort()  # SIGABRT: the worker process dies
    if fault == "build hang":
        time.sleep(3600)
    if fault in ("run crash", "run hang", "wrong answer"):
        mod = fault_module(mod, fault)
    return build_module(mod, target, params)


def fault_module(mod: tvm.IRModule, kind: str) -> tvm.IRModule:
    """``mod`` with a ``main`` of the same signature that aborts, hangs, or computes nothing."""
    body = {
        "run crash": tvm.tirx.Evaluate(tvm.tirx.call_extern("int32", "abort")),
        "run hang": tvm.tirx.Evaluate(tvm.tirx.call_extern("int32", "sleep", 3600)),
        "wrong answer": tvm.tirx.Evaluate(0),  # writes nothing: the output keeps its old values
    }[kind]
    return tvm.IRModule({"main": mod["main"].with_body(body)})


def faulty_trace(mod: tvm.IRModule, kind: str, block: str = "Z"):
    """A trace of ``mod`` (normalized) that requests fault ``kind`` from :func:`faulty_build`."""
    sch = Schedule(mod)
    sch.annotate(sch.get_sblock(block), FAULT, kind)
    return sch.trace
