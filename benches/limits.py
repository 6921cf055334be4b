"""The distance to the limit: each suite kernel's FLOP/s against the machine's peak and against
the best library kernel for the same computation, all on the same threads (issue 28, item 5).

Every timing runs in fresh processes on ``--threads`` threads (default: the physical cores):
TVM's runtime through ``TVM_NUM_THREADS``, numpy's BLAS through threadpoolctl's limit,
onnxruntime through its intra-op threads (inter-op 1), PyTorch through ``set_num_threads``.

**Peak FP32 FLOP/s** is the higher of

- an FMA-bound micro-kernel built with TVM for this target: each thread keeps ``R``
  accumulators of the target's vector width in registers and runs ``acc = acc * a + b`` on
  them; the harness reads the generated assembly's hot loop and reports how many of its
  instructions are vector FMAs (the rest should be the loop's counter and branch), for
  several ``R``;
- numpy's matmul (its BLAS: OpenBLAS in numpy's wheels) at large square sizes.

**Anchors**, per workload: numpy's matmul for GMM and for TBG (through its transposed views,
one sgemm per head); for the convolutions (C1D, C2D, GRP, DIL, C3D, DEP, CBR) a one-node ONNX
graph of the same convolution under onnxruntime's MLAS kernels, NHWC data and HWIO weights
transposed to ONNX's NCHW and OIHW, weights as initializers, depthwise as a group conv, and
CBR's bias, batch-norm scale and offset and ReLU as Conv (with bias), Mul, Add, Relu
(onnxruntime folds the Mul and Add into the conv); SFM as one Softmax node. onnxruntime runs at
its ``extended`` and ``all`` graph levels (``all`` wraps a conv in NCHWc reorders, which wins
on some shapes and loses on others); the faster is the anchor. PyTorch CPU is timed too where
``torch`` imports. Each anchor's output is checked once against the te workload compiled
unscheduled with TVM on the same random inputs (``max_abs_diff`` in the JSON).

**FLOPs** are 2 x multiply-adds (:func:`flop_count`); CBR's epilogue (4 operations per output,
0.3% of CBR:1) is left out, and softmax has no count (it is bound by exp and memory, not FMAs):
its rows show times only. :func:`rate` turns a kernel time into GFLOP/s and a fraction of peak.

**Tuned kernels**: ``--suite-dir`` (a ``benches.suite`` out-dir) re-times each run's best
fastsearch and MetaSchedule kernels at ``--trials`` (default: the run's own trials) from the
suite's databases, all seeds of a workload together in fresh processes
(:func:`benches.kernel_retime.retime_in_processes`); ``--work-dir GMM:2=DIR`` does the same for
the best record of a ``fastsearch tune`` work directory.

The harness never sets ``OPENBLAS_CORETYPE`` or ``OPENBLAS_L2_SIZE``; it reports the kernel
OpenBLAS chose. The final measurement, on a quiet machine, unsets them for its own command:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benches.limits \\
        --suite-dir benches/results/SUITE --trials 256 --out-dir benches/results/limits_HOST

Output: ``limits.json`` and ``limits.md`` in ``--out-dir``; the table is printed too.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import inspect
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from fastsearch.cli.main import load_workload
from fastsearch.graph.model_timing import run_in_fresh_process, time_in_fresh_processes
from fastsearch.ir.machine import vector_bytes
from fastsearch.ir.target import physical_cores, resolve_target
from fastsearch.ir.vector_math import TIR_PIPELINE
from fastsearch.measure.measurer import random_arguments
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload
from tvm.script import tirx as T

from benches.kernel_retime import retime_in_processes
from benches.runs import (
    BUSY_THRESHOLD,
    best_within,
    compile_record,
    fastsearch_dir,
    metaschedule_dir,
    other_cpu_load,
    records_in_order,
    suite_runs,
)
from benches.suite import DEFAULT_WORKLOADS

if TYPE_CHECKING:
    import onnx

#: The suite's workloads and GMM:3, the (1, 1024, 1024, 1024) GMM of issue 28's BLAS target.
WORKLOADS = [*DEFAULT_WORKLOADS, "GMM:3"]

#: onnxruntime's graph levels every ONNX anchor is timed at (the faster one is the anchor).
ORT_LEVELS = ("extended", "all")

#: An anchor whose output differs from the te workload's by more than this, relative to the
#: largest output, is not the same computation (float32 sums differ by ~1e-6 relative).
MATCH_RTOL = 1e-4

#: TVM allocates a CPU buffer smaller than this on the stack (``kMaxStackAlloca``).
STACK_BYTES = 1024

# ------------------------------------------------------------------------------ FLOPs


def te_params(family: str, shape: tuple) -> tuple[str, dict[str, Any]]:
    """The te_workload function of ``family`` and its arguments for ``shape``, by name."""
    fn = te_workload.CONFIGS[family][0]
    bound = inspect.signature(fn).bind(*shape)
    bound.apply_defaults()
    return fn.__name__, dict(bound.arguments)


def _out_extent(size: int, k: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


#: Spatial dimensions of each convolution's input, as its te function names them.
_CONV_SPATIAL = {
    "conv1d_nlc": ("L",),
    "conv2d_nhwc": ("H", "W"),
    "conv3d_ndhwc": ("D", "H", "W"),
    "depthwise_conv2d_nhwc": ("H", "W"),
    "conv2d_nhwc_bn_relu": ("H", "W"),
}


def _stride(p: dict[str, Any]) -> int:
    """A convolution's stride (CBR's te function names it ``strides``)."""
    return int(p["stride"] if "stride" in p else p["strides"])


def flop_count_of(fn_name: str, p: dict[str, Any]) -> float | None:
    """2 x multiply-adds of one call of te_workload's ``fn_name`` with arguments ``p``; None
    for a function without a count here (softmax, norms, pooling, transposed convs)."""
    if fn_name == "batch_matmul_nkkm":
        return 2.0 * p["B"] * p["N"] * p["M"] * p["K"]
    if fn_name == "transpose_batch_matmul":
        return 2.0 * p["batch"] * p["n_head"] * p["seq_len"] ** 2 * p["n_dim"]
    if fn_name not in _CONV_SPATIAL:
        return None
    k = p["kernel_size"]
    stride = _stride(p)
    outputs = math.prod(
        [_out_extent(p[d], k, stride, p["padding"], p["dilation"]) for d in _CONV_SPATIAL[fn_name]]
    )
    taps = k ** len(_CONV_SPATIAL[fn_name])
    if fn_name == "depthwise_conv2d_nhwc":
        return 2.0 * p["N"] * outputs * p["C"] * p["factor"] * taps
    return 2.0 * p["N"] * outputs * p["CO"] * taps * p["CI"] // p.get("groups", 1)


def flop_count(workload: str) -> float | None:
    """2 x multiply-adds of one call of ``workload`` (``GMM:2``; see :func:`flop_count_of`)."""
    wl = load_workload(workload)
    return flop_count_of(*te_params(wl.family, wl.shape))


def _peak_gflops(peak: float | str | os.PathLike[str]) -> float:
    if isinstance(peak, int | float):
        return float(peak)
    return float(json.loads(Path(peak).read_text())["peak"]["gflops"])


def rate(
    workload: str, seconds: float, peak: float | str | os.PathLike[str]
) -> tuple[float | None, float | None]:
    """GFLOP/s of a kernel of ``workload`` that takes ``seconds`` per call, and its fraction of
    ``peak`` (GFLOP/s, or the path of a ``limits.json`` this harness wrote); (None, None) for a
    workload without a FLOP count."""
    flops = flop_count(workload)
    if flops is None or seconds <= 0:
        return None, None
    gflops = flops / seconds / 1e9
    return gflops, gflops / _peak_gflops(peak)


# ------------------------------------------------------------------------------ the FMA kernel


def fma_kernel(threads: int, accumulators: int, lanes: int, iterations: int, rows: int) -> tvm.tirx.PrimFunc:
    """Each of ``threads`` parallel jobs runs ``iterations`` x ``accumulators`` independent
    vector FMAs of ``lanes`` floats: ``acc = acc * B[0] + B[1]``. ``A`` (threads, rows, lanes)
    seeds and receives the accumulators, so nothing is dead code; ``rows`` >= ``accumulators``
    gives every variant the same arguments. The accumulators are a ``global`` buffer under
    :data:`STACK_BYTES`: TVM puts such a buffer on the stack, where LLVM keeps it in registers;
    a ``local`` one, or one of 1 KiB or more, goes to a workspace allocation, and every FMA then
    loads and stores (the hot loop shows it)."""

    @T.prim_func
    def fma(A: T.Buffer((threads, rows, lanes), "float32"), B: T.Buffer((2,), "float32")) -> None:  # type: ignore[valid-type]
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        for p in T.parallel(threads):
            acc = T.alloc_buffer((accumulators, lanes), "float32")
            for r in T.unroll(accumulators):
                for v in T.vectorized(lanes):
                    acc[r, v] = A[p, r, v]
            for _ in range(iterations):
                for r in T.unroll(accumulators):
                    for v in T.vectorized(lanes):
                        acc[r, v] = acc[r, v] * B[0] + B[1]
            for r in T.unroll(accumulators):
                for v in T.vectorized(lanes):
                    A[p, r, v] = acc[r, v]

    return fma


_LABEL = re.compile(r"^(\.?L\w+):")
_JUMP = re.compile(r"^j\w+\s+(\.?L\w+)$")


def hot_loop(asm: str) -> dict[str, Any]:
    """The loop of ``asm`` with the most vector FMAs (a block from a label to a jump back to
    it): its instructions, how many are FMAs, whether any FMA reads memory, and the registers
    they use (``zmm``: 512-bit)."""
    lines = [ln.split("#")[0].strip() for ln in asm.splitlines()]
    seen: dict[str, int] = {}
    best: list[str] = []
    for i, line in enumerate(lines):
        label, jump = _LABEL.match(line), _JUMP.match(line)
        if label:
            seen[label.group(1)] = i
        elif jump and jump.group(1) in seen:
            body = [ln for ln in lines[seen[jump.group(1)] + 1 : i + 1] if ln and not ln.startswith(".")]
            body = [ln for ln in body if not _LABEL.match(ln)]
            if sum(_is_fma(ln) for ln in body) > sum(_is_fma(ln) for ln in best):
                best = body
    fmas = [ln for ln in best if _is_fma(ln)]
    return {
        "instructions": len(best),
        "fmas": len(fmas),
        "fma_share": len(fmas) / len(best) if best else 0.0,
        "fma_reads_memory": any("(" in ln for ln in fmas),
        "registers": sorted({m for ln in fmas for m in re.findall(r"%([xyz]mm)\d+", ln)}),
        "body": best,
    }


def _is_fma(line: str) -> bool:
    return bool(re.match(r"v?f(n)?m(add|sub)\d*[ps]s\b", line))


def fma_peak(
    target: tvm.target.Target, threads: int, processes: int, rounds: int, min_repeat_ms: int
) -> dict[str, Any]:
    """GFLOP/s of :func:`fma_kernel` on ``threads`` threads for a few accumulator counts (enough
    independent FMAs in flight to hide their latency on both FMA pipes, few enough to stay in
    registers and on the stack), each variant's hot loop, and the best variant whose hot loop
    is FMA-bound (at least 3 in 4 instructions FMAs on registers; the fastest where none is)."""
    lanes = vector_bytes(target) // 4
    counts = [r for r in (6, 8, 10, 12, 14) if r * lanes * 4 < STACK_BYTES]
    rows = max(counts)
    variants: list[dict[str, Any]] = []
    libs = []
    for acc in counts:
        iterations = max(1, int(2e8 // (acc * lanes)))  # 0.4 GFLOP a thread: a few ms a call
        func = fma_kernel(threads, acc, lanes, iterations, rows)
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
        loop = hot_loop(lib.mod.inspect_source("asm"))
        flops = 2.0 * threads * iterations * acc * lanes
        variants.append(
            {"accumulators": acc, "lanes": lanes, "iterations": iterations, "flops": flops, "hot_loop": loop}
        )
        libs.append(lib)
    signature = fma_kernel(threads, counts[0], lanes, 1, rows)  # every variant's arguments
    per_process = retime_in_processes(libs, signature, rounds, processes, min_repeat_ms)
    for i, v in enumerate(variants):
        v["seconds"] = statistics.median(row[i] for row in per_process)
        v["gflops"] = v["flops"] / v["seconds"] / 1e9
        v["fma_bound"] = v["hot_loop"]["fma_share"] >= 0.75 and not v["hot_loop"]["fma_reads_memory"]
    bound = [v for v in variants if v["fma_bound"]] or variants
    best = max(bound, key=lambda v: v["gflops"])
    return {"gflops": best["gflops"], "best": best["accumulators"], "variants": variants}


# ------------------------------------------------------------------------------ anchors


@dataclass
class Case:
    """One workload: its te function, random arguments and output (the te workload compiled
    unscheduled with TVM), and what the anchors need."""

    workload: str
    fn_name: str
    params: dict[str, Any]
    args: list[np.ndarray]
    reference: np.ndarray
    flops: float | None
    anchors: list[dict[str, Any]] = field(default_factory=list)
    tuned: dict[str, Any] = field(default_factory=dict)


def te_reference(func: Any, args: list[np.ndarray]) -> np.ndarray:
    """The last argument of ``func`` (its output) after one call of it compiled unscheduled."""
    lib = tvm.compile(func, target="llvm")
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def make_case(workload: str, family: str, shape: tuple, seed: int = 0) -> Case:
    """A :class:`Case` of te_workload's ``family`` at ``shape`` (``workload`` is its label)."""
    fn_name, params = te_params(family, shape)
    func = te.create_prim_func(te_workload.CONFIGS[family][0](*shape))
    args = random_arguments(ms.arg_info.ArgInfo.from_prim_func(func), seed=seed)
    return Case(workload, fn_name, params, args, te_reference(func, args), flop_count_of(fn_name, params))


def _channels_first(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, a.ndim - 1, *range(1, a.ndim - 1)))


def channels_last(a: np.ndarray) -> np.ndarray:
    """An NC... array (ONNX's layout) as N...C (te_workload's)."""
    return np.ascontiguousarray(a.transpose(0, *range(2, a.ndim), 1))


def conv_in_onnx_layout(case: Case) -> dict[str, Any] | None:
    """The case's convolution as ONNX's Conv takes it: ``x`` (NCHW), ``w`` (OIHW), ``bias``,
    ``scale`` and ``offset`` (CBR's batch norm, else None), ``attrs``; None for no conv."""
    spatial = _CONV_SPATIAL.get(case.fn_name)
    if spatial is None:
        return None
    p, nd = case.params, len(spatial)
    x, w = _channels_first(case.args[0]), case.args[1]
    if case.fn_name == "depthwise_conv2d_nhwc":
        w, groups = w[0].transpose(2, 0, 1)[:, None], p["C"]  # (1, kh, kw, C) -> (C, 1, kh, kw)
    else:
        w, groups = w.transpose(nd + 1, nd, *range(nd)), p.get("groups", 1)  # (k.., CI/g, CO) -> OI k..
    stride = _stride(p)
    attrs = {
        "kernel_shape": [p["kernel_size"]] * nd,
        "strides": [stride] * nd,
        "pads": [p["padding"]] * (2 * nd),
        "dilations": [p["dilation"]] * nd,
        "group": groups,
    }
    bn = case.fn_name == "conv2d_nhwc_bn_relu"  # args: data, kernel, bias, bn_offset, bn_scale, out
    return {
        "x": x,
        "w": np.ascontiguousarray(w),
        "bias": case.args[2] if bn else None,
        "scale": case.args[4] if bn else None,
        "offset": case.args[3] if bn else None,
        "attrs": attrs,
    }


def onnx_graph(case: Case) -> tuple[onnx.ModelProto, list[np.ndarray], bool] | None:
    """An ONNX graph computing the case (one Conv, with CBR's Mul, Add and Relu after it; or one
    Softmax), its inputs, and whether its output is channels-first (to compare with the te
    output); None when the case has no ONNX counterpart here."""
    from onnx import TensorProto, helper, numpy_helper

    if case.fn_name == "softmax_mn":
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1)]
        feeds, inits, first = [case.args[0]], [], False
    else:
        conv = conv_in_onnx_layout(case)
        if conv is None:
            return None
        channel = [-1] + [1] * len(conv["attrs"]["kernel_shape"])  # broadcasts over NC...
        inits = [numpy_helper.from_array(conv["w"], "w")]
        inputs = ["x", "w"]
        if conv["bias"] is not None:
            inits += [numpy_helper.from_array(conv["bias"], "b")]
            inputs.append("b")
        nodes = [helper.make_node("Conv", inputs, ["conv"], **conv["attrs"])]
        if conv["scale"] is not None:
            inits += [
                numpy_helper.from_array(conv["scale"].reshape(channel), "scale"),
                numpy_helper.from_array(conv["offset"].reshape(channel), "offset"),
            ]
            nodes += [
                helper.make_node("Mul", ["conv", "scale"], ["scaled"]),
                helper.make_node("Add", ["scaled", "offset"], ["shifted"]),
                helper.make_node("Relu", ["shifted"], ["y"]),
            ]
        else:
            nodes[0].output[0] = "y"
        feeds, first = [conv["x"]], True
    graph = helper.make_graph(
        nodes,
        case.workload,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(feeds[0].shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # opset 17's: an onnxruntime older than this onnx package still reads it
    return model, feeds, first


def match_reference(case: Case, output: np.ndarray) -> dict[str, Any]:
    """How far an anchor's output (in te's layout) is from the te workload's, and whether that
    is within :data:`MATCH_RTOL` of its largest value."""
    diff = float(np.abs(output.astype("float64") - case.reference).max())
    scale = float(np.abs(case.reference).max()) or 1.0
    return {"max_abs_diff": diff, "matches": diff <= MATCH_RTOL * scale}


def _times(library: str, seconds: list[float], flops: float | None) -> dict[str, Any]:
    med = statistics.median(seconds)
    return {
        "library": library,
        "seconds": med,
        "fastest_s": min(seconds),
        "rounds": len(seconds),
        "gflops": flops / med / 1e9 if flops else None,
    }


def has_onnxruntime() -> bool:
    """Whether the ONNX anchors can run (``onnx`` builds their graphs, onnxruntime runs them)."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


def onnx_anchors(case: Case, threads: int, processes: int, rounds: int, min_repeat_ms: int) -> None:
    """onnxruntime's time for the case's one-node graph at each of :data:`ORT_LEVELS`, and
    whether its output matches the te workload's, appended to ``case.anchors``."""
    if not has_onnxruntime():
        return
    built = onnx_graph(case)
    if built is None:
        return
    import onnx
    import onnxruntime

    model, feeds, first = built
    with tempfile.TemporaryDirectory(prefix="limits_onnx_") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, path)
        for level in ORT_LEVELS:
            timing = time_in_fresh_processes(
                {}, feeds, threads, path, processes, rounds, min_repeat_ms, ort_optimization=level
            )
            out = timing.outputs["onnxruntime"]
            label = f"onnxruntime {onnxruntime.__version__} ({level})"
            anchor = _times(label, timing.times["onnxruntime"], case.flops)
            case.anchors.append({**anchor, **match_reference(case, channels_last(out) if first else out)})


def _matmul_job(case: Case) -> dict[str, Any] | None:
    """The case as a numpy matmul job (:mod:`benches.limits_child`), or None."""
    p = case.params
    if case.fn_name == "batch_matmul_nkkm":
        return {
            "name": case.workload,
            "kind": "matmul",
            "a": [p["B"], p["N"], p["K"]],
            "b": [p["B"], p["K"], p["M"]],
        }
    if case.fn_name == "transpose_batch_matmul":  # query (b, l, h, d) @ value^T per head
        shape = [p["batch"], p["seq_len"], p["n_head"], p["n_dim"]]
        return {
            "name": case.workload,
            "kind": "matmul",
            "a": shape,
            "b": shape,
            "a_perm": [0, 2, 1, 3],
            "b_perm": [0, 2, 3, 1],
        }
    return None


def _matmul_output(job: dict[str, Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the job computes on the te workload's own operands (for the check)."""
    return np.matmul(
        a.transpose(job["a_perm"]) if job.get("a_perm") else a,
        b.transpose(job["b_perm"]) if job.get("b_perm") else b,
    )


def run_child(
    library: str, jobs: list[dict[str, Any]], threads: int, processes: int, rounds: int, min_repeat_ms: int
) -> dict[str, Any]:
    """:mod:`benches.limits_child` on ``jobs`` in ``processes`` fresh processes: every
    process's rounds per job, and the last process's report (BLAS or PyTorch build)."""
    # BLAS's and OpenMP's pool sizes at start; OPENBLAS_CORETYPE and _L2_SIZE stay as they are
    env = {
        **os.environ,
        **{v: str(threads) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")},
    }
    # the child imports benches.limits_child from this checkout, whatever the caller's directory
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    times: dict[str, list[float]] = {j["name"]: [] for j in jobs}
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="limits_child_") as tmp:
        for p in range(processes):
            spec: dict[str, Any] = {
                "library": library,
                "jobs": jobs,
                "threads": threads,
                "rounds": rounds,
                "min_repeat_ms": min_repeat_ms,
                "out": str(Path(tmp) / f"out{p}.json"),
            }
            run_in_fresh_process(
                "benches.limits_child", spec, Path(tmp) / f"spec{p}.json", env, 1800.0, f"timing {library}"
            )
            result = json.loads(Path(spec["out"]).read_text())
            for name, ts in result.pop("times").items():
                times[name].extend(ts)
    return {"times": times, **result}


def numpy_anchors(
    cases: list[Case], sizes: list[int], threads: int, processes: int, rounds: int, min_repeat_ms: int
) -> dict[str, Any]:
    """numpy's matmul: square sgemms of ``sizes`` (their best GFLOP/s is the BLAS peak) and each
    GMM and TBG case (its anchor, checked on the case's operands); returns the BLAS's report."""
    jobs = [{"name": f"sgemm {n}", "kind": "matmul", "a": [n, n], "b": [n, n]} for n in sizes]
    by_case = {c.workload: j for c in cases if (j := _matmul_job(c)) is not None}
    res = run_child("numpy", jobs + list(by_case.values()), threads, processes, rounds, min_repeat_ms)
    blas = (res.get("blas") or [{}])[0]
    kernel = (
        f"{blas.get('internal_api', 'BLAS')} {blas.get('version', '')} {blas.get('architecture', '')}".strip()
    )
    for case in cases:
        if case.workload in by_case:
            out = _matmul_output(by_case[case.workload], case.args[0], case.args[1])
            anchor = _times(f"numpy matmul ({kernel})", res["times"][case.workload], case.flops)
            case.anchors.append({**anchor, **match_reference(case, out)})
    sgemm = [{**_times(f"sgemm {n}", res["times"][f"sgemm {n}"], 2.0 * n**3), "size": n} for n in sizes]
    return {"kernel": kernel, "blas": res.get("blas"), "numpy": res.get("numpy"), "sgemm": sgemm}


def _torch_job(case: Case) -> dict[str, Any] | None:
    """The case as a PyTorch job (:mod:`benches.limits_child`), or None."""
    job = _matmul_job(case)
    if job is not None:
        return job
    if case.fn_name == "softmax_mn":
        return {"name": case.workload, "kind": "softmax", "x": list(case.args[0].shape)}
    conv = conv_in_onnx_layout(case)
    if conv is None:
        return None
    attrs = conv["attrs"]
    return {
        "name": case.workload,
        "kind": "conv",
        "x": list(conv["x"].shape),
        "w": list(conv["w"].shape),
        "bias": conv["bias"] is not None,
        "stride": attrs["strides"][0],
        "padding": attrs["pads"][0],
        "dilation": attrs["dilations"][0],
        "groups": attrs["group"],
        "bn_relu": conv["scale"] is not None,
    }


def torch_anchors(
    cases: list[Case], threads: int, processes: int, rounds: int, min_repeat_ms: int
) -> str | None:
    """PyTorch CPU's time for every case it has a job for, where ``torch`` imports (it is not
    installed for this; its outputs are not checked: it draws its own values); its version."""
    if importlib.util.find_spec("torch") is None:
        return None
    jobs = [j for c in cases if (j := _torch_job(c)) is not None]
    res = run_child("torch", jobs, threads, processes, rounds, min_repeat_ms)
    for case in cases:
        if case.workload in res["times"]:
            anchor = _times(f"PyTorch {res['torch']}", res["times"][case.workload], case.flops)
            case.anchors.append({**anchor, "max_abs_diff": None, "matches": None})
    return str(res["torch"])


# ------------------------------------------------------------------------------ tuned kernels


def suite_bests(suite_dir: Path, workload: str, func: Any, trials: int | None) -> list[tuple[str, Any]]:
    """(label, record) of each tuner's best within ``trials`` (default: the run's own) in
    every run of ``workload`` a ``benches.suite`` out-dir holds, as the suite picks them."""
    out = []
    for path, run in suite_runs(suite_dir, workload):
        n = trials or int(run["trials"])
        seed = f"seed {run['seed']}"
        fs_dir = fastsearch_dir(run, suite_dir, path.stem)
        if fs_dir is not None:
            best = best_within(records_in_order(fs_dir, func), n, n == int(run["trials"]))
            out += [(f"fastsearch|{seed}", best)] if best else []
        ms_dir = metaschedule_dir(run, suite_dir, path.stem)
        if (ms_dir / "database_tuning_record.json").exists():
            best = best_within(records_in_order(ms_dir, func), n)
            out += [(f"MetaSchedule|{seed}", best)] if best else []
    return out


def time_tuned(
    case: Case,
    records: list[tuple[str, Any]],
    target: tvm.target.Target,
    processes: int,
    rounds: int,
    min_repeat_ms: int,
) -> None:
    """Re-time the records' kernels together in fresh processes; ``case.tuned`` gets, per
    tuner, the median over its kernels (seeds) of their medians over processes."""
    if not records:
        return
    func = load_workload(case.workload).func
    # each tuner's kernel as that tuner builds it
    libs = [
        compile_record(rec, target, TIR_PIPELINE if label.startswith("fastsearch|") else "default")
        for label, rec in records
    ]
    per_process = retime_in_processes(libs, func, rounds, processes, min_repeat_ms)
    by_tuner: dict[str, dict[str, float]] = {}
    for i, (label, _) in enumerate(records):
        tuner, source = label.split("|", 1)
        by_tuner.setdefault(tuner, {})[source] = statistics.median(row[i] for row in per_process)
    for tuner, kernels in by_tuner.items():
        secs = statistics.median(kernels.values())
        case.tuned[tuner] = {
            "seconds": secs,
            "per_kernel_s": kernels,
            "gflops": case.flops / secs / 1e9 if case.flops else None,
        }


# ------------------------------------------------------------------------------ report


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (else what ``platform`` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def best_anchor(case: Case) -> dict[str, Any] | None:
    """The fastest anchor whose output matched the te workload's (or was not checked)."""
    ok = [a for a in case.anchors if a["matches"] is not False]
    return min(ok, key=lambda a: a["seconds"]) if ok else None


def _row(case: Case, peak: float) -> str:
    anchor = best_anchor(case)
    a_us = anchor["seconds"] * 1e6 if anchor else None
    a_gf = anchor["gflops"] if anchor else None
    cells = [
        case.workload,
        _fmt(case.flops / 1e9 if case.flops else None, ".4f"),
        anchor["library"] if anchor else "-",
        _fmt(a_us, ".1f"),
        _fmt(a_gf, ".1f"),
        _fmt(a_gf / peak if a_gf else None, ".3f"),
    ]
    for tuner in ("fastsearch", "MetaSchedule"):
        t = case.tuned.get(tuner)
        us = t["seconds"] * 1e6 if t else None
        gf = t["gflops"] if t else None
        cells += [_fmt(us, ".1f"), _fmt(gf, ".1f"), _fmt(gf / peak if gf else None, ".3f")]
        cells += [_fmt(us / a_us if us and a_us else None, ".3f")]
    return "| " + " | ".join(cells) + " |"


def _header(result: dict[str, Any]) -> list[str]:
    """The report's first lines: CPU, mcpu, threads, BLAS kernel and environment, the peak."""
    peak, fma, blas, host = result["peak"], result["peak"]["fma"], result["peak"]["blas"], result["host"]
    best = next(x for x in fma["variants"] if x["accumulators"] == fma["best"])
    loop = best["hot_loop"]
    env = ", ".join(f"{k}={val!r}" if val is not None else f"{k} unset" for k, val in result["env"].items())
    sgemm = ", ".join(f"{s['library']} {s['gflops']:.1f} GFLOP/s" for s in blas["sgemm"])
    bound = "FMA-bound" if best["fma_bound"] else "NOT FMA-bound"
    blas_threads = ", ".join(str(lib.get("num_threads")) for lib in blas["blas"] or []) or "unknown"
    return [
        f"## Distance to the limit: {host['cpu']}, {result['date']}",
        "",
        (
            f"- CPU: {host['cpu']}, LLVM mcpu `{host['mcpu']}`, {host['physical_cores']} physical "
            f"cores; **{result['threads']} threads** for every timing (TVM_NUM_THREADS, BLAS via "
            "threadpoolctl, onnxruntime intra-op threads with inter-op 1, PyTorch set_num_threads)"
        ),
        f"- BLAS: {blas['kernel']} on {blas_threads} threads, numpy {blas['numpy']}; environment: {env}",
        (
            f"- peak FP32: **{peak['gflops']:.1f} GFLOP/s** ({peak['source']}): FMA micro-kernel "
            f"{fma['gflops']:.1f} GFLOP/s ({best['accumulators']} accumulators x {best['lanes']} "
            f"lanes, {'/'.join(loop['registers'])}; hot loop {loop['fmas']} FMAs of "
            f"{loop['instructions']} instructions, {bound}); {sgemm}"
        ),
        (
            f"- medians over {result['processes']} fresh processes x {result['rounds']} rounds of >= "
            f"{result['min_repeat_ms']} ms; tuned kernels: {result['tuned_from'] or 'none given'}"
            + (f", best within {result['trials']} trials" if result["trials"] else "")
        ),
        f"- command: `{result['command']}`",
        (
            "- anchor: the fastest library kernel whose output matched the te workload's; "
            "/ peak: GFLOP/s over the peak; / anchor: the tuned kernel's time over the anchor's "
            "(below 1: faster than the library); fastsearch and MetaSchedule: the median over "
            "their kernels (seeds)"
        ),
    ]


def report(result: dict[str, Any], cases: list[Case]) -> str:
    """The markdown summary: header (CPU, mcpu, threads, BLAS kernel, peak) and one row per
    workload, then every anchor with its check against the te workload."""
    peak = result["peak"]
    lines = _header(result)
    if result.get("warning"):
        lines += ["", result["warning"]]
    head = "| workload | GFLOP | anchor | anchor us | anchor GFLOP/s | anchor / peak |"
    for tuner in ("fastsearch", "MetaSchedule"):
        head += f" {tuner} us | GFLOP/s | / peak | / anchor |"
    lines += ["", head, "|---|---:|---|---:|---:|---:|" + "---:|" * 8]
    lines += [_row(c, peak["gflops"]) for c in cases]
    lines += [
        "",
        "| workload | library | median us | fastest us | GFLOP/s | max abs diff to te |",
        "|---|---|---:|---:|---:|---|",
    ]
    for c in cases:
        for a in c.anchors:
            check = (
                "not checked"
                if a["matches"] is None
                else f"{a['max_abs_diff']:.1e}" + ("" if a["matches"] else " MISMATCH")
            )
            lines.append(
                f"| {c.workload} | {a['library']} | {a['seconds'] * 1e6:.1f} | {a['fastest_s'] * 1e6:.1f} | "
                f"{_fmt(a['gflops'], '.1f')} | {check} |"
            )
    return "\n".join(lines) + "\n"


def _case_json(case: Case, peak: float) -> dict[str, Any]:
    anchor = best_anchor(case)
    return {
        "workload": case.workload,
        "te_function": case.fn_name,
        "params": case.params,
        "flops": case.flops,
        "anchors": case.anchors,
        "anchor": anchor["library"] if anchor else None,
        "anchor_fraction_of_peak": anchor["gflops"] / peak if anchor and anchor["gflops"] else None,
        "tuned": {
            k: {**v, "fraction_of_peak": v["gflops"] / peak if v["gflops"] else None}
            for k, v in case.tuned.items()
        },
    }


# ------------------------------------------------------------------------------ main


def _busy(loads: list[float]) -> str | None:
    """A warning for the report when other work kept the CPUs busy before or after timing."""
    busy = max((x for x in loads if not math.isnan(x)), default=0.0)
    if busy <= BUSY_THRESHOLD:
        return None
    return (
        f"**Warning: {busy:.0%} of the CPUs were busy with other work before or after timing: "
        "these are not the machine's limits. Run again on a quiet machine.**"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("The harness never sets") :],  # the final command
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workloads", nargs="+", default=WORKLOADS, help="te_workload ids (default: the suite's and GMM:3)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="threads for every timing (default: physical cores)"
    )
    parser.add_argument("--out-dir", required=True, help="where limits.json and limits.md go")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per timing")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per process")
    parser.add_argument("--min-repeat-ms", type=int, default=200, help="least time per round")
    parser.add_argument(
        "--blas-sizes", nargs="+", type=int, default=[1024, 2048], help="square sgemms for the BLAS peak"
    )
    parser.add_argument("--suite-dir", default=None, help="a benches.suite out-dir: re-time its runs' bests")
    parser.add_argument(
        "--trials", type=int, default=None, help="with --suite-dir: the bests within this many trials"
    )
    parser.add_argument(
        "--work-dir", nargs="+", default=[], metavar="WORKLOAD=DIR", help="a fastsearch tune work dir's best"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the random inputs the anchors are checked on"
    )
    return parser.parse_args(argv)


def _tuned_records(args: argparse.Namespace, case: Case) -> list[tuple[str, Any]]:
    func = load_workload(case.workload).func
    records = suite_bests(Path(args.suite_dir), case.workload, func, args.trials) if args.suite_dir else []
    for item in args.work_dir:
        workload, _, path = item.partition("=")
        if workload == case.workload:
            recs = records_in_order(Path(path), func)
            best = best_within(recs, len(recs))
            records += [(f"fastsearch|{path}", best)] if best else []
    return records


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = args.threads or physical_cores()
    # Every TVM process this harness starts (kernel re-timing) runs on these threads.
    os.environ["TVM_NUM_THREADS"] = str(threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    load_before = other_cpu_load()
    target = resolve_target(None)
    timing = (args.processes, args.rounds, args.min_repeat_ms)
    print(f"FMA micro-kernel on {threads} threads ...", file=sys.stderr, flush=True)
    fma = fma_peak(target, threads, *timing)
    cases = []
    for w in args.workloads:
        wl = load_workload(w)
        cases.append(make_case(w, wl.family, tuple(wl.shape), args.seed))
    print("numpy ...", file=sys.stderr, flush=True)
    blas = numpy_anchors(cases, args.blas_sizes, threads, *timing)
    for case in cases:
        print(f"{case.workload}: onnxruntime ...", file=sys.stderr, flush=True)
        onnx_anchors(case, threads, *timing)
    torch_version = torch_anchors(cases, threads, *timing)
    for case in cases:
        records = _tuned_records(args, case)
        if records:
            print(f"{case.workload}: re-timing {len(records)} tuned kernels ...", file=sys.stderr, flush=True)
        time_tuned(case, records, target, *timing)
    loads = [load_before, other_cpu_load()]
    blas_best = max(s["gflops"] for s in blas["sgemm"])
    peak = max(fma["gflops"], blas_best)
    result: dict[str, Any] = {
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "command": " ".join(["python -m benches.limits", *(argv if argv is not None else sys.argv[1:])]),
        "host": {
            "cpu": cpu_model(),
            "mcpu": str(target.attrs.get("mcpu")),
            "physical_cores": physical_cores(),
            "target": str(target),
        },
        "threads": threads,
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
        "processes": args.processes,
        "rounds": args.rounds,
        "min_repeat_ms": args.min_repeat_ms,
        "tvm": tvm.__version__,
        "torch": torch_version,
        "tuned_from": args.suite_dir or (" ".join(args.work_dir) or None),
        "trials": args.trials,
        "other_cpu_load": loads,
        "warning": _busy(loads),
        "peak": {
            "gflops": peak,
            "source": "FMA micro-kernel" if fma["gflops"] >= blas_best else "sgemm",
            "fma": fma,
            "blas": blas,
        },
    }
    result["workloads"] = [_case_json(c, peak) for c in cases]
    (out_dir / "limits.json").write_text(json.dumps(result, indent=1))
    text = report(result, cases)
    (out_dir / "limits.md").write_text(text)
    print(text)
    mismatched = [f"{c.workload}: {a['library']}" for c in cases for a in c.anchors if a["matches"] is False]
    if mismatched:
        print("anchors that do not compute the te workload: " + "; ".join(mismatched), file=sys.stderr)
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
