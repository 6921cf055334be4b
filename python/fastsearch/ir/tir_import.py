"""TIR -> program model: serializes a scheduled-block PrimFunc into the JSON the Rust core imports.

The JSON is a compact tree. Expressions are arrays whose first element names the node
(``["var", "v_i"]``, ``["add", a, b]``, ``["load", buffer_index, [indices...]]``). Statements are
``loop`` and ``block`` nodes. Anything the model cannot represent raises
:class:`fastsearch.UnsupportedWorkload` naming the construct.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import Call as _Call
from tvm.ir.expr import StringImm as _StringImm
from tvm.ir.expr import TensorLoad as _TensorLoad
from tvm.s_tir import SBlock, SBlockRealize
from tvm.tirx import expr as _E

from fastsearch import _core
from fastsearch.errors import UnsupportedWorkload

_BINARY = {
    _E.Add: "add",
    _E.Sub: "sub",
    _E.Mul: "mul",
    _E.Div: "div",
    _E.Mod: "mod",
    _E.FloorDiv: "floordiv",
    _E.FloorMod: "floormod",
    _E.Min: "min",
    _E.Max: "max",
    _E.EQ: "eq",
    _E.NE: "ne",
    _E.LT: "lt",
    _E.LE: "le",
    _E.GT: "gt",
    _E.GE: "ge",
    _E.And: "and",
    _E.Or: "or",
}

_FOR_KIND = {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled", 4: "thread_binding"}
# IterVar.iter_type: kDataPar=0, kThreadIndex=1, kCommReduce=2, kOrdered=3, kOpaque=4
_ITER_KIND = {0: "S", 2: "R", 3: "O", 4: "O"}


class _Exporter:
    def __init__(self, func: tirx.PrimFunc, name: str) -> None:
        self.func = func
        self.name = name
        self.buffers: list[tirx.Buffer] = []
        self.buffer_json: list[dict[str, Any]] = []
        self.blocks: list[dict[str, Any]] = []

    # -- buffers -------------------------------------------------------------------------------
    def buffer(self, buf: tirx.Buffer) -> int:
        for i, known in enumerate(self.buffers):
            if known.same_as(buf):
                return i
        shape = []
        for dim in buf.shape:
            if not isinstance(dim, _E.IntImm):
                raise UnsupportedWorkload(
                    f"{self.name}: buffer {buf.name} has a dynamic shape {list(buf.shape)}; "
                    "only static shapes are supported"
                )
            shape.append(int(dim))
        self.buffers.append(buf)
        self.buffer_json.append(
            {"name": str(buf.name), "shape": shape, "dtype": str(buf.dtype), "scope": str(buf.scope())}
        )
        return len(self.buffers) - 1

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, e: Any) -> list[Any]:
        if isinstance(e, _E.IntImm):
            if str(e.ty) == "bool":
                return ["bool", bool(e.value)]
            return ["int", int(e.value)]
        if isinstance(e, _E.FloatImm):
            return ["float", float(e.value), str(e.ty)]
        if isinstance(e, _E.Var):
            return ["var", str(e.name)]
        op = _BINARY.get(type(e))
        if op is not None:
            return [op, self.expr(e.a), self.expr(e.b)]
        if isinstance(e, _E.Not):
            return ["not", self.expr(e.a)]
        if isinstance(e, _E.Select):
            return ["select", self.expr(e.condition), self.expr(e.true_value), self.expr(e.false_value)]
        if isinstance(e, _E.Cast):
            return ["cast", str(e.ty), self.expr(e.value)]
        if isinstance(e, _TensorLoad):
            return ["load", self.buffer(e.source), [self.expr(i) for i in e.indices]]
        if isinstance(e, _Call):
            name = str(e.op.name) if hasattr(e.op, "name") else str(e.op)
            if name in ("prim.if_then_else", "tirx.if_then_else"):
                a, b, c = e.args
                return ["select", self.expr(a), self.expr(b), self.expr(c)]
            return ["call", name, str(e.ty), [self.expr(a) for a in e.args]]
        raise UnsupportedWorkload(f"{self.name}: expression {type(e).__name__} ({e}) is not supported")

    def region(self, region: Any) -> dict[str, Any]:
        ranges = []
        for r in region.region:
            ranges.append([self.expr(r.min), self.expr(r.extent)])
        return {"buffer": self.buffer(region.source), "region": ranges}

    # -- statements ----------------------------------------------------------------------------
    def stores(self, stmt: Any, where: str) -> list[dict[str, Any]]:
        if isinstance(stmt, tirx.SeqStmt):
            out: list[dict[str, Any]] = []
            for s in stmt.seq:
                out.extend(self.stores(s, where))
            return out
        if isinstance(stmt, tirx.BufferStore):
            return [
                {
                    "buffer": self.buffer(stmt.buffer),
                    "indices": [self.expr(i) for i in stmt.indices],
                    "value": self.expr(stmt.value),
                }
            ]
        raise UnsupportedWorkload(
            f"{self.name}: {type(stmt).__name__} inside {where} is not supported "
            "(a block body must be buffer stores)"
        )

    def block(self, realize: SBlockRealize) -> int:
        blk: SBlock = realize.block
        if len(blk.match_buffers) > 0:
            raise UnsupportedWorkload(f"{self.name}: block {blk.name_hint} uses match_buffer")
        iter_vars = []
        for iv in blk.iter_vars:
            kind = _ITER_KIND.get(int(iv.iter_type))
            if kind is None:
                raise UnsupportedWorkload(f"{self.name}: block {blk.name_hint} has a thread-bound iter var")
            if not isinstance(iv.dom.extent, _E.IntImm) or not isinstance(iv.dom.min, _E.IntImm):
                raise UnsupportedWorkload(
                    f"{self.name}: block {blk.name_hint} has a dynamic iteration domain"
                )
            iter_vars.append(
                {"name": str(iv.var.name), "min": int(iv.dom.min), "extent": int(iv.dom.extent), "kind": kind}
            )
        index = len(self.blocks)
        self.blocks.append({})  # reserve the index: children come after their parent
        allocs = [self.buffer(b) for b in blk.alloc_buffers]
        children: list[dict[str, Any]] | None = None
        body_stores: list[dict[str, Any]] = []
        if isinstance(blk.body, (tirx.BufferStore,)) or (
            isinstance(blk.body, tirx.SeqStmt) and all(isinstance(s, tirx.BufferStore) for s in blk.body.seq)
        ):
            body_stores = self.stores(blk.body, f"block {blk.name_hint}")
        else:
            children = self.stmt_list(blk.body, str(blk.name_hint))
        self.blocks[index] = {
            "name": str(blk.name_hint),
            "iter_vars": iter_vars,
            "reads": [self.region(r) for r in blk.reads],
            "writes": [self.region(w) for w in blk.writes],
            "init": None if blk.init is None else self.stores(blk.init, f"init of {blk.name_hint}"),
            "body": body_stores,
            "children": children,
            "alloc_buffers": allocs,
            "annotations": {str(k): _annotation(v) for k, v in blk.annotations.items()},
        }
        return index

    def realize(self, realize: SBlockRealize) -> dict[str, Any]:
        return {
            "node": "block",
            "block": self.block(realize),
            "bindings": [self.expr(v) for v in realize.iter_values],
            "predicate": self.expr(realize.predicate),
        }

    def stmt_list(self, stmt: Any, block: str) -> list[dict[str, Any]]:
        if isinstance(stmt, tirx.SeqStmt):
            out: list[dict[str, Any]] = []
            for s in stmt.seq:
                out.extend(self.stmt_list(s, block))
            return out
        if isinstance(stmt, tirx.For):
            if not isinstance(stmt.extent, _E.IntImm) or not isinstance(stmt.min, _E.IntImm):
                raise UnsupportedWorkload(f"{self.name}: loop {stmt.loop_var} has a dynamic extent")
            kind = _FOR_KIND.get(int(stmt.kind), "serial")
            loop = {
                "node": "loop",
                "var": str(stmt.loop_var.name),
                "min": int(stmt.min),
                "extent": int(stmt.extent),
                "kind": kind,
                "thread": None if stmt.thread_binding is None else str(stmt.thread_binding.thread_tag),
                "annotations": {str(k): _annotation(v) for k, v in stmt.annotations.items()},
                "body": self.stmt_list(stmt.body, block),
            }
            return [loop]
        if isinstance(stmt, SBlockRealize):
            return [self.realize(stmt)]
        raise UnsupportedWorkload(
            f"{self.name}: block {block!r} contains {_describe(stmt)}, which is not supported outside "
            "a block body (only loops, blocks and buffer stores can be scheduled)"
        )

    def run(self) -> dict[str, Any]:
        params = []
        for param in self.func.params:
            if not isinstance(param, tirx.Buffer):
                raise UnsupportedWorkload(f"{self.name}: parameter {param} is not a buffer")
            params.append(self.buffer(param))
        body = self.func.body
        if not isinstance(body, SBlockRealize):
            raise UnsupportedWorkload(f"{self.name}: the function body is not a root block")
        root = self.realize(body)
        return {
            "name": self.name,
            "params": params,
            "buffers": self.buffer_json,
            "blocks": self.blocks,
            "root": root,
        }


def _describe(stmt: Any) -> str:
    """Name the operator behind an unsupported statement: an extern or packed call by its callee."""
    value = getattr(stmt, "value", None)
    if isinstance(stmt, tirx.Evaluate) and isinstance(value, _Call):
        op = str(value.op.name) if hasattr(value.op, "name") else str(value.op)
        args = list(value.args)
        if op.endswith(("call_extern", "call_packed", "call_pure_extern")) and args:
            callee = args[0].value if isinstance(args[0], _StringImm) else args[0]
            return f"a call to {op.split('.')[-1]} {str(callee)!r}"
        return f"a call to {op!r}"
    text = " ".join(str(stmt).split())
    return f"a {type(stmt).__name__} statement ({text[:80]})"


def _annotation(value: Any) -> Any:
    if isinstance(value, _E.IntImm):
        return int(value.value)
    if isinstance(value, _E.FloatImm):
        return float(value.value)
    if isinstance(value, (int, float, str, bool)):
        return value
    return str(value)


def main_function(mod: Any) -> tuple[str, tirx.PrimFunc]:
    """The one PrimFunc of ``mod`` (a PrimFunc or an IRModule holding exactly one)."""
    if isinstance(mod, tirx.PrimFunc):
        return "main", mod
    if isinstance(mod, tvm.IRModule):
        funcs = [(gv.name_hint, f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
        if len(funcs) != 1:
            raise UnsupportedWorkload(
                f"expected an IRModule with exactly one PrimFunc, found {len(funcs)}: {[n for n, _ in funcs]}"
            )
        return funcs[0]
    raise UnsupportedWorkload(f"expected a tirx.PrimFunc or an IRModule, got {type(mod).__name__}")


def program_dict(func: tirx.PrimFunc, name: str = "main") -> dict[str, Any]:
    """The program model of ``func`` as a JSON-compatible dict."""
    return _Exporter(func, name).run()


def program_json(func: tirx.PrimFunc, name: str = "main") -> str:
    return json.dumps(program_dict(func, name), separators=(",", ":"))


#: Programs imported by :func:`imported_program`, by structural hash, least recently used first.
_programs: collections.OrderedDict[int, tuple[tirx.PrimFunc, _core.Program]] = collections.OrderedDict()
_programs_lock = threading.Lock()
#: How many the cache keeps: a whole model has tens of tasks, each asked for every batch.
PROGRAM_CACHE_SIZE = 128


def imported_program(mod: Any) -> _core.Program:
    """The engine's program model of ``mod``'s PrimFunc (see :func:`main_function`), cached for
    the last :data:`PROGRAM_CACHE_SIZE` functions by structural hash (and equality, so that a
    hash collision cannot return another function's model). Importing a conv costs about 1.2 ms
    here, hashing it 0.2 ms: callers that see the same task batch after batch (the drop-in
    classes, ``extract_features``) pay the import once."""
    func = main_function(mod)[1]
    key = int(tvm_ffi.structural_hash(func))
    with _programs_lock:
        hit = _programs.get(key)
        if hit is not None and tvm_ffi.structural_equal(hit[0], func):
            _programs.move_to_end(key)
            return hit[1]
    program = _core.Program(program_json(func))
    with _programs_lock:
        _programs[key] = (func, program)
        _programs.move_to_end(key)
        while len(_programs) > PROGRAM_CACHE_SIZE:
            _programs.popitem(last=False)
    return program
