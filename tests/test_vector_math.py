"""The vector ``exp`` of fastsearch's TIR pipeline (``fastsearch.ir.vector_math``): within 2 ulp
of the correctly rounded ``e^x`` over the whole float32 range (subnormal results, overflow,
infinities and NaN included), the libm calls it removes, and a tuned softmax built both ways
giving the same answer."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import tvm
from fastsearch.ir.target import host_cpu
from fastsearch.ir.vector_math import MIN_LANES, TIR_PIPELINE, vector_exp_pass
from tvm.script import tirx as T

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 1})
N = 1 << 16


def _exp_kernel(lanes: int):
    @T.prim_func
    def exp_kernel(a: T.Buffer((N,), "float32"), b: T.Buffer((N,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i0 in range(N // lanes):
            for i1 in T.vectorized(lanes):
                b[i0 * lanes + i1] = T.exp(a[i0 * lanes + i1])

    return tvm.IRModule({"main": exp_kernel})


def _run(lib, x: np.ndarray) -> np.ndarray:
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros_like(x), dev)
    lib["main"](tvm.runtime.tensor(x, dev), out)
    return out.numpy()


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    special = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 88.72283, 88.7229, 89.0, 1e4, -87.33654,
         -87.4, -100.0, -103.97, -103.98, -104.0, -104.5, -1e4, 0.34657359, -0.34657359, 1.0],
        dtype=np.float32,
    )  # fmt: skip
    dense = np.linspace(-105.0, 90.0, N - special.size - 4096, dtype=np.float32)
    wide = rng.uniform(-1.0, 1.0, 4096).astype(np.float32) * np.float32(20.0)
    return np.concatenate([special, dense, wide])


def _ulp_error(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    both_nan = np.isnan(got) & np.isnan(want)
    # positive floats order like their bit patterns: the ulp distance is the difference of the bits
    diff = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    return np.where(both_nan, 0, diff)


@pytest.mark.parametrize("lanes", [4, 8, 16, 64])
def test_vector_exp_is_within_two_ulp_everywhere(lanes):
    x = _inputs()
    lib = tvm.compile(_exp_kernel(lanes), target=TARGET, tir_pipeline=TIR_PIPELINE)
    got = _run(lib, x)
    err = _ulp_error(got, x)
    worst = int(np.argmax(err))
    assert err.max() <= 2, f"{err.max()} ulp at x={x[worst]!r}: {got[worst]!r}"
    assert np.isnan(got[np.isnan(x)]).all()
    assert got[x == np.inf][0] == np.inf and got[x == -np.inf][0] == 0.0
    assert got[x == np.float32(89.0)][0] == np.inf  # overflow, as libm
    assert 0.0 < got[x == np.float32(-100.0)][0] < np.finfo(np.float32).tiny  # subnormal result


def test_the_pipeline_removes_libm_calls_only_from_vectors(tmp_path):
    def undefined(pipeline: str, lanes: int) -> list[str]:
        path = tmp_path / f"{pipeline}_{lanes}.so"
        tvm.compile(_exp_kernel(lanes), target=TARGET, tir_pipeline=pipeline).export_library(str(path))
        out = subprocess.run(
            ["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True, check=True
        )
        return [line.split()[-1] for line in out.stdout.splitlines() if "exp" in line]

    assert any(s.startswith("expf") for s in undefined("default", 16))
    assert undefined(TIR_PIPELINE, 16) == []
    # two lanes stay with libm: below MIN_LANES
    assert MIN_LANES > 2 and any(s.startswith("expf") for s in undefined(TIR_PIPELINE, 2))


def test_scalar_and_float64_exp_are_left_alone():
    @T.prim_func
    def f(a: T.Buffer((8,), "float64"), b: T.Buffer((8,), "float32"), c: T.Buffer((8,), "float32")):
        for i in T.vectorized(8):
            a[i] = T.exp(a[i])
        for i in range(8):
            b[i] = T.exp(c[i])

    mod = tvm.IRModule({"main": f})
    with tvm.target.Target(TARGET):
        lowered = tvm.tirx.transform.VectorizeLoop()(mod)
    assert vector_exp_pass(lowered)["main"].same_as(lowered["main"])


def test_softmax_built_with_and_without_vector_exp_agree():
    from tvm import te, topi

    a = te.placeholder((37, 200), name="A")
    func = te.create_prim_func([a, topi.nn.softmax(a, axis=1)])
    sch = tvm.s_tir.Schedule(func)
    # vectorize the exponentials: the innermost loop of the exp block, split by 16
    blk = sch.get_sblock("T_softmax_exp")
    _, j = sch.get_loops(blk)
    sch.vectorize(sch.split(j, [None, 16])[1])
    x = np.random.default_rng(1).normal(0, 4, (37, 200)).astype(np.float32)
    outs = []
    for pipeline in ("default", TIR_PIPELINE):
        lib = tvm.compile(sch.mod, target=TARGET, tir_pipeline=pipeline)
        dev = tvm.cpu()
        out = tvm.runtime.tensor(np.zeros_like(x), dev)
        lib["main"](tvm.runtime.tensor(x, dev), out)
        outs.append(out.numpy())
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(outs[1], want, rtol=2e-6, atol=1e-12)
    np.testing.assert_allclose(outs[1], outs[0], rtol=2e-6, atol=1e-12)


def test_the_builders_lowering(tmp_path):
    """The measuring builders: fastsearch's with the vector ``exp``, the one benchmarks tune
    MetaSchedule with on TVM's default lowering (libm)."""
    from fastsearch.measure.measurer import build_module, build_module_tvm_lowering

    def undefined(build) -> list[str]:
        path = tmp_path / f"{build.__name__}.so"
        build(_exp_kernel(16), TARGET).export_library(str(path))
        out = subprocess.run(
            ["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True, check=True
        )
        return [line.split()[-1] for line in out.stdout.splitlines() if "exp" in line]

    assert undefined(build_module) == []
    assert any(s.startswith("expf") for s in undefined(build_module_tvm_lowering))


@pytest.mark.parametrize("op", ["sigmoid", "tanh"])
def test_sigmoid_and_tanh_use_the_vector_exp(op, tmp_path):
    @T.prim_func
    def kernel(a: T.Buffer((N,), "float32"), b: T.Buffer((N,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i0 in range(N // 16):
            for i1 in T.vectorized(16):
                b[i0 * 16 + i1] = T.sigmoid(a[i0 * 16 + i1]) if op == "sigmoid" else T.tanh(a[i0 * 16 + i1])

    x = np.concatenate(
        [
            np.linspace(-100.0, 100.0, N - 8, dtype=np.float32),
            np.float32([0, -0.0, 1e-6, -1e-6, np.inf, -np.inf, 30, -30]),
        ]
    )
    path = tmp_path / "k.so"
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=TARGET, tir_pipeline=TIR_PIPELINE)
    lib.export_library(str(path))
    out = subprocess.run(
        ["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True, check=True
    )
    assert "expf" not in out.stdout
    got = _run(lib, x)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        want = 1.0 / (1.0 + np.exp(-x64)) if op == "sigmoid" else np.tanh(x64)
    # TVM's default lowering of the same kernel: the vector forms follow its formulas
    default = _run(tvm.compile(tvm.IRModule({"main": kernel}), target=TARGET), x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-7)
    np.testing.assert_allclose(got, default, rtol=1e-6, atol=2e-7)
