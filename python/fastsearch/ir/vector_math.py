"""Vector ``exp``: the TIR pipeline fastsearch builds CPU kernels with.

TVM lowers an ``exp`` that its vectorizer widened (``float32x16``) to LLVM's ``llvm.exp``
intrinsic, which the x86 backend splits into one scalar libm ``expf`` call per lane: a softmax
row of 256 floats pays 256 calls, and a tuned softmax ran 5.6x onnxruntime's time, whose MLAS
kernel evaluates ``exp`` on whole vectors. :func:`vector_exp_pass` rewrites every ``float32``
``exp`` of four or more lanes, after vectorization, into vector arithmetic: Cody-Waite range
reduction (``x = n ln 2 + r``, ``|r| <= ln 2 / 2``), the degree-7 minimax polynomial that
Cephes's ``expf`` uses for ``e^r``, and the scale ``2^n`` built from exponent bits in two
exact halves, so that subnormal results round once. Within 2 ulp of the correctly rounded
result over the whole float range (``tests/test_vector_math.py`` checks every input class:
subnormal results, overflow to ``inf``, ``-inf`` to 0, NaN kept). Vector ``sigmoid`` and
``tanh``, which TVM lowers to formulas in ``exp``, get the same formulas on the vector ``exp``.
Scalar calls and other types keep libm.

The rewrite runs after TVM's lowering, so the scheduled TIR that fastsearch's sketches,
features and database read is unchanged. It needs no library at run time: exported modules
load anywhere TVM's do.

``tvm.compile(mod, target, tir_pipeline=TIR_PIPELINE)`` (or ``tvm.tirx.build(...,
pipeline=TIR_PIPELINE)``) builds with it; importing this module registers the pipeline.
"""

from __future__ import annotations

import re
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import Call
from tvm.tirx import compilation_pipeline

__all__ = ["REWRITTEN_OPS", "TIR_PIPELINE", "vector_exp", "vector_exp_pass"]

#: The name of the TIR pipeline with the vector ``exp`` (TVM's default, then :func:`vector_exp_pass`).
TIR_PIPELINE = "fastsearch"

#: Fewest lanes rewritten: narrower vectors gain little over libm's scalar calls.
MIN_LANES = 4

_EXP = tvm.ir.Op.get("tirx.exp")
_SIGMOID = tvm.ir.Op.get("tirx.sigmoid")
_TANH = tvm.ir.Op.get("tirx.tanh")

# exp(x) = 2^n e^r with n = floor(x log2(e) + 1/2) and r = x - n ln 2, ln 2 split in a part with
# few significant bits (n * _LN2_HI is exact for |n| <= 150) and the rest.
_LOG2E = 1.44269504088896341
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
# e^r = 1 + r + r^2 (p0 r^5 + p1 r^4 + ... + p5) on |r| <= ln 2 / 2 (Cephes expf).
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# Below -104, e^x rounds to 0 in float32; above 89 it overflows to inf (2^128 * e^r). Clamping
# there keeps n within [-150, 128], where both halves of 2^n are normal floats.
_X_MIN = -104.0
_X_MAX = 89.0


def vector_exp(x: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """``e^x`` of a ``float32`` vector expression as vector arithmetic (no libm call)."""
    lanes = _float32_lanes(x)
    if lanes is None:
        raise ValueError(f"vector_exp takes a float32 vector, not {x.ty}")
    fvec, ivec = f"float32x{lanes}", f"int32x{lanes}"

    def const(v: float) -> tvm.tirx.PrimExpr:
        return _splat(v, lanes)

    def pow2(k: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
        # 2^k for integral k in [-126, 127], from the exponent bits
        biased = tirx.Cast(ivec, k) + tirx.Broadcast(tirx.IntImm("int32", 127), lanes)
        bits = tirx.LShift(biased, tirx.Broadcast(tirx.IntImm("int32", 23), lanes))
        return tirx.call_intrin(fvec, "tirx.reinterpret", bits)

    v = tirx.Var("exp_x", fvec)
    xc = tirx.Min(tirx.Max(v, const(_X_MIN)), const(_X_MAX))
    n = tirx.Var("exp_n", fvec)
    r = tirx.Var("exp_r", fvec)
    poly = const(_POLY[0])
    for c in _POLY[1:]:
        poly = poly * r + const(c)
    er = poly * (r * r) + r + const(1.0)
    half = tirx.Var("exp_half", fvec)
    scaled = er * pow2(half) * pow2(n - half)
    body = tirx.Let(
        n,
        tirx.call_intrin(fvec, "tirx.floor", xc * const(_LOG2E) + const(0.5)),
        tirx.Let(
            r,
            xc - n * const(_LN2_HI) - n * const(_LN2_LO),
            tirx.Let(half, tirx.call_intrin(fvec, "tirx.floor", n * const(0.5)), scaled),
        ),
    )
    # NaN is not equal to itself (an ordered comparison): it passes through, as in libm.
    return tirx.Let(v, x, tirx.Select(tirx.EQ(v, v), body, v))


_FLOAT32_VECTOR = re.compile(r"float32x(\d+)")


def _splat(v: float, lanes: int) -> tvm.tirx.PrimExpr:
    """A ``float32`` constant broadcast to ``lanes``."""
    return tirx.Broadcast(tirx.FloatImm("float32", v), lanes)


def _float32_lanes(e: tvm.tirx.PrimExpr) -> int | None:
    """The lanes of a fixed-width ``float32`` vector expression, else None."""
    m = _FLOAT32_VECTOR.fullmatch(str(e.ty))
    return int(m.group(1)) if m else None


def vector_sigmoid(x: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """``1 / (1 + e^-x)`` (TVM's lowering of ``sigmoid``) with :func:`vector_exp`."""
    lanes = _float32_lanes(x)
    assert lanes is not None
    one = _splat(1.0, lanes)
    return one / (one + vector_exp(_splat(-1.0, lanes) * x))


def vector_tanh(x: tvm.tirx.PrimExpr) -> tvm.tirx.PrimExpr:
    """TVM's lowering of ``tanh`` for LLVM (``(1 - e^-2x) / (1 + e^-2x)`` for ``x >= 0``,
    ``(e^2x - 1) / (e^2x + 1)`` below) with :func:`vector_exp`. Both branches read the same
    ``t = e^-2|x|`` (below zero ``e^2x`` is ``t`` and the quotient is ``0 - (1 - t) / (1 + t)``,
    bit for bit), so one ``exp`` serves where TVM's formula evaluates two."""
    lanes = _float32_lanes(x)
    assert lanes is not None
    fvec = f"float32x{lanes}"
    v = tirx.Var("tanh_x", fvec)
    t = tirx.Var("tanh_t", fvec)
    one = _splat(1.0, lanes)
    q = tirx.Var("tanh_q", fvec)
    body = tirx.Let(
        t,
        vector_exp(_splat(-2.0, lanes) * tirx.call_intrin(fvec, "tirx.fabs", v)),
        tirx.Let(
            q,
            (one - t) / (one + t),
            tirx.Select(tirx.GE(v, _splat(0.0, lanes)), q, _splat(0.0, lanes) - q),
        ),
    )
    return tirx.Let(v, x, body)


#: The operators rewritten, and their vector forms.
_VECTOR_FORMS = ((_EXP, vector_exp), (_SIGMOID, vector_sigmoid), (_TANH, vector_tanh))

#: The names of the operators :func:`vector_exp_pass` rewrites (``T.exp`` ... in TVMScript).
REWRITTEN_OPS = tuple(op.name.removeprefix("tirx.") for op, _ in _VECTOR_FORMS)


def _rewrite_call(call: Call) -> Any:
    for op, form in _VECTOR_FORMS:
        if call.op.same_as(op):
            lanes = _float32_lanes(call)
            if lanes is None or lanes < MIN_LANES:
                return call
            return form(call.args[0])
    return call


@tirx.transform.prim_func_pass(opt_level=0, name="fastsearch.VectorExp")
def vector_exp_pass(
    func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext
) -> tirx.PrimFunc:
    """Rewrite the vector ``float32`` ``exp`` calls of a lowered (vectorized) PrimFunc into
    :func:`vector_exp`. Functions for non-CPU targets are left alone: GPU back ends have
    their own vector math."""
    target = func.attrs.get("target") if func.attrs is not None else None
    if target is not None and target.kind.name != "llvm":
        return func
    body = tvm_ffi.structural_map(func.body, (Call, _rewrite_call))
    return func if body.same_as(func.body) else func.with_body(body)


def _pipeline(**kwargs: Any) -> tuple[Any, Any, Any]:
    lower, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline("s_tir", **kwargs)
    return (
        tvm.transform.Sequential([lower, vector_exp_pass], name=TIR_PIPELINE),
        finalize_host,
        finalize_device,
    )


compilation_pipeline.register_tir_pipeline(TIR_PIPELINE, _pipeline)
