"""Whole models: the fusion groups of a Relax module, computed by fastsearch's Rust partitioner.

``partition(mod)`` returns the groups TVM's ``relax.transform.FuseOps`` would form, as the names
of the PrimFuncs each group calls once the module is legalized; every group becomes one fused
PrimFunc, the unit fastsearch tunes. ``fuse(mod)`` rewrites the module so that TVM compiles
exactly those groups (grouped Relax functions, then ``FuseTIR``).

The graph handed to Rust mirrors the one FuseOps builds (``GraphCreator`` in TVM's
``fuse_ops.cc``): one node per binding of the dataflow blocks of ``main``; a ``call_tir`` takes
its PrimFunc's ``op_pattern``, a tuple-get-item is injective, anything else (tuples, other calls,
match-casts) is opaque; a binding of a non-dataflow variable is an output of the block.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TypeGuard

import tvm
from tvm import relax

from fastsearch import _core
from fastsearch.errors import MalformedInput, UnsupportedWorkload

#: TVM's default of ``relax.FuseOps.max_depth`` (``kMaxFusedOps``).
DEFAULT_MAX_FUSE_DEPTH = 256

_OPAQUE = 8
_INJECTIVE = 2

__all__ = [
    "DEFAULT_MAX_FUSE_DEPTH",
    "OpGraph",
    "extract_graph",
    "fuse",
    "fusion_proposals",
    "group_module",
    "partition",
    "partition_groups",
    "prepare",
]


@dataclass
class OpGraph:
    """The operator graph of one Relax function, in binding order.

    ``nodes`` is the JSON form the Rust core reads; ``bindings[i]`` is the binding of node ``i``,
    ``block_of[i]`` the index of its dataflow block in the function body and ``callee[i]`` the
    name of the PrimFunc it calls (``None`` for anything but a ``call_tir``).
    """

    nodes: list[dict[str, object]] = field(default_factory=list)
    bindings: list[relax.Binding] = field(default_factory=list)
    block_of: list[int] = field(default_factory=list)
    callee: list[str | None] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"nodes": self.nodes})

    def callees(self, nodes: list[int]) -> list[str]:
        """The PrimFuncs the ``call_tir`` bindings among ``nodes`` call, in order."""
        return [c for i in nodes if (c := self.callee[i]) is not None]


def prepare(mod: tvm.IRModule) -> tvm.IRModule:
    """The module as FuseOps sees it in TVM's pipeline: legalized, PrimFuncs annotated with
    their op patterns."""
    mod = relax.transform.LegalizeOps()(mod)
    return relax.transform.AnnotateTIROpPattern()(mod)


def _is_call_tir(value: relax.Expr | None) -> TypeGuard[relax.Call]:
    return (
        isinstance(value, relax.Call)
        and isinstance(value.op, tvm.ir.Op)
        and (value.op.name == "relax.call_tir")
    )


def _leaf_vars(expr: relax.Expr, out: list[relax.Var]) -> None:
    """Variables of a call argument, looking through (nested) tuples as FuseOps does."""
    if isinstance(expr, relax.Var):
        out.append(expr)
    elif isinstance(expr, relax.Tuple):
        for item in expr.fields:
            _leaf_vars(item, out)


def _all_vars(expr: relax.Expr) -> list[relax.Var]:
    found: list[relax.Var] = []

    def visit(node: object) -> None:
        if isinstance(node, relax.Var):
            found.append(node)

    relax.analysis.post_order_visit(expr, visit)
    return found


def _op_pattern(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> int:
    func = mod[gvar]
    if func.attrs is not None and "op_pattern" in func.attrs:
        return int(func.attrs["op_pattern"])
    return _OPAQUE


def extract_graph(mod: tvm.IRModule, func_name: str = "main") -> OpGraph:
    """The operator graph of ``mod[func_name]`` (a legalized, annotated module)."""
    if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise UnsupportedWorkload(f"the module has no function `{func_name}`")
    func = mod[func_name]
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        raise UnsupportedWorkload(f"`{func_name}` is not a Relax function with a body of blocks")
    graph = OpGraph()
    index_of: dict[relax.Var, int] = {}
    for block_index, block in enumerate(func.body.blocks):
        # FuseOps leaves ordinary binding blocks alone: they may have side effects.
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in block.bindings:
            value = binding.value if isinstance(binding, relax.VarBinding) else None
            callee = None
            used: list[relax.Var] = []
            if isinstance(binding, relax.MatchCast):
                pattern = _OPAQUE  # FuseOps adds no edge into a match-cast
            elif _is_call_tir(value):
                callee = value.args[0].name_hint
                pattern = _op_pattern(mod, value.args[0])
                _leaf_vars(value.args[1], used)
            elif isinstance(value, relax.Call):
                pattern = _OPAQUE
                for arg in value.args:
                    _leaf_vars(arg, used)
            elif isinstance(value, relax.TupleGetItem):
                pattern = _INJECTIVE
                _leaf_vars(value.tuple_value, used)
            else:
                pattern = _OPAQUE
                used = _all_vars(value)
            # Parameters and variables of other blocks are inputs from outside: no edge.
            inputs = [index_of[v] for v in used if v in index_of]
            index_of[binding.var] = len(graph.nodes)
            graph.nodes.append(
                {
                    "name": callee or binding.var.name,
                    "pattern": pattern,
                    "inputs": inputs,
                    "external": not isinstance(binding.var, relax.DataflowVar),
                }
            )
            graph.bindings.append(binding)
            graph.block_of.append(block_index)
            graph.callee.append(callee)
    return graph


def partition_groups(graph: OpGraph, max_fuse_depth: int = DEFAULT_MAX_FUSE_DEPTH) -> list[list[int]]:
    """Node indices of each fusion group, in the order FuseOps emits them (GIL released)."""
    if max_fuse_depth < 1:
        raise MalformedInput(f"max_fuse_depth must be at least 1, not {max_fuse_depth}")
    return _core.partition_graph(graph.to_json(), max_fuse_depth)


def partition(
    mod: tvm.IRModule,
    max_fuse_depth: int = DEFAULT_MAX_FUSE_DEPTH,
    func_name: str = "main",
) -> list[list[str]]:
    """The fusion groups of a Relax module, in program order.

    Each group is the list of the PrimFuncs its calls invoke once the module is legalized (in
    binding order); a group without any ``call_tir`` (a lone tuple, say) is left out.
    """
    graph = extract_graph(prepare(mod), func_name)
    names = []
    for group in partition_groups(graph, max_fuse_depth):
        callees = graph.callees(group)
        if callees:
            names.append(callees)
    return names


def _check_groups(graph: OpGraph, groups: list[list[int]]) -> None:
    """Explicit groups must cover every node once, stay within one dataflow block and come
    after the groups they read from."""
    group_of: dict[int, int] = {}
    for g, members in enumerate(groups):
        if not members:
            raise MalformedInput(f"fusion group {g} is empty")
        for node in members:
            if not 0 <= node < len(graph.nodes) or node in group_of:
                raise MalformedInput(f"fusion group {g} names node {node}: unknown or already grouped")
            group_of[node] = g
        if len({graph.block_of[i] for i in members}) > 1:
            raise MalformedInput(f"fusion group {g} spans two dataflow blocks")
    if len(group_of) != len(graph.nodes):
        missing = sorted(set(range(len(graph.nodes))) - set(group_of))
        raise MalformedInput(f"nodes {missing[:5]} are in no fusion group")
    for node, spec in enumerate(graph.nodes):
        for i in spec["inputs"]:  # type: ignore[attr-defined]
            if group_of[i] > group_of[node]:
                raise MalformedInput(
                    f"fusion group {group_of[node]} comes before group {group_of[i]}, which it reads"
                )


def fusion_proposals(
    mod: tvm.IRModule,
    max_fuse_depth: int = DEFAULT_MAX_FUSE_DEPTH,
    func_name: str = "main",
) -> list[tuple[str, list[list[str]]]]:
    """Changes to the rule-based grouping that FuseOps never makes, as ``fusion="search"``
    tries them: ``(kind, groups)`` with kind ``"prologue"``, ``"epilogue"`` or
    ``"horizontal"`` and the merged groups as :func:`partition` names them."""
    graph = extract_graph(prepare(mod), func_name)
    groups = partition_groups(graph, max_fuse_depth)
    found: list[tuple[str, list[list[str]]]] = []
    for kind, merged in _core.fusion_proposals(graph.to_json(), groups, max_fuse_depth):
        found.append((kind, [graph.callees(groups[g]) for g in merged]))
    return found


def _rebuild(expr: relax.Expr, remap: dict[relax.Var, relax.Expr]) -> relax.Expr:
    """``expr`` with variables replaced through ``remap`` (the forms bindings take after
    legalization: calls, tuples, tuple-get-items, leaves)."""
    if isinstance(expr, relax.Var):
        return remap.get(expr, expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_rebuild(item, remap) for item in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_rebuild(expr.tuple_value, remap), expr.index)
    if isinstance(expr, relax.Call):
        args = [_rebuild(arg, remap) for arg in expr.args]
        return relax.Call(expr.op, args, expr.attrs, expr.ty_args)
    return expr


def _lift_inputs(expr: relax.Expr, defined: set[relax.Var], inputs: list[relax.Expr]) -> None:
    """Appends the values ``expr`` reads from outside the group (variables, constants)."""
    if isinstance(expr, relax.Var):
        if expr not in defined and not any(expr.same_as(i) for i in inputs):
            inputs.append(expr)
    elif isinstance(expr, tvm.ir.expr.Constant):
        if not any(expr.same_as(i) for i in inputs):
            inputs.append(expr)
    elif isinstance(expr, relax.Tuple):
        for item in expr.fields:
            _lift_inputs(item, defined, inputs)
    elif isinstance(expr, relax.TupleGetItem):
        _lift_inputs(expr.tuple_value, defined, inputs)
    elif isinstance(expr, relax.Call):
        for arg in expr.args:
            _lift_inputs(arg, defined, inputs)


def _group_function(
    bindings: list[relax.Binding], outputs: list[relax.Var]
) -> tuple[relax.Function, list[relax.Expr]]:
    """A primitive Relax function holding ``bindings`` and returning ``outputs``, with the
    arguments to call it with (as FuseOps' ``FunctionCreator`` makes them)."""
    inputs: list[relax.Expr] = []
    defined: set[relax.Var] = set()
    for binding in bindings:
        _lift_inputs(binding.value, defined, inputs)
        defined.add(binding.var)
    params = [
        relax.Var(i.name if isinstance(i, relax.Var) else f"param_{n}", i.ty) for n, i in enumerate(inputs)
    ]
    remap: dict[relax.Var, relax.Expr] = {}
    constants: list[tuple[relax.Expr, relax.Var]] = []
    for value, param in zip(inputs, params, strict=True):
        if isinstance(value, relax.Var):
            remap[value] = param
        else:
            constants.append((value, param))

    def substitute(expr: relax.Expr) -> relax.Expr:
        for constant, param in constants:
            if expr.same_as(constant):
                return param
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([substitute(item) for item in expr.fields])
        if isinstance(expr, relax.Call):
            return relax.Call(expr.op, [substitute(a) for a in expr.args], expr.attrs, expr.ty_args)
        return expr

    builder = relax.BlockBuilder()
    with builder.function("group", params, attrs={"Primitive": True}, private=True):
        with builder.dataflow():
            results = []
            for binding in bindings:
                value = substitute(_rebuild(binding.value, remap))
                if binding.var in outputs:
                    new_var = builder.emit_output(value, binding.var.name)
                    results.append((binding.var, new_var))
                else:
                    new_var = builder.emit(value, binding.var.name)
                remap[binding.var] = new_var
        by_var = dict(results)
        returned = [by_var[v] for v in outputs]
        builder.emit_func_output(returned[0] if len(returned) == 1 else relax.Tuple(returned))
    return builder.get()["group"], inputs


def group_module(
    mod: tvm.IRModule,
    max_fuse_depth: int = DEFAULT_MAX_FUSE_DEPTH,
    func_name: str = "main",
    groups: list[list[int]] | None = None,
) -> tvm.IRModule:
    """``mod`` legalized, with each of fastsearch's fusion groups of more than one binding moved
    into its own primitive Relax function (what FuseOps produces, with our groups).

    ``groups`` replaces the rule-based grouping: node indices of :func:`extract_graph`'s graph
    of the prepared module, groups in an order where each follows its inputs (what
    :func:`partition_groups` and ``fastsearch.tuning.fusion_search`` give)."""
    mod = prepare(mod)
    graph = extract_graph(mod, func_name)
    if groups is None:
        groups = partition_groups(graph, max_fuse_depth)
    else:
        _check_groups(graph, groups)
    func = mod[func_name]
    # Variables read outside their group's bindings: group outputs.
    read_by: dict[relax.Var, set[int]] = {}
    group_of = {}
    for g, members in enumerate(groups):
        for node in members:
            group_of[node] = g
    for node, binding in enumerate(graph.bindings):
        for var in _all_vars(binding.value):
            read_by.setdefault(var, set()).add(group_of[node])
    for var in _all_vars(func.body.body):
        read_by.setdefault(var, set()).add(-1)

    builder = relax.BlockBuilder(mod)
    emitted: dict[int, list[relax.Binding]] = {}
    for g, members in enumerate(groups):
        block = graph.block_of[members[0]]
        bindings = [graph.bindings[i] for i in members]
        out = emitted.setdefault(block, [])
        if len(members) == 1:
            out.extend(bindings)
            continue
        outputs = [
            b.var
            for b in bindings
            if not isinstance(b.var, relax.DataflowVar) or read_by.get(b.var, set()) - {g}
        ]
        if not outputs:
            continue  # dead code, as FuseOps drops it
        group_func, args = _group_function(bindings, outputs)
        callees = graph.callees(members)
        gvar = builder.add_func(group_func, "fused_" + "_".join(callees or ["group"]))
        call = relax.Call(gvar, args)
        if len(outputs) == 1:
            out.append(relax.VarBinding(outputs[0], call))
        else:
            packed = relax.DataflowVar(f"{gvar.name_hint}_out", group_func.ret_ty)
            out.append(relax.VarBinding(packed, call))
            for index, var in enumerate(outputs):
                out.append(relax.VarBinding(var, relax.TupleGetItem(packed, index)))
    blocks = []
    for index, block in enumerate(func.body.blocks):
        if isinstance(block, relax.DataflowBlock):
            blocks.append(relax.DataflowBlock(emitted.get(index, [])))
        else:
            blocks.append(block)
    new_func = relax.Function(
        func.params,
        relax.SeqExpr(blocks, func.body.body),
        func.ret_ty,
        func.is_pure,
        func.attrs,
    )
    result = builder.get()
    result[func_name] = new_func
    return relax.transform.Normalize()(result)


def fuse(
    mod: tvm.IRModule,
    max_fuse_depth: int = DEFAULT_MAX_FUSE_DEPTH,
    func_name: str = "main",
    groups: list[list[int]] | None = None,
) -> tvm.IRModule:
    """``mod`` with fastsearch's fusion groups (or ``groups``, see :func:`group_module`) fused
    into one PrimFunc each (``FuseTIR``), ready for ``tvm.compile`` with a pipeline that does
    not fuse again (the default CPU one)."""
    grouped = group_module(mod, max_fuse_depth, func_name, groups)
    return relax.transform.DeadCodeElimination()(relax.transform.FuseTIR()(grouped))
