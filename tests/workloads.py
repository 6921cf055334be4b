"""Workloads the tests share: TVM's te_workload suite, small shapes of each family, and extra
operators (matmul+relu, softmax, layer norm, pooling, Relax-legalized PrimFuncs)."""

from __future__ import annotations

from typing import Any

import tvm
from fastsearch.ir.tune_context import tune_context
from tvm import te, topi
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

FAMILIES = ["C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG"]

# Small shapes of every family: fast enough to build and run many candidates in a test.
SMALL = {
    "C1D": (te_workload.conv1d_nlc, (1, 16, 8, 16, 3, 2, 1)),
    "C2D": (te_workload.conv2d_nhwc, (1, 8, 8, 4, 8, 3, 1, 1)),
    "C3D": (te_workload.conv3d_ndhwc, (1, 4, 6, 6, 4, 8, 3, 1, 1)),
    "GMM": (te_workload.batch_matmul_nkkm, (1, 16, 16, 16)),
    "GRP": (te_workload.conv2d_nhwc, (1, 8, 8, 8, 8, 3, 1, 1, 1, 4)),
    "DIL": (te_workload.conv2d_nhwc, (1, 10, 10, 4, 8, 3, 1, 0, 2)),
    "DEP": (te_workload.depthwise_conv2d_nhwc, (1, 8, 8, 8, 3, 1, 1)),
    "T2D": (te_workload.conv2d_transpose_nhwc, (1, 4, 4, 8, 4, 4, 2, 1)),
    "CAP": (te_workload.conv2d_capsule_nhwijc, (1, 4, 4, 4, 4, 3, 1, 1, 2)),
    "NRM": (te_workload.norm_bmn, (1, 32, 32)),
    "SFM": (te_workload.softmax_mn, (16, 32)),
    "CBR": (te_workload.conv2d_nhwc_bn_relu, (1, 8, 8, 4, 8, 3, 1, 1)),
    "TBG": (te_workload.transpose_batch_matmul, (1, 8, 2, 8)),
}


def space_context(func: Any, target: tvm.target.Target, kind: str, design_spaces: bool) -> ms.TuneContext:
    """A TuneContext of ``func`` on ``target``, with TVM's default design space for the target
    kind ``kind`` (``"llvm"``, ``"cuda"``: its schedule rules and postprocessors given
    explicitly) when asked."""
    space = None
    if design_spaces:
        space = ms.space_generator.PostOrderApply(
            sch_rules=ms.schedule_rule.ScheduleRule.create(kind),
            postprocs=ms.postproc.Postproc.create(kind),
            mutator_probs={},
        )
    return tune_context(func, target, space=space, task_name="x")


def suite():
    """Every (family, shape index, PrimFunc) of the te_workload suite."""
    for family in FAMILIES:
        for idx in range(len(te_workload.CONFIGS[family][1])):
            yield family, idx, te_workload.create_te_workload(family, idx)


def small(family: str) -> tvm.tirx.PrimFunc:
    fn, params = SMALL[family]
    return te.create_prim_func(fn(*params))


def matmul_relu(n: int = 32) -> tvm.tirx.PrimFunc:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((n, n), lambda i, j: te.max(c[i, j], tvm.tirx.const(0, "float32")), name="D")
    return te.create_prim_func([a, b, d])


def matmul(n: int = 32) -> tvm.tirx.PrimFunc:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return te.create_prim_func([a, b, c])


def softmax(m: int = 8, n: int = 64) -> tvm.tirx.PrimFunc:
    x = te.placeholder((m, n), name="X")
    return te.create_prim_func([x, topi.nn.softmax(x, axis=1)])


def layer_norm(m: int = 8, n: int = 64) -> tvm.tirx.PrimFunc:
    x = te.placeholder((m, n), name="X")
    g = te.placeholder((n,), name="gamma")
    b = te.placeholder((n,), name="beta")
    return te.create_prim_func([x, g, b, topi.nn.layer_norm(x, g, b, axis=[1])])


def pooling(kind: str = "max") -> tvm.tirx.PrimFunc:
    x = te.placeholder((1, 4, 16, 16), name="X")
    y = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), kind, layout="NCHW")
    return te.create_prim_func([x, y])


def extra():
    """The non-suite operators the program model must import."""
    return {
        "matmul": matmul(),
        "matmul_relu": matmul_relu(),
        "softmax": softmax(),
        "layer_norm": layer_norm(),
        "max_pool": pooling("max"),
        "avg_pool": pooling("avg"),
    }


def relax_legalized():
    """PrimFuncs that Relax's LegalizeOps produces for conv2d, dense (matmul), add and relu."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 16, 16), "float32"))
    w = relax.Var("w", relax.TensorType((16, 8, 3, 3), "float32"))
    d = relax.Var("d", relax.TensorType((4, 16), "float32"))
    dw = relax.Var("dw", relax.TensorType((32, 16), "float32"))
    with bb.function("main", [x, w, d, dw]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            a = bb.emit(relax.op.add(c, c))
            r = bb.emit(relax.op.nn.relu(a))
            m = bb.emit(relax.op.matmul(d, relax.op.permute_dims(dw)))
            out = bb.emit_output((r, m))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
