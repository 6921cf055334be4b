"""Loop-nest descriptions of scheduled TIR, from TVM and from fastsearch's schedule engine.

Both sides produce the same JSON-compatible dict, so a schedule replayed by the Rust engine can
be compared with the one TVM builds from the same trace:

``{"root_annotations": {...}, "buffers": [{"name", "shape", "dtype", "scope"}...],
"body": [node...]}`` where a node is ``{"loop": {"extent", "kind", "thread", "annotations",
"body"}}`` or ``{"block": {"name", "annotations"}}``. Loop variable names are left out: they are
naming noise.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import tvm
from tvm import tirx
from tvm.s_tir import SBlockRealize, Trace
from tvm.s_tir import meta_schedule as ms
from tvm.sym import Analyzer as _Analyzer
from tvm.tirx import FloatImm, IntImm
from tvm.tirx import expr as _E
from tvm.tirx.function import IndexMap
from tvm_ffi import Map, get_global_func

from fastsearch import _core
from fastsearch.ir.tir_import import program_json

_trace_as_json = get_global_func("s_tir.schedule.TraceAsJSON")

# The workload the records of :func:`traces_text` name: any module will do, the engine reads
# only the trace.
_PLACEHOLDER_MODULE = tvm.IRModule()

_FOR_KIND = {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled", 4: "thread_binding"}


def _value(v: Any) -> Any:
    """An annotation or trace value as plain JSON (ints, floats, strings, lists)."""
    if isinstance(v, _E.IntImm):
        return int(v.value)
    if isinstance(v, _E.FloatImm):
        return float(v.value)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) or type(v).__name__ in ("Array", "List"):
        return [_value(x) for x in v]
    if isinstance(v, tvm.runtime.String if hasattr(tvm.runtime, "String") else str):
        return str(v)
    try:
        return [_value(x) for x in v]
    except TypeError:
        return str(v)


def _annotations(anns: Any) -> dict[str, Any]:
    return {str(k): _value(v) for k, v in anns.items()}


def _extent(e: Any) -> Any:
    """A loop extent as an int; TVM may leave a constant expression unfolded."""
    if isinstance(e, _E.IntImm):
        return int(e.value)
    folded = _Analyzer().simplify(e)
    return int(folded.value) if isinstance(folded, _E.IntImm) else str(folded)


def _nodes(stmt: Any) -> list[dict[str, Any]]:
    if isinstance(stmt, tirx.SeqStmt):
        out: list[dict[str, Any]] = []
        for s in stmt.seq:
            out.extend(_nodes(s))
        return out
    if isinstance(stmt, tirx.For):
        return [
            {
                "loop": {
                    "extent": _extent(stmt.extent),
                    "kind": _FOR_KIND.get(int(stmt.kind), str(stmt.kind)),
                    "thread": None if stmt.thread_binding is None else str(stmt.thread_binding.thread_tag),
                    "annotations": _annotations(stmt.annotations),
                    "body": _nodes(stmt.body),
                }
            }
        ]
    if isinstance(stmt, SBlockRealize):
        blk = stmt.block
        return [{"block": {"name": str(blk.name_hint), "annotations": _annotations(blk.annotations)}}]
    raise TypeError(f"unexpected statement {type(stmt).__name__} in a scheduled PrimFunc")


def loop_nest_from_tvm(func: tirx.PrimFunc) -> dict[str, Any]:
    """The loop nest of a (TVM-scheduled) PrimFunc."""
    body = func.body
    if not isinstance(body, SBlockRealize):
        raise TypeError("the function body is not a root block")
    root = body.block
    return {
        "root_annotations": _annotations(root.annotations),
        "buffers": [
            {
                "name": str(b.name),
                "shape": [int(d) for d in b.shape],
                "dtype": str(b.dtype),
                "scope": str(b.scope()),
            }
            for b in root.alloc_buffers
        ],
        "body": _nodes(root.body),
    }


def trace_json(trace: Any) -> str:
    """A TVM ``Trace`` (or its ``as_json()`` value) as a JSON string."""
    value = trace.as_json() if hasattr(trace, "as_json") else trace
    return json.dumps(_value(value))


def _plain(v: Any) -> Any:
    """A value of ``TraceAsJSON`` as plain JSON, as :func:`fastsearch.ir.loop_nest.trace_json`
    writes it; one pass instead of TVM's ``Trace.as_json`` and a second conversion."""
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, IntImm):
        return int(v.value)
    if isinstance(v, FloatImm):
        return float(v.value)
    if isinstance(v, Map):
        return {str(_plain(k)): _plain(x) for k, x in v.items()}
    if isinstance(v, IndexMap):
        return tvm.ir.save_json(v)
    return [_plain(x) for x in v]


def trace_text(trace: Trace, remove_postproc: bool = False) -> str:
    """The trace as JSON text, equal (as JSON) to :func:`trace_json`: the search converts
    thousands of traces per round, and this is its costliest step."""
    return json.dumps(_plain(_trace_as_json(trace, remove_postproc)))


def traces_text(traces: Sequence[Trace], min_split: int = 12) -> list[str]:
    """Many traces as JSON text the engine reads. The extension calls TVM's ``TraceAsJSON`` on
    each through tvm-ffi's C ABI, on its own threads, and reads the value straight from
    tvm-ffi's objects (``_core.tvm_trace_texts``: 24 conv traces in about 1.5 ms); a trace
    holding a value that reader leaves to TVM (a map, an index map), or every trace where
    tvm-ffi's layout is not the one it knows, is written by TVM's C++ JSON writer instead
    (:func:`_records_text`, about 0.15 ms a trace). Walking a trace's
    objects from Python (:func:`trace_text`) costs about 1.3 ms. Texts are not keys: two equal
    traces give equal texts here, but not the text :func:`trace_text` gives.

    ``min_split``: from that many traces on, TVM's writer takes one part per CPU (two at most),
    each on a thread of its own."""
    texts: list[str | None] = [None] * len(traces)
    if _READER is not None and traces:
        texts = list(_core.tvm_trace_texts(_READER, [t.__chandle__() for t in traces]))
    rest = [t for t, text in zip(traces, texts) if text is None]
    written = iter(_written_by_tvm(rest, min_split))
    return [text if text is not None else next(written) for text in texts]


def features_of_traces(
    program: _core.Program, traces: Sequence[Trace], gpu: _core.GpuTarget | None = None
) -> list[Any] | None:
    """Per-store features of each TVM trace on ``program`` (for the CUDA target ``gpu`` where
    given), each trace written by TVM's ``TraceAsJSON`` and read on the extension's thread that
    replays it (``Program.extract_features_tvm``): one array per trace, ``None`` for a trace to
    write with :func:`traces_text` instead. ``None`` where tvm-ffi's layout is not the one the
    extension reads. A trace that cannot be replayed fails the batch."""
    if _READER is None:
        return None
    handles = [t.__chandle__() for t in traces]
    return list(program.extract_features_tvm(_READER, handles, gpu=gpu))


def _trace_reader() -> _core.TraceReader | None:
    """The extension's reader of TVM traces, given what it needs to call ``TraceAsJSON`` and
    read its value: tvm-ffi's C functions by address, the ``Trace`` type index, and
    ``(type index, value offset)`` of ``IntImm`` and ``FloatImm`` from tvm-ffi's reflection. ``None`` where the layout is not the
    one it reads (an int value as a 16-byte ``TVMFFIAny``, a float as a double, arrays and
    strings at tvm-ffi's fixed type indices) or the library cannot be found."""
    try:
        import ctypes

        import tvm_ffi
        from tvm_ffi.libinfo import find_libtvm_ffi

        fixed = {"ffi.Array": 71, "ffi.String": 65}
        if any(tvm_ffi.core._object_type_key_to_index(k) != i for k, i in fixed.items()):
            return None
        out: dict[str, Any] = {}
        for name, cls, size in (("int_imm", IntImm, 16), ("float_imm", FloatImm, 8)):
            info = cls.__tvm_ffi_type_info__
            (value,) = [f for f in info.fields if f.name == "value"]
            if value.size != size:
                return None
            out[name] = (int(info.type_index), int(value.offset))
        lib = ctypes.CDLL(find_libtvm_ffi())
        names = ("TVMFFIFunctionCall", "TVMFFIObjectDecRef", "TVMFFIErrorMoveFromRaised")
        out["c_api"] = tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names)
        out["trace_type"] = int(Trace.__tvm_ffi_type_info__.type_index)
        out["as_json"] = _trace_as_json.__chandle__()
        return _core.TraceReader(**out)
    except (AttributeError, ValueError, TypeError, OSError, RuntimeError, _core.FastsearchError):
        return None


_READER = _trace_reader()


def _written_by_tvm(traces: Sequence[Trace], min_split: int) -> list[str]:
    """:func:`_records_text` of ``traces``, from ``min_split`` traces on cut into one part per
    CPU (two at most), each written on a thread of its own: TVM's writer releases the GIL for
    part of its work, and on 24 conv traces two parts took 2.4 ms against 3.1 ms in one."""
    parts = max(1, min(os.cpu_count() or 1, 2, len(traces) // max(1, min_split)))
    if parts == 1:
        return _records_text(traces) if traces else []
    size = -(-len(traces) // parts)
    chunks = [traces[i : i + size] for i in range(0, len(traces), size)]
    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        return [text for chunk in pool.map(_records_text, chunks) for text in chunk]


def _records_text(traces: Sequence[Trace]) -> list[str]:
    """The JSON-database lines of ``traces``, through a scratch database of their own (in
    memory where ``/dev/shm`` exists)."""
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="fastsearch-traces-", dir=scratch) as folder:
        records = Path(folder) / "records.json"
        database = ms.database.JSONDatabase(
            str(Path(folder) / "workloads.json"), str(records), allow_missing=True
        )
        workload = database.commit_workload(_PLACEHOLDER_MODULE)
        for trace in traces:
            database.commit_tuning_record(ms.database.TuningRecord(trace, workload))
        return records.read_text().splitlines()


def loop_nest_from_trace(func: tirx.PrimFunc, trace: Any, postprocess: bool = False) -> dict[str, Any]:
    """The loop nest fastsearch's engine builds by replaying ``trace`` (JSON text, a TVM
    ``Trace`` or its ``as_json()`` value) on the unscheduled ``func``."""
    text = trace if isinstance(trace, str) else trace_json(trace)
    return json.loads(_core.Program(program_json(func)).apply_trace(text, postprocess=postprocess))


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two loop nests first differ, as a readable path, or ``None`` when equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: present only on {'left' if k in a else 'right'}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d is not None:
                return d
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        return None
    if a != b:
        return f"{path}: {_short(a)} != {_short(b)}"
    return None


def _short(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) < 200 else text[:200] + "..."
