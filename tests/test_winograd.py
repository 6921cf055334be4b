"""Winograd F(m x m, 3 x 3) for blocked 3x3 convolutions: the matrices, the rewrite's outputs
against the direct convolution, and the tasks it leaves for the tuner."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from fastsearch.graph import winograd
from fastsearch.graph.inference import InferenceReport, optimize_for_inference, pipeline_steps
from fastsearch.graph.layout import block_channels
from fastsearch.graph.relax_tasks import extract_tasks
from fastsearch.graph.winograd import transform_matrices, winograd_convolutions
from fastsearch.testing import onnx_zoo
from fastsearch.tuning.tune import tune
from relax_run import TARGET
from relax_run import close as _close
from relax_run import run as _run
from tvm import relax
from tvm.relax import op as R


@pytest.mark.parametrize("m", [2, 3, 4, 6])
def test_matrices_compute_the_correlation(m: int) -> None:
    at, g, bt = transform_matrices(m)
    a = m + 2
    assert at.shape == (m, a) and g.shape == (a, 3) and bt.shape == (a, a)
    rng = np.random.default_rng(m)
    for _ in range(5):
        d, k = rng.standard_normal(a), rng.standard_normal(3)
        want = np.array([d[i : i + 3] @ k for i in range(m)])
        np.testing.assert_allclose(at @ ((g @ k) * (bt @ d)), want, rtol=1e-12, atol=1e-12)


def test_f2_and_f4_are_the_published_matrices() -> None:
    # Lavin and Gray's F(2x2, 3x3) and F(4x4, 3x3), up to the sign of a row of B^T.
    _, _, bt2 = transform_matrices(2)
    assert np.array_equal(np.abs(bt2), np.abs([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]))
    _, g4, bt4 = transform_matrices(4)
    assert np.array_equal(bt4[0], [4, 0, -5, 0, 1, 0]) and np.array_equal(bt4[5], [0, 4, 0, -5, 0, 1])
    np.testing.assert_allclose(g4[0], [1 / 4, 0, 0])


def _conv_model(cin: int, cout: int, h: int, w: int, seed: int = 0) -> tuple[tvm.IRModule, np.ndarray]:
    """conv 3x3 pad 1 + bias + ReLU, then a residual conv 3x3 whose output adds the first's."""
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((1, cin, h, w), "float32"))
    bb = relax.BlockBuilder()

    def const(*shape: int) -> relax.Expr:
        return relax.const(rng.standard_normal(shape).astype("float32"))

    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                R.nn.relu(R.add(R.nn.conv2d(x, const(cout, cin, 3, 3), padding=1), const(1, cout, 1, 1)))
            )
            z = bb.emit(R.add(R.nn.conv2d(y, const(cout, cout, 3, 3), padding=1), y))
            out = bb.emit_output(R.nn.relu(z))
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, cin, h, w)).astype("float32")


@pytest.mark.parametrize(
    ("cin", "cout", "h", "w", "block"), [(16, 32, 13, 11, 16), (8, 16, 8, 8, 8), (24, 16, 9, 14, 16)]
)
def test_rewritten_convolutions_compute_the_direct_ones(
    cin: int, cout: int, h: int, w: int, block: int
) -> None:
    # Odd sizes (tiles that overhang the image), blocks that differ between input and output.
    mod, x = _conv_model(cin, cout, h, w)
    want = _run(mod, [x])
    blocked, converted = block_channels(mod, block)
    assert converted == 2
    rewritten, count = winograd_convolutions(blocked, min_pixels=1)
    assert count == 2
    _close(_run(rewritten, [x]), want)
    for m in (2, 6):
        other, _ = winograd_convolutions(blocked, m=m, min_pixels=1)
        _close(_run(other, [x]), want)


def test_small_images_and_other_convolutions_stay_direct() -> None:
    mod, _ = _conv_model(16, 16, 8, 8)
    blocked, _ = block_channels(mod, 16)
    same, count = winograd_convolutions(blocked)  # 64 pixels, under the default minimum
    assert count == 0 and same is blocked
    # NCHW convolutions (no blocking) are not rewritten.
    _, count = winograd_convolutions(mod, min_pixels=1)
    assert count == 0


def test_resnet_runs_its_3x3_convolutions_as_winograd(monkeypatch) -> None:
    """Through the pipeline: outputs equal the reference, the epilogue (bias, residual add,
    ReLU) fuses into the output transform, and every task is one fastsearch reads."""
    monkeypatch.setattr(winograd, "MIN_WINOGRAD_PIXELS", 1)
    model = onnx_zoo.build("resnet-18-small")
    feeds = onnx_zoo.model_input(model)
    ref = onnx_zoo.reference_outputs(model, feeds)[0]
    report = InferenceReport()
    mod = optimize_for_inference(onnx_zoo.load(model), report=report, layout="NCHWc")
    # Every 3x3 stride-1 convolution: 4 stages x 2 blocks x 2, minus the 3 stride-2 ones.
    assert report.winograd_convs == 13 and "winograd" in report.steps
    _close(_run(mod, list(feeds.values())), ref)
    fused, tasks = extract_tasks(mod)
    _close(_run(fused, list(feeds.values())), ref)
    names = [t.name for t in tasks]
    assert not [(t.name, t.skip) for t in tasks if t.skip and t.skip.startswith("unsupported")]
    outputs = [n for n in names if "winograd_output" in n]
    assert outputs and all("relu" in n and "_add" in n for n in outputs), names
    assert sum(1 for n in outputs if n.count("_add") == 2) == 4, names  # the residual blocks'
    assert not [n for n in names if n.startswith(("relu", "add", "fused_add"))], names


def test_the_default_rewrites_only_large_images() -> None:
    model = onnx_zoo.build("resnet-18-small")  # 32x32 input: stage 1 runs at 8x8
    report = InferenceReport()
    optimize_for_inference(onnx_zoo.load(model), report=report, layout="NCHWc")
    assert report.winograd_convs == 0


def test_the_direct_pipeline_keeps_every_convolution_direct() -> None:
    mod, x = _conv_model(16, 16, 14, 14)  # 196 output pixels: rewritten by default
    want = _run(mod, [x])
    for pipeline, expected in (("inference", 2), ("inference-direct", 0)):
        report = InferenceReport()
        out = optimize_for_inference(mod, steps=pipeline_steps(pipeline), report=report, layout="NCHW16c")
        assert report.winograd_convs == expected and report.blocked_convs == 2, pipeline
        _close(_run(out, [x]), want)
    assert pipeline_steps("none") == ()


@pytest.mark.tuning
def test_a_tuned_winograd_model_matches_the_direct_one(tmp_path, monkeypatch) -> None:
    """Tuned Winograd kernels, with their transformed weights prepacked into the layouts the
    tuned schedules chose, compute what the untuned direct model computes."""
    monkeypatch.setattr(winograd, "MIN_WINOGRAD_PIXELS", 1)
    mod, x = _conv_model(16, 32, 13, 11)
    want = _run(mod, [x])
    result = tune(mod, TARGET, trials=24, batch_size=8, work_dir=tmp_path, progress=False, layout="NCHWc")
    names = [name for name, t in result.tasks.items() if t.best_latency_us is not None]
    assert any("winograd_product" in n for n in names) and any("winograd_input" in n for n in names), names
    out = relax.VirtualMachine(result.compile(), tvm.cpu())["main"](tvm.runtime.tensor(x))
    while not hasattr(out, "numpy"):
        out = out[0]
    _close(out.numpy(), want)


def test_transform_matrices_are_not_layout_free(monkeypatch) -> None:
    """``B^T`` and ``A^T`` are constants that two blocks read: relaid out for one of them, the
    prepacked matrix would be read wrongly by the other (such candidates failed verification
    in a ResNet-50 run). The transformed weights, which one block reads, stay layout-free."""
    monkeypatch.setattr(winograd, "MIN_WINOGRAD_PIXELS", 1)
    mod, _ = _conv_model(16, 16, 8, 8)
    fused, _ = extract_tasks(optimize_for_inference(mod, layout="NCHW16c"))
    free = {
        gvar.name_hint: [int(i) for i in (func.attrs or {}).get("layout_free_buffers", [])]
        for gvar, func in fused.functions_items()
        if isinstance(func, tvm.tirx.PrimFunc)
    }
    assert free["winograd_input"] == [], free  # (data, B^T)
    assert free["winograd_product"] == [1], free  # (V, U)
    outputs = {k: v for k, v in free.items() if "winograd_output" in k}  # (M, A^T, bias, ...)
    assert outputs and all(1 not in v for v in outputs.values()), free
    assert any(2 in v for v in outputs.values()), free  # the bias, which one block reads
