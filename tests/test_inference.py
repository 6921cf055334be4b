"""The inference pipeline before partitioning, on the ONNX model zoo: every rewrite keeps the
outputs of ONNX's reference evaluator, batch norm is folded away, and conv + BN + Clip (+ Add)
end up in one fused kernel."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from fastsearch import MalformedInput
from fastsearch.graph.inference import (
    STEPS,
    InferenceReport,
    fold_scale_shift,
    optimize_for_inference,
    pipeline_steps,
)
from fastsearch.graph.model_timing import hollow_kernels, profile_model
from fastsearch.graph.relax_tasks import extract_tasks
from fastsearch.tuning.scheduler import GradientScheduler, TaskState, floor_rounds
from test_cli import run as run_cli
from tvm import relax
from tvm.relax import op as R
from tvm_ffi import structural_equal

onnx = pytest.importorskip("onnx", reason="the model zoo is written with the `onnx` package")
from fastsearch.testing import onnx_zoo

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def _run(mod: tvm.IRModule, feeds: dict[str, np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in feeds.values()])
    while not hasattr(out, "numpy"):
        out = out[0]
    return out.numpy()


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def _prims(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


@pytest.fixture(scope="module", params=sorted(onnx_zoo.SMALL))
def zoo_model(request):
    model = onnx_zoo.build(request.param)
    feeds = onnx_zoo.model_input(model)
    return request.param, model, feeds, onnx_zoo.reference_outputs(model, feeds)[0]


def _first_wrong_step(mod: tvm.IRModule, feeds: dict[str, np.ndarray], ref: np.ndarray) -> str:
    """The first step after which the pipeline, cut there, no longer computes ``ref``."""
    for last in range(1, len(STEPS) + 1):
        try:
            _close(_run(optimize_for_inference(mod, STEPS[:last]), feeds), ref)
        except AssertionError:
            return STEPS[last - 1]
    return "none (every prefix computes the reference)"


@pytest.mark.tuning
def test_each_step_keeps_the_reference_outputs(zoo_model) -> None:
    """The imported model, the pipelines ``tune`` offers (every step, and every step but
    Winograd) and the model fused by fastsearch's partitioner all compute what ONNX's reference
    evaluator computes. A step that breaks the outputs breaks the whole pipeline's; only then is
    the pipeline cut after each step in turn, to name the step (compiling every prefix of every
    model took half of this file's time)."""
    name, model, feeds, ref = zoo_model
    mod = onnx_zoo.load(model)
    _close(_run(mod, feeds), ref)
    for pipeline in ("inference", "inference-direct"):
        try:
            _close(_run(optimize_for_inference(mod, pipeline_steps(pipeline)), feeds), ref)
        except AssertionError as e:
            raise AssertionError(
                f"{name}, {pipeline}: first wrong step: {_first_wrong_step(mod, feeds, ref)}"
            ) from e
    fused, tasks = extract_tasks(optimize_for_inference(mod))
    _close(_run(fused, feeds), ref)
    assert tasks, name


@pytest.mark.tuning
def test_batch_norm_is_folded_into_the_convolutions(zoo_model) -> None:
    name, model, _, _ = zoo_model
    report = InferenceReport()
    fused, _ = extract_tasks(optimize_for_inference(onnx_zoo.load(model), report=report))
    scripts = {n: f.script() for n, f in _prims(fused).items()}
    # No statistics left to combine at run time: no sqrt (but layer norm's, over the data it
    # normalizes), no batch_norm kernel.
    assert not [n for n, s in scripts.items() if "sqrt" in s and "layer_norm" not in n], name
    assert not [n for n in scripts if "batch_norm" in n], name
    bn_nodes = sum(1 for n in model.graph.node if n.op_type == "BatchNormalization")
    if bn_nodes:  # four per-channel operations each, folded into the conv's weight and bias
        assert report.folded_anchors >= bn_nodes and report.folded_ops >= 4 * bn_nodes


def test_every_task_is_one_fastsearch_reads(zoo_model) -> None:
    """No kernel of a zoo model is left untuned because its TIR is outside the program model
    (fast_exp's bit tricks once made every SiLU convolution of EfficientNet-B0 such a task,
    and the model ran 19x onnxruntime)."""
    name, model, _, _ = zoo_model
    for layout in ("NCHW", "NCHWc"):
        _, tasks = extract_tasks(optimize_for_inference(onnx_zoo.load(model), layout=layout))
        assert not [(t.name, t.skip) for t in tasks if t.skip and t.skip.startswith("unsupported")], name


def test_conv_bn_clip_and_the_residual_add_are_one_kernel() -> None:
    model = onnx_zoo.build("mobilenet-v2-small")
    _, tasks = extract_tasks(optimize_for_inference(onnx_zoo.load(model)))
    names = [t.name for t in tasks if t.skip is None]
    convs = [n for n in names if "conv2d" in n]
    # Every conv is fused with its epilogue: bias, then ReLU6 (max, min) or the residual add.
    assert len(convs) == 10, names
    assert all("_add" in n for n in convs), names
    assert sum(1 for n in convs if "maximum" in n and "minimum" in n) == 7, names
    # The projecting 1x1 conv of the residual block takes the residual add: two adds.
    assert any(n.count("_add") == 2 for n in convs), names
    assert not [n for n in names if n.startswith(("fused_tir_isnan", "fused_add", "add", "maximum"))], names


def test_gelu_runs_as_arithmetic_in_the_matmul_epilogue() -> None:
    """ONNX's erf GELU becomes fast_erf, fused into the producing matmul's kernel: no kernel
    calls libm's scalar, value-dependent erf, and the outputs keep the reference's."""
    model = onnx_zoo.build("bert-layer-small")
    feeds = onnx_zoo.model_input(model)
    report = InferenceReport()
    fused, tasks = extract_tasks(optimize_for_inference(onnx_zoo.load(model), report=report))
    assert report.fast_math_ops == 1 and "fast-math" in report.steps
    gelu = [t.name for t in tasks if "erf" in t.name]
    assert len(gelu) == 1 and gelu[0].startswith("fused_matmul") and "fast_erf" in gelu[0], gelu
    assert not [n for n, f in _prims(fused).items() if "T.erf(" in f.script()]
    _close(_run(fused, feeds), onnx_zoo.reference_outputs(model, feeds)[0])
    # Without the step, the erf stays: the test above is about the step.
    _, plain = extract_tasks(
        optimize_for_inference(onnx_zoo.load(model), [s for s in STEPS if s != "fast-math"])
    )
    assert [t.name for t in plain if "_erf" in t.name and "fast_erf" not in t.name]


def test_the_default_pipeline_has_fewer_kernels_than_the_imported_model() -> None:
    mod = onnx_zoo.load(onnx_zoo.build("resnet-18-small"))
    _, plain = extract_tasks(mod)
    _, optimized = extract_tasks(optimize_for_inference(mod))
    assert len(optimized) < len(plain)


# -- fold_scale_shift on hand-written graphs -----------------------------------------------------


def _conv_chain(body) -> tvm.IRModule:
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 3, 6, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((4, 3, 3, 3)).astype("float32"))
            y = bb.emit(R.nn.conv2d(x, w, padding=1))
            out = bb.emit_output(body(bb, y, rng))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod: tvm.IRModule) -> list[str]:
    found = []

    def visit(node: object) -> None:
        if isinstance(node, relax.Call) and isinstance(node.op, tvm.ir.Op):
            found.append(node.op.name)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def _same(mod: tvm.IRModule, folded: tvm.IRModule) -> None:
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype("float32")
    _close(_run(folded, {"x": x}), _run(mod, {"x": x}))


def test_scale_and_shift_fold_into_one_conv_and_one_add() -> None:
    def body(bb, y, rng):
        c = lambda: relax.const(rng.uniform(0.5, 1.5, (1, 4, 1, 1)).astype("float32"))
        y = bb.emit(R.subtract(y, c()))
        y = bb.emit(R.divide(y, c()))
        y = bb.emit(R.multiply(c(), y))  # the constant first
        return bb.emit(R.add(y, relax.const(np.float32(0.5))))  # a scalar broadcasts to every channel

    mod = _conv_chain(body)
    folded = fold_scale_shift(mod)
    assert sorted(_ops(folded)) == ["relax.add", "relax.nn.conv2d"]
    _same(mod, folded)


def test_scalar_bounds_are_not_weights() -> None:
    # Clip's bounds are PrimValues, which TVM 0.27 also calls constants: a chain whose next call
    # takes one as its second argument (HardSigmoid's clip) ends there and nothing crashes.
    def body(bb, y, rng):
        y = bb.emit(R.add(R.multiply(y, relax.const(np.float32(1 / 6))), relax.const(np.float32(0.5))))
        return bb.emit(R.clip(y, 0, 1))

    mod = _conv_chain(body)
    folded = fold_scale_shift(mod)
    assert sorted(_ops(folded)) == ["relax.add", "relax.clip", "relax.nn.conv2d"]
    _same(mod, folded)
    _same(mod, optimize_for_inference(mod, layout="NCHW4c"))


def test_a_shared_intermediate_ends_the_chain() -> None:
    def body(bb, y, rng):
        scaled = bb.emit(R.multiply(y, relax.const(rng.uniform(0.5, 1.5, (1, 4, 1, 1)).astype("float32"))))
        return bb.emit(R.add(scaled, y))  # y read twice: folding would compute the conv twice

    mod = _conv_chain(body)
    folded = fold_scale_shift(mod)
    assert _ops(folded).count("relax.nn.conv2d") == 1
    assert "relax.multiply" in _ops(folded)
    _same(mod, folded)


def test_a_constant_that_varies_over_pixels_is_not_folded() -> None:
    def body(bb, y, rng):
        return bb.emit(R.multiply(y, relax.const(rng.uniform(0.5, 1.5, (1, 4, 6, 6)).astype("float32"))))

    mod = _conv_chain(body)
    assert "relax.multiply" in _ops(fold_scale_shift(mod))


def test_unknown_steps_are_rejected() -> None:
    with pytest.raises(MalformedInput, match="fold-everything"):
        optimize_for_inference(_conv_chain(lambda bb, y, rng: y), ["fold-everything"])


# -- trials across tasks ---------------------------------------------------------------------------


def test_tasks_with_meaningful_flops_get_a_floor() -> None:
    floors = floor_rounds([1e9, 5e8, 1e6, None], trials=300, batch_sizes=[8, 8, 8, 8])
    # 1e6 is under 1% of the model: nothing beyond the warm-up; unknown FLOPs count.
    assert floors == [4, 4, 0, 4]  # min(32, 300 // 6) = 32 trials = 4 batches of 8
    assert floor_rounds([1.0, 1.0], trials=8, batch_sizes=[4, 4]) == [1, 1]


def test_gradient_scheduler_serves_floors_before_the_rule() -> None:
    tasks = [TaskState(weight=1.0, floor=3), TaskState(weight=1.0, floor=3), TaskState(weight=100.0)]
    sched = GradientScheduler(tasks)
    picks = []
    for _ in range(8):
        i = sched.next()
        picks.append(i)
        sched.record(i, 1.0 if i == 2 else 1e-3)
    # warm-up (each once), the two floored tasks up to 3 rounds each, then the heavy task
    assert picks[:3] == [0, 1, 2]
    assert sorted(picks[3:7]) == [0, 0, 1, 1]
    assert picks[7] == 2


# -- model-level reports -------------------------------------------------------------------------


def test_profile_accounts_for_every_call() -> None:
    model = onnx_zoo.build("inception-block-small")
    feeds = onnx_zoo.model_input(model)
    fused, tasks = extract_tasks(optimize_for_inference(onnx_zoo.load(model)))
    hollow = tvm.compile(hollow_kernels(fused), target=TARGET)
    prof = profile_model(tvm.compile(fused, target=TARGET), list(feeds.values()), runs=3, hollow=hollow)
    kernels = {r.name for r in prof.rows if r.kind == "kernel"}
    assert {t.name for t in tasks if t.skip is None} <= kernels
    assert any(r.kind == "vm" and r.name.startswith("vm.builtin.") for r in prof.rows)
    assert prof.total_us > 0 and prof.kernel_us > 0 and prof.sequence_us > 0
    # The hollow model runs the same VM program with no kernel work: the VM's own time.
    assert prof.hollow_us is not None and 0 < prof.vm_us == prof.hollow_us < prof.total_us
    assert "VM own time" in prof.table() and "back to back" in prof.table()


def test_hollow_kernels_keeps_the_vm_program_and_drops_the_work() -> None:
    model = onnx_zoo.build("inception-block-small")
    feeds = onnx_zoo.model_input(model)
    fused, _ = extract_tasks(optimize_for_inference(onnx_zoo.load(model)))
    hollow = hollow_kernels(fused)
    prims = [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert prims and sorted(prims) == sorted(
        gv.name_hint for gv, f in hollow.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
    )
    assert all(isinstance(hollow[name].body, tvm.tirx.Evaluate) for name in prims)
    assert structural_equal(hollow["main"], fused["main"])
    # It still runs, with outputs of the model's shapes.
    assert _run(hollow, feeds).shape == _run(fused, feeds).shape


@pytest.mark.tuning
def test_cli_reports_a_zoo_model_before_after_and_onnxruntime(tmp_path) -> None:
    pytest.importorskip("onnxruntime", reason="the comparison line needs onnxruntime")
    # A zoo name: the command writes the ONNX file into the work directory and reads it back.
    out = run_cli(
        "tune", "--model", "inception-block-small", "--trials", "8", "--work-dir", str(tmp_path / "w"),
        "--no-progress", "--profile", "--e2e-processes", "1",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "w" / "inception-block-small.onnx").is_file()
    assert "model        inception-block-small" in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("end to end"))
    assert "untuned" in line and "tuned" in line and "onnxruntime" in line and "tuned / onnxruntime" in line
    assert "outputs      tuned matches untuned" in out.stdout and "matches onnxruntime" in out.stdout
    assert "VM own time" in out.stdout
    assert "GFLOP/s" in out.stdout
