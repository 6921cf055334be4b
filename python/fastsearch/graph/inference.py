"""The inference pipeline a Relax model goes through before it is partitioned and tuned.

A model imported from ONNX (or written with batch norm layers) carries training-time structure
that costs time at inference: ``batch_norm`` is one operator (a separate kernel after
legalization), its statistics are combined per element (``sqrt(var + eps)`` in the kernel),
and ONNX's ``Clip`` bounds go through NaN checks. :func:`optimize_for_inference` rewrites it
into the graph that should be tuned:

``decompose``
    ``DecomposeOpsForInference``: batch norm (and other training-aware operators) into their
    inference arithmetic.
``canonicalize``
    ``CanonicalizeBindings``: no trivial rebindings, so every producer sees its real consumers.
``fold-constants``
    ``FoldConstant``: what depends only on weights (the statistics, Clip's bounds, transposed
    weights) is computed once, here.
``fold-scale-shift``
    :func:`fold_scale_shift`: per-channel multiplies, divides, adds and subtracts by constants
    after a convolution or matmul whose weight is constant (batch norm, a bias) go into its
    weight and one bias add. Exact in real arithmetic; in float32 the outputs move by rounding.
``fast-math``
    ``erf``, ``tanh``, ``sigmoid`` and SiLU on float32 (GELU's, SiLU's) become TOPI's
    ``fast_erf`` and ``fast_tanh`` (the sigmoid as ``0.5 + 0.5 * fast_tanh(x / 2)``):
    approximations in plain arithmetic, which vectorize and fuse into the producing matmul's or
    convolution's epilogue. An EfficientNet-B0 tuned with libm's ``expf`` behind its sigmoids
    ran at 3.5x onnxruntime, its SiLU convolutions at 10-30 GFLOP/s. For ``erf``, LLVM otherwise
    calls libm's scalar ``erff`` per element, whose time also depends on the values
    (MetaSchedule's random fill, in [1, 10], takes its fast path: a BERT layer's GELU kernel
    measured 4.4 ms while tuning and 6.1 ms on the model's own data). Outputs move by about
    1e-7 (the approximations' error); onnxruntime computes GELU with a polynomial too.
``winograd``
    In channel-blocked models, 3x3 stride-1 convolutions with at least 14x14 output pixels
    become Winograd's F(4x4, 3x3): an input transform, 36 matrix products over input channels
    and an output transform into which the epilogue fuses, with the weights transformed here
    (:mod:`fastsearch.graph.winograd`). 4x fewer multiplications; outputs move by about 1e-6
    of their magnitude.
``legalize``
    ``LegalizeOps`` and ``AnnotateTIROpPattern``, then ``FoldConstant`` again for anything
    that only became foldable as TIR; Clip stays a ``maximum``/``minimum`` pair, an elementwise
    epilogue the partitioner fuses into the producer.
``dead-code``
    ``DeadCodeElimination``: what the folds left unused.

With ``layout="NCHWc"`` (blocks of 16 channels on an AVX-512 target, else 8) or
``"NCHW{b}c"``, the convolutions and the elementwise work between them are rewritten into
channel-blocked activations just before ``fast-math`` (or ``winograd``, ``legalize``)
(:func:`fastsearch.graph.layout.block_channels`); the default ``"NCHW"`` keeps the imported layout.

TVM's ``static_shape_tuning_pipeline`` runs the same first three steps and legalization but
keeps batch norm as four per-channel operations in every fused kernel's epilogue; onnxruntime
folds batch norm into the convolution, as ``fold-scale-shift`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax, te, topi

from fastsearch.errors import MalformedInput
from fastsearch.graph.layout import block_channels, legalize_rules, parse_layout
from fastsearch.graph.winograd import winograd_convolutions
from fastsearch.ir.relax_expr import constant_array, mutate_relax_functions

__all__ = [
    "STEPS",
    "InferenceReport",
    "fast_math",
    "fold_scale_shift",
    "optimize_for_inference",
    "pipeline_steps",
]

#: The pipeline's steps, in the order they run.
STEPS = (
    "decompose",
    "canonicalize",
    "fold-constants",
    "fold-scale-shift",
    "fast-math",
    "winograd",
    "legalize",
    "dead-code",
)


def pipeline_steps(pipeline: str) -> tuple[str, ...]:
    """The steps of ``tune``'s ``pipeline`` argument: ``"inference"`` all of :data:`STEPS`,
    ``"inference-direct"`` all but ``winograd``, ``"none"`` none."""
    if pipeline == "inference":
        return STEPS
    if pipeline == "inference-direct":
        return tuple(s for s in STEPS if s != "winograd")
    if pipeline == "none":
        return ()
    raise MalformedInput(f"unknown pipeline {pipeline!r}; pipelines: inference, inference-direct, none")


def fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """``0.5 + 0.5 * fast_tanh(x / 2)``, the logistic function through TOPI's rational ``tanh``
    (clamped, so large inputs give 0 and 1). Not through ``fast_exp``: its bit tricks
    (``reinterpret``, shifts) are outside what fastsearch's sketches read, so its tasks would
    go untuned."""
    t = topi.fast_tanh(te.compute(x.shape, lambda *i: x(*i) * 0.5, name="half", tag="elemwise"))
    return te.compute(x.shape, lambda *i: 0.5 + 0.5 * t(*i), name="fast_sigmoid", tag="elemwise")


def fast_silu(x: te.Tensor) -> te.Tensor:
    """``x * fast_sigmoid(x)``."""
    s = fast_sigmoid(x)
    return te.compute(x.shape, lambda *i: x(*i) * s(*i), name="fast_silu", tag="elemwise")


#: What ``fast-math`` rewrites: the operator, and its approximation (float32 only).
_FAST_MATH = {
    "relax.erf": topi.fast_erf,
    "relax.tanh": topi.fast_tanh,
    "relax.sigmoid": fast_sigmoid,
    "relax.nn.silu": fast_silu,
}

_AFFINE_OPS = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide"}


@dataclass
class InferenceReport:
    """What :func:`optimize_for_inference` did: the steps run and how many per-channel
    operations ``fold-scale-shift`` moved into weights."""

    steps: list[str] = field(default_factory=list)
    folded_ops: int = 0
    folded_anchors: int = 0
    fast_math_ops: int = 0  # erf and tanh calls replaced by their approximations
    blocked_convs: int = 0  # convolutions rewritten into channel-blocked layout
    winograd_convs: int = 0  # 3x3 convolutions rewritten as Winograd's F(4x4, 3x3)


def optimize_for_inference(
    mod: tvm.IRModule,
    steps: Sequence[str] = STEPS,
    report: InferenceReport | None = None,
    layout: str = "NCHW",
    target: tvm.target.Target | None = None,
) -> tvm.IRModule:
    """``mod`` (a Relax model) rewritten for inference by ``steps`` (a subset of
    :data:`STEPS`, run in the order of :data:`STEPS`); outputs are unchanged up to float
    rounding. ``layout`` (one of :data:`fastsearch.graph.layout.LAYOUTS`, or ``"NCHW{b}c"``) is the
    activations' layout for convolutions; ``"NCHWc"``'s block follows ``target``'s vectors
    (:func:`fastsearch.graph.layout.default_block`). ``report``, when given, is filled in."""
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise MalformedInput(f"unknown inference pipeline step(s) {unknown}; steps: {', '.join(STEPS)}")
    block = parse_layout(layout, target)
    report = report if report is not None else InferenceReport()
    chosen = set(steps)
    for step in STEPS:
        if step not in chosen:
            continue
        if step == "decompose":
            mod = relax.transform.DecomposeOpsForInference()(mod)
        elif step == "canonicalize":
            mod = relax.transform.CanonicalizeBindings()(mod)
        elif step == "fold-constants":
            mod = relax.transform.FoldConstant()(mod)
        elif step == "fold-scale-shift":
            mod, ops, anchors = _fold_module(mod)
            report.folded_ops += ops
            report.folded_anchors += anchors
        if step in ("fast-math", "winograd", "legalize") and block is not None:
            # Blocking reads Relax's own operators (sigmoid, tanh), which fast-math turns into
            # TIR calls: it comes first.
            mod, report.blocked_convs = block_channels(mod, block)
            block = None
        if step == "fast-math":
            mod, report.fast_math_ops = fast_math(mod)
        elif step == "winograd":
            mod, report.winograd_convs = winograd_convolutions(mod)
        elif step == "legalize":
            # Blocked convolutions need fastsearch's rule (TOPI's refuses channel-chunk layouts),
            # and its layout transforms one indexed by their output.
            mod = relax.transform.LegalizeOps(customize_legalize_map=legalize_rules())(mod)
            mod = relax.transform.AnnotateTIROpPattern()(mod)
            mod = relax.transform.FoldConstant()(mod)
        elif step == "dead-code":
            mod = relax.transform.DeadCodeElimination()(mod)
        report.steps.append(step)
    return mod


@relax.expr_functor.mutator
class _FastMath(relax.PyExprMutator):  # type: ignore[misc]
    """Replaces float32 ``erf``, ``tanh``, ``sigmoid`` and ``silu`` calls with approximations
    in plain arithmetic (``call_te``)."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.replaced = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        op = call.op
        if isinstance(op, tvm.ir.Op) and op.name in _FAST_MATH:
            ty = call.args[0].ty
            if isinstance(ty, relax.TensorType) and ty.dtype == "float32":
                self.replaced += 1
                return self.builder_.call_te(_FAST_MATH[op.name], call.args[0])
        return call


def fast_math(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with every float32 ``erf``, ``tanh``, ``sigmoid`` and ``silu`` of its Relax
    functions replaced by TOPI's ``fast_erf`` and ``fast_tanh``, :func:`fast_sigmoid` and
    :func:`fast_silu`, and how many were replaced."""
    mutator = _FastMath(mod)
    return mutate_relax_functions(mutator, mod), mutator.replaced


def fold_scale_shift(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each chain ``conv2d(x, W)`` or ``matmul(x, W)`` (``W`` constant) followed
    by per-output-channel ``multiply``/``divide``/``add``/``subtract`` by constants rewritten as
    one ``conv2d``/``matmul`` with a scaled weight plus one bias ``add``. A link of the chain
    whose value is also read elsewhere ends it, so no work is duplicated."""
    return _fold_module(mod)[0]


def _fold_module(mod: tvm.IRModule) -> tuple[tvm.IRModule, int, int]:
    ops = anchors = 0
    updates = {}
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            new_func, n_ops, n_anchors = _fold_function(func)
            if n_ops:
                updates[gvar] = new_func
                ops += n_ops
                anchors += n_anchors
    if not updates:
        return mod, 0, 0
    mod = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gvar, func in updates.items():
        mod[gvar] = func
    return relax.transform.Normalize()(mod), ops, anchors


@dataclass
class _Chain:
    """A foldable anchor and the per-channel scale and shift folded into it so far."""

    anchor: relax.Call
    weight: np.ndarray
    bias: np.ndarray | None
    channels: int
    kind: str  # "conv2d" or "matmul"
    links: int = 0


def _anchor(call: relax.Call) -> _Chain | None:
    """A conv2d (NCHW, OIHW) or 2-D-weight matmul with a constant float32 weight."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return None
    name = call.op.name
    weight = constant_array(call.args[1]) if len(call.args) > 1 else None
    if weight is None or weight.dtype != np.float32:
        return None
    if name == "relax.nn.conv2d":
        a = call.attrs
        if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCHW", "OIHW", "NCHW"):
            return None
        if a.out_dtype is not None and str(a.out_dtype) not in ("", "float32", "void"):
            return None
        return _Chain(call, weight, None, weight.shape[0], "conv2d")
    if name == "relax.matmul" and weight.ndim == 2:
        return _Chain(call, weight, None, weight.shape[1], "matmul")
    return None


def _per_channel(const: np.ndarray, chain: _Chain, out_rank: int) -> np.ndarray | None:
    """``const`` as a vector of one value per output channel, when it broadcasts against the
    anchor's output along the channel axis only; else ``None``."""
    if const.dtype != np.float32 or const.ndim > out_rank:
        return None
    shape = (1,) * (out_rank - const.ndim) + tuple(const.shape)
    axis = 1 if chain.kind == "conv2d" else out_rank - 1
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, chain.channels):
        return None
    return np.broadcast_to(
        const.reshape(-1) if const.size > 1 else const.reshape(()), (chain.channels,)
    ).astype("float32")


def _use_counts(func: relax.Function) -> dict[relax.Var, int]:
    counts: dict[relax.Var, int] = {}

    def visit(node: object) -> None:
        if isinstance(node, relax.Var):
            counts[node] = counts.get(node, 0) + 1

    for block in func.body.blocks:
        for binding in block.bindings:
            relax.analysis.post_order_visit(binding.value, visit)
    relax.analysis.post_order_visit(func.body.body, visit)
    return counts


def _extend(chain: _Chain, call: relax.Call, operand: relax.Var, out_rank: int) -> _Chain | None:
    """``chain`` with ``call`` (an affine op of ``operand``, the chain's value) folded in."""
    name = call.op.name
    lhs, rhs = call.args
    if rhs.same_as(operand) and name in ("relax.add", "relax.multiply"):
        lhs, rhs = rhs, lhs  # commutative: the constant may come first
    if not lhs.same_as(operand):
        return None
    const = constant_array(rhs)
    if const is None:
        return None
    vec = _per_channel(const, chain, out_rank)
    if vec is None:
        return None
    if name in ("relax.multiply", "relax.divide"):
        scale = vec if name == "relax.multiply" else (1.0 / vec).astype("float32")
        if not np.all(np.isfinite(scale)):
            return None
        shape = (-1, 1, 1, 1) if chain.kind == "conv2d" else (1, -1)
        weight = (chain.weight * scale.reshape(shape)).astype("float32")
        bias = None if chain.bias is None else (chain.bias * scale).astype("float32")
    else:
        weight = chain.weight
        shift = vec if name == "relax.add" else -vec
        bias = shift if chain.bias is None else (chain.bias + shift).astype("float32")
    return _Chain(chain.anchor, weight, bias, chain.channels, chain.kind, chain.links + 1)


def _fold_function(func: relax.Function) -> tuple[relax.Function, int, int]:
    uses = _use_counts(func)
    chains: dict[relax.Var, _Chain] = {}
    absorbed: set[relax.Var] = set()  # bindings whose value a later link carries
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            value = binding.value
            out_rank = len(binding.var.ty.shape) if getattr(binding.var.ty, "shape", None) is not None else -1
            anchor = _anchor(value)
            if anchor is not None and out_rank > 0:
                chains[binding.var] = anchor
                continue
            if not (
                isinstance(value, relax.Call)
                and isinstance(value.op, tvm.ir.Op)
                and value.op.name in _AFFINE_OPS
                and out_rank > 0
            ):
                continue
            for operand in value.args:
                chain = chains.get(operand) if isinstance(operand, relax.Var) else None
                if chain is None or uses.get(operand, 0) != 1 or operand in absorbed:
                    continue
                if tuple(binding.var.ty.shape) != tuple(operand.ty.shape):
                    continue  # the op broadcasts the anchor's output: not a per-channel epilogue
                extended = _extend(chain, value, operand, out_rank)
                if extended is not None:
                    chains[binding.var] = extended
                    absorbed.add(operand)
                    break
    finals = {v: c for v, c in chains.items() if c.links > 0 and v not in absorbed}
    if not finals:
        return func, 0, 0

    blocks = []
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        bindings = []
        for binding in block.bindings:
            if binding.var in absorbed:
                continue
            chain = finals.get(binding.var)
            if chain is None:
                bindings.append(binding)
                continue
            anchor = chain.anchor
            call = relax.Call(
                anchor.op, [anchor.args[0], relax.const(chain.weight)], anchor.attrs, anchor.ty_args
            )
            if chain.bias is None:
                bindings.append(relax.VarBinding(binding.var, call))
                continue
            anchor_var = relax.DataflowVar(f"{binding.var.name}_anchor", binding.var.ty)
            bindings.append(relax.VarBinding(anchor_var, call))
            shape = (1, -1, 1, 1) if chain.kind == "conv2d" else (-1,)
            bias = relax.op.add(anchor_var, relax.const(chain.bias.reshape(shape)))
            bindings.append(relax.VarBinding(binding.var, bias))
        blocks.append(relax.DataflowBlock(bindings))
    new = relax.Function(
        func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs
    )
    return new, sum(c.links for c in finals.values()), len(finals)
