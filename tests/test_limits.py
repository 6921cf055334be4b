"""benches.limits: FLOP counts, the ONNX graphs that anchor the convolutions (they compute the
te workload, checked on small shapes), the FMA micro-kernel's hot loop, and a tiny run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from fastsearch.cli.main import load_workload, workload_flops
from fastsearch.ir.target import resolve_target

from benches import limits


def test_flop_counts_are_twice_the_multiply_adds():
    assert limits.flop_count("GMM:2") == 2 * 512**3
    assert limits.flop_count("C2D:1") == 2 * 56 * 56 * 64 * 64  # 1x1, stride 1
    assert limits.flop_count("C2D:3") == 2 * 7 * 7 * 512 * 512 * 9
    assert limits.flop_count("DEP:1") == 2 * 56 * 56 * 64 * 9  # stride 2
    assert limits.flop_count("C1D:2") == 2 * 64 * 256 * 256 * 5
    assert limits.flop_count("TBG:0") == 2 * 12 * 128 * 128 * 64
    assert limits.flop_count("SFM:0") is None
    # TVM's own count agrees; for CBR it adds the epilogue's 4 operations per output
    for w in ("GMM:2", "C2D:1", "C2D:3", "DEP:1", "C1D:2", "TBG:0", "GRP:0", "DIL:1"):
        assert limits.flop_count(w) == workload_flops(load_workload(w).func), w
    assert limits.flop_count("CBR:1") == workload_flops(load_workload("CBR:1").func) - 4 * 28 * 28 * 128


def test_rate_converts_a_time_into_gflops_and_fraction_of_peak(tmp_path):
    gflops, fraction = limits.rate("GMM:2", 1e-3, 2 * 268.435456)
    assert gflops == pytest.approx(268.435456)
    assert fraction == pytest.approx(0.5)
    (tmp_path / "limits.json").write_text(json.dumps({"peak": {"gflops": 268.435456}}))
    assert limits.rate("GMM:2", 1e-3, tmp_path / "limits.json")[1] == pytest.approx(1.0)
    assert limits.rate("SFM:0", 1e-3, 100.0) == (None, None)


#: Small shapes of every family with an ONNX anchor: strides, padding, groups and dilation.
SMALL = [
    ("C1D", (1, 13, 8, 12, 3, 2, 1)),
    ("C2D", (1, 9, 9, 8, 12, 3, 2, 1)),
    ("GRP", (1, 9, 9, 8, 12, 3, 1, 1, 1, 4)),
    ("DIL", (1, 11, 11, 4, 8, 3, 1, 2, 2)),
    ("C3D", (1, 5, 6, 6, 4, 8, 3, 2, 1)),
    ("DEP", (1, 9, 9, 8, 3, 2, 1)),
    ("CBR", (1, 9, 9, 8, 12, 3, 2, 1)),
    ("SFM", (8, 20)),
]


@pytest.mark.parametrize("family,shape", SMALL, ids=[f for f, _ in SMALL])
def test_the_onnx_graph_computes_the_te_workload(family, shape):
    ort = pytest.importorskip("onnxruntime")
    case = limits.make_case(f"{family}{shape}", family, shape, seed=1)
    built = limits.onnx_graph(case)
    assert built is not None
    model, feeds, first = built
    for level in ("ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        (out,) = sess.run(None, {"x": feeds[0]})
        check = limits.match_reference(case, limits.channels_last(out) if first else out)
        assert check["matches"], (level, check)
    # a different conv does not match: the check can fail
    wrong = np.roll(case.reference, 1, axis=-1)
    assert not limits.match_reference(case, wrong)["matches"]


def test_the_fma_kernel_is_fma_bound_on_this_cpu():
    target = resolve_target(None)
    lanes = limits.vector_bytes(target) // 4
    lib = tvm.compile(tvm.IRModule({"main": limits.fma_kernel(2, 8, lanes, 100, 8)}), target=target)
    loop = limits.hot_loop(lib.mod.inspect_source("asm"))
    assert loop["fmas"] >= 8
    assert loop["fma_share"] >= 0.75
    assert not loop["fma_reads_memory"]


def test_help():
    out = subprocess.run(
        [sys.executable, "-m", "benches.limits", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert "--suite-dir" in out.stdout and "OPENBLAS_CORETYPE" in out.stdout


@pytest.mark.tuning
def test_a_tiny_run_writes_the_table(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("TVM_NUM_THREADS", "1")  # restored after the run, which sets it
    argv = ["--workloads", "GMM:0", "DEP:3", "--processes", "1", "--rounds", "1", "--min-repeat-ms", "5"]
    argv += ["--blas-sizes", "128", "--out-dir", str(tmp_path)]
    assert limits.main(argv) == 0
    result = json.loads((tmp_path / "limits.json").read_text())
    assert result["peak"]["gflops"] > 0
    assert result["threads"] == limits.physical_cores()
    anchors = {w["workload"]: w["anchors"] for w in result["workloads"]}
    assert [a["library"].split()[0] for a in anchors["GMM:0"]] == ["numpy"]
    assert all(a["matches"] for w in anchors.values() for a in w)
    assert len(anchors["DEP:3"]) == 2  # onnxruntime at both levels
    text = (tmp_path / "limits.md").read_text()
    assert "| GMM:0 |" in text and "threads" in text and "peak FP32" in text
