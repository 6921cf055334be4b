"""Tasks of a whole Relax model: its fused operators, deduplicated, with how often each runs.

The model is fused with fastsearch's own partitioner (:func:`fastsearch.graph.partition.fuse`), so the
PrimFuncs tuned are exactly those TVM compiles. Structurally identical PrimFuncs (the same layer
repeated) become one task whose weight is the number of calls to any of them; the database keys
them by the PrimFunc normalized as MetaSchedule normalizes it, which is what
``relax.transform.MetaScheduleApplyDatabase`` looks up, so one tuned record serves every copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.ir import IRModule
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from tvm_ffi import structural_equal, structural_hash

from fastsearch.errors import FastsearchError, UnsupportedWorkload
from fastsearch.graph.partition import DEFAULT_MAX_FUSE_DEPTH, fuse
from fastsearch.ir.relax_expr import is_tensor_constant
from fastsearch.ir.tir_import import program_dict

__all__ = ["ModelTask", "apply_database", "extract_tasks", "is_relax_module", "mark_layout_free_weights"]

_CALL_TIR_OPS = ("relax.call_tir", "relax.call_tir_inplace")


@dataclass
class ModelTask:
    """One distinct fused PrimFunc of a model: ``name`` (its first function's name), the
    PrimFunc, its ``weight`` (calls per inference), every function of the module it stands for,
    and why it is not tuned (``skip``, ``None`` when it is). ``normalized`` is the PrimFunc as
    MetaSchedule normalizes it (the database's key; what structural comparisons use)."""

    name: str
    func: tvm.tirx.PrimFunc
    weight: int
    functions: list[str] = field(default_factory=list)
    skip: str | None = None
    normalized: IRModule | None = field(default=None, repr=False)


def is_relax_module(mod: object) -> bool:
    """Whether ``mod`` is an IRModule holding a Relax function (a model, not a kernel library)."""
    return isinstance(mod, IRModule) and any(
        isinstance(func, relax.Function) for _, func in mod.functions_items()
    )


def _called_primfunc(node: object) -> str | None:
    """Name of the PrimFunc a ``call_tir`` (or in-place) node calls; None for any other node."""
    if (
        isinstance(node, relax.Call)
        and isinstance(node.op, tvm.ir.Op)
        and node.op.name in _CALL_TIR_OPS
        and isinstance(node.args[0], tvm.ir.GlobalVar)
    ):
        return str(node.args[0].name_hint)
    return None


def _call_counts(mod: IRModule) -> dict[str, int]:
    """Calls to each PrimFunc from the module's Relax functions (``call_tir`` sites)."""
    counts: dict[str, int] = {}

    def visit(node: object) -> None:
        name = _called_primfunc(node)
        if name is not None:
            counts[name] = counts.get(name, 0) + 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


def _has_loops(program: object) -> bool:
    """Whether fastsearch's program model (``program_dict``) of a PrimFunc has a loop."""
    if isinstance(program, dict):
        return program.get("node") == "loop" or any(_has_loops(v) for v in program.values())
    if isinstance(program, list):
        return any(_has_loops(v) for v in program)
    return False


def _skip_reason(func: tvm.tirx.PrimFunc, name: str) -> str | None:
    """Why a task is not worth tuning (or cannot be), else ``None``."""

    # The VM lowers a pure reshape to a view (RewriteDataflowReshape): no kernel runs.
    if relax.analysis.has_reshape_pattern(func):
        return "reshape (a view at run time)"
    try:
        program = program_dict(_normalize_mod(func)["main"], name)
    except FastsearchError as exc:  # an operator fastsearch's sketches do not cover
        return f"unsupported: {str(exc).splitlines()[0][:120]}"
    if not _has_loops(program):
        return "no loops"
    return None


def extract_tasks(
    mod: IRModule,
    max_fuse_depth: int | None = None,
    groups: list[list[int]] | None = None,
    prepack: bool = True,
) -> tuple[IRModule, list[ModelTask]]:
    """Fuse a Relax model (with fastsearch's rule-based groups, or ``groups``: see
    :func:`fastsearch.graph.partition.group_module`) and list its tasks in program order (first call).

    Returns the fused module (what ``tvm.compile`` and the database pass get) and one
    :class:`ModelTask` per distinct PrimFunc that is called; tasks without loops, pure reshapes
    and operators fastsearch cannot import carry a ``skip`` reason and keep TVM's default code.
    With ``prepack``, every PrimFunc argument that is a constant of the model (a weight) is
    marked layout-free: a schedule may read it in another layout, which
    :func:`apply_database` computes once, when the model is compiled.
    """

    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise UnsupportedWorkload("the Relax module has no function `main` to tune")
    fused = fuse(mod, max_fuse_depth or DEFAULT_MAX_FUSE_DEPTH, groups=groups)
    if prepack:
        # Weights (constants) may take the layout a tuned schedule reads them in: MetaSchedule's
        # RewriteLayout rewrites them, and apply_database folds the rewrite into the constants.
        fused = mark_layout_free_weights(fused)
    counts = _call_counts(fused)
    prims = {gv.name_hint: f for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    # Program order: the order of first calls in main, then any other called function by name.
    order: list[str] = []

    def visit(node: object) -> None:
        name = _called_primfunc(node)
        if name is not None and name not in order:
            order.append(name)

    relax.analysis.post_order_visit(fused["main"], visit)
    order += sorted(n for n in counts if n not in order)

    tasks: list[ModelTask] = []
    by_hash: dict[int, list[tuple[tvm.IRModule, ModelTask]]] = {}
    for name in order:
        func = prims.get(name)
        if func is None:
            continue
        normalized = _normalize_mod(func)
        bucket = by_hash.setdefault(structural_hash(normalized), [])
        twin = next((t for m, t in bucket if structural_equal(m, normalized)), None)
        if twin is not None:
            twin.weight += counts[name]
            twin.functions.append(name)
            continue
        task = ModelTask(name=name, func=func, weight=counts[name], functions=[name], normalized=normalized)
        task.skip = _skip_reason(func, name)
        bucket.append((normalized, task))
        tasks.append(task)
    return fused, tasks


def mark_layout_free_weights(mod: IRModule) -> IRModule:
    """``mod`` with each PrimFunc's ``layout_free_buffers`` attribute naming the parameters that
    every call in ``main`` passes a constant (a weight) and that one block reads: MetaSchedule's
    RewriteLayout may give those any layout. TVM's ``AttachAttrLayoutFreeBuffers`` does the same
    but renames every function it touches (``f`` becomes ``f1``), which would rename the user's
    tasks. A weight two blocks read (a Winograd input transform's ``B^T``, read by both of its
    passes) is left out: RewriteLayout relays it out for one reader, prepacking then hands the
    relaid weight to both, and the other reads it wrongly (such candidates failed verification)."""
    constant_args: dict[str, set[int]] = {}

    def visit(node: object) -> None:
        name = _called_primfunc(node)
        if name is None:
            return
        args = node.args[1]  # type: ignore[attr-defined]
        fields = list(args.fields) if isinstance(args, relax.Tuple) else [args]
        found = {i for i, arg in enumerate(fields) if is_tensor_constant(arg)}
        constant_args[name] = constant_args.get(name, found) & found

    relax.analysis.post_order_visit(mod["main"], visit)
    updates = {}
    for gvar, func in mod.functions_items():
        positions = sorted(constant_args.get(gvar.name_hint, ()))
        if not isinstance(func, tvm.tirx.PrimFunc) or not positions:
            continue
        one_reader = _read_by_one_block(func)
        positions = [i for i in positions if i in one_reader]
        if positions:
            updates[gvar] = func.with_attr("layout_free_buffers", positions)
    if not updates:
        return mod
    out = IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gvar, func in updates.items():
        out[gvar] = func
    return out


def _read_by_one_block(func: tvm.tirx.PrimFunc) -> set[int]:
    """Positions of ``func``'s parameters that exactly one block reads."""
    try:
        program = program_dict(func)
    except FastsearchError:  # outside the program model: TVM's rule alone decides
        return set(range(len(func.params)))
    readers: dict[int, int] = {}
    for block in program["blocks"]:
        for buffer in {read["buffer"] for read in block["reads"]}:
            readers[buffer] = readers.get(buffer, 0) + 1
    return {i for i, buffer in enumerate(program["params"]) if readers.get(buffer) == 1}


def apply_database(fused: IRModule, database: object, target: tvm.target.Target) -> IRModule:
    """``fused`` with every PrimFunc that has a valid record replaced by its best schedule
    (``relax.transform.MetaScheduleApplyDatabase``, which needs the target and database in
    scope). A schedule that reads a weight in another layout gets it prepacked: its layout
    rewrite is split into a function of its own (``SplitLayoutRewritePreproc``) whose call on
    the constant weight ``FoldConstant`` computes here, so the model's ``main`` takes the same
    inputs and no inference repeats the rewrite."""
    with target, database:  # type: ignore[attr-defined]
        applied = relax.transform.MetaScheduleApplyDatabase()(fused)
    applied = relax.transform.SplitLayoutRewritePreproc()(applied)
    applied = relax.transform.FoldConstant()(applied)
    # The folded rewrites leave tuples of constants read item by item: each would cost the VM a
    # builtin call per inference (make_tuple, tuple_getitem). Reading the constants directly
    # leaves the tuples dead.
    applied = relax.transform.CanonicalizeBindings()(applied)
    return relax.transform.DeadCodeElimination()(applied)
