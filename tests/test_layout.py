"""Channel-blocked activations (fastsearch.graph.layout): outputs equal ONNX's reference evaluator, the
convolutions and their epilogues really run blocked, and a tuned blocked model is correct."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from fastsearch import MalformedInput
from fastsearch.cli.main import summary
from fastsearch.graph.inference import InferenceReport, optimize_for_inference
from fastsearch.graph.layout import block_channels, legalize_blocked_conv2d, legalize_rules, parse_layout
from fastsearch.graph.relax_tasks import extract_tasks
from fastsearch.tuning.tune import tune
from tvm import relax
from tvm.relax import op as R

pytest.importorskip("onnx", reason="the ONNX zoo needs onnx")
from fastsearch.testing import onnx_zoo
from relax_run import TARGET
from relax_run import close as _close
from relax_run import run as _run


@pytest.mark.tuning
@pytest.mark.parametrize("name", ["mobilenet-v2-small", "resnet-18-small", "inception-block-small"])
@pytest.mark.parametrize("layout", ["NCHWc", "NCHW16c"])
def test_blocked_models_compute_the_reference_outputs(name: str, layout: str) -> None:
    model = onnx_zoo.build(name)
    feeds = onnx_zoo.model_input(model)
    ref = onnx_zoo.reference_outputs(model, feeds)[0]
    report = InferenceReport()
    mod = optimize_for_inference(onnx_zoo.load(model), report=report, layout=layout)
    assert report.blocked_convs > 0, name
    _close(_run(mod, list(feeds.values())), ref)
    fused, _ = extract_tasks(mod)
    _close(_run(fused, list(feeds.values())), ref)


def test_mobilenet_runs_blocked_from_the_stem_to_the_head() -> None:
    model = onnx_zoo.build("mobilenet-v2-small")
    report = InferenceReport()
    mod = optimize_for_inference(onnx_zoo.load(model), report=report, layout="NCHWc")
    # 10 convolutions, all writing blocked channels: the stem reads the 3-channel input as it
    # is (NCHW); the other 9, the three depthwise ones among them, read blocked channels too.
    assert report.blocked_convs == 10
    _, tasks = extract_tasks(mod)
    names = [t.name for t in tasks if t.skip is None]
    convs = [t for t in tasks if "conv2d" in t.name]
    assert len(convs) == 10, names
    assert all(len(t.func.params[-1].shape) == 5 for t in convs), names
    stems = [t for t in convs if len(t.func.params[0].shape) == 4]
    assert len(stems) == 1 and int(stems[0].func.params[0].shape[1]) == 3, names
    # Each conv keeps its whole epilogue (bias, ReLU6, residual add) in its kernel; the global
    # pooling runs blocked too, so the only layout change is of the pooled 128 values.
    assert all("_add" in t.name for t in convs), names
    mean = next(t for t in tasks if t.name.startswith("mean"))
    assert len(mean.func.params[0].shape) == 5, names
    transforms = [t for t in tasks if "layout_transform" in t.name]
    assert len(transforms) == 1, names
    assert int(np.prod([int(d) for d in transforms[0].func.params[0].shape])) == 128, names


def test_resnet_pools_blocked_after_its_stem() -> None:
    model = onnx_zoo.build("resnet-18-small")
    feeds = onnx_zoo.model_input(model)
    report = InferenceReport()
    mod = optimize_for_inference(onnx_zoo.load(model), report=report, layout="NCHWc")
    _, tasks = extract_tasks(mod)
    names = [t.name for t in tasks if t.skip is None]
    pool = next(t for t in tasks if t.name.startswith("max_pool2d"))
    assert len(pool.func.params[0].shape) == 5, names
    convs = [t for t in tasks if "conv2d" in t.name]
    # Every one of the 20 convolutions (tasks count repeated ones once) writes blocked channels.
    assert report.blocked_convs == sum(t.weight for t in convs) == 20, names
    assert all(len(t.func.params[-1].shape) == 5 for t in convs), names
    assert len([t for t in tasks if "layout_transform" in t.name]) == 1, names
    _close(_run(mod, list(feeds.values())), onnx_zoo.reference_outputs(model, feeds)[0])


def test_inception_pools_and_concatenates_blocked() -> None:
    # Every tensor of this block takes blocks of 8: the average-pooling branch and the
    # concatenation run blocked, so the only transforms are of the block's input and output.
    model = onnx_zoo.inception_block(size=9, cin=16, width=16)
    feeds = onnx_zoo.model_input(model)
    mod = optimize_for_inference(onnx_zoo.load(model), layout="NCHW8c")
    _, tasks = extract_tasks(mod)
    names = [t.name for t in tasks if t.skip is None]
    pool = next(t for t in tasks if t.name.startswith("avg_pool2d"))
    concat = next(t for t in tasks if t.name.startswith("concatenate"))
    assert len(pool.func.params[0].shape) == 5 and len(concat.func.params[-1].shape) == 5, names
    transforms = [t for t in tasks if "layout_transform" in t.name]
    assert sum(t.weight for t in transforms) == 2, names
    _close(_run(mod, list(feeds.values())), onnx_zoo.reference_outputs(model, feeds)[0])


def test_efficientnet_runs_blocked_through_silu_and_squeeze_excitation() -> None:
    # SiLU (Sigmoid, Mul) is each conv's epilogue in blocks, and squeeze-and-excitation's
    # per-channel scale multiplies the blocked tensor. Tensors stay blocked from the stem to the
    # head; the only transforms are of pooled (N, C, 1, 1) vectors: the squeeze of 4 channels,
    # which no block divides, and the classifier's input.
    model = onnx_zoo.build("efficientnet-b0-small")
    feeds = onnx_zoo.model_input(model)
    report = InferenceReport()
    mod = optimize_for_inference(onnx_zoo.load(model), report=report, layout="NCHWc")
    _, tasks = extract_tasks(mod)
    names = [t.name for t in tasks if t.skip is None]
    convs = [t for t in tasks if "conv2d" in t.name]
    # All 16 convolutions but the two squeezes to 4 channels write blocked channels.
    assert report.blocked_convs == sum(len(t.func.params[-1].shape) == 5 for t in convs) == 14, names
    assert len(convs) == 16, names
    assert not [n for n in names if "sigmoid" in n and "conv2d" not in n], names
    assert sum("sigmoid" in t.name for t in convs) == 13, names  # all but the 3 projections
    transforms = [t for t in tasks if "layout_transform" in t.name]
    assert transforms and all(np.prod([int(d) for d in t.func.params[0].shape[2:4]]) == 1 for t in transforms)
    _close(_run(mod, list(feeds.values())), onnx_zoo.reference_outputs(model, feeds)[0])


def test_activations_as_onnx_writes_them_run_blocked() -> None:
    # HardSwish, HardSigmoid, Elu, LeakyRelu and Tanh as TVM's ONNX frontend imports them
    # (clip with scalar bounds, arithmetic with scalar constants, exp): every convolution keeps
    # its activation in its kernel, and the only transforms are of the model's input and output.
    g = onnx_zoo._Graph(0)
    x = g.conv("input", 16, 16, 3, bias=True)
    x = g.conv(g.node("HardSwish", [x]), 16, 16, 3, bias=True)
    x = g.conv(g.node("Mul", [x, g.node("HardSigmoid", [x])]), 16, 16, 3, bias=True)
    x = g.conv(g.node("Elu", [x]), 16, 16, 3, bias=True)
    x = g.conv(g.node("LeakyRelu", [x], alpha=0.1), 16, 16, 3, bias=True)
    model = g.model("activations", "input", [1, 16, 8, 8], g.node("Tanh", [x]))
    feeds = onnx_zoo.model_input(model)
    mod = optimize_for_inference(onnx_zoo.load(model), layout="NCHW8c")
    _, tasks = extract_tasks(mod)
    names = [t.name for t in tasks if t.skip is None]
    convs = [t for t in tasks if "conv2d" in t.name]
    assert len(convs) == 5 and all(len(t.func.params[-1].shape) == 5 for t in convs), names
    assert len(tasks) == 7, names  # the five convolutions and two transforms
    assert sum("layout_transform" in n for n in names) == 2, names
    _close(_run(mod, list(feeds.values())), onnx_zoo.reference_outputs(model, feeds)[0])


def test_a_parameter_read_plainly_is_not_transformed_back() -> None:
    # ``x`` feeds a blocked convolution and an operation that stays plain (softmax): the plain
    # reader takes ``x`` itself, not a transform back from ``x``'s blocked twin.
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 8, 6, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((8, 8, 3, 3)).astype("float32"))
            y = bb.emit(R.nn.relu(R.nn.conv2d(x, w, padding=1)))
            out = bb.emit_output(R.add(y, R.nn.softmax(x, axis=1)))
        bb.emit_func_output(out)
    mod = bb.get()
    blocked, converted = block_channels(mod, 8)
    assert converted == 1
    transforms = [
        v.value.args[0]
        for blk in blocked["main"].body.blocks
        for v in blk.bindings
        if isinstance(v.value, relax.Call) and getattr(v.value.op, "name", "") == "relax.layout_transform"
    ]
    assert len(transforms) == 2 and transforms[0].same_as(x), transforms
    inputs = [rng.standard_normal((1, 8, 6, 6)).astype("float32")]
    legal = relax.transform.LegalizeOps(customize_legalize_map={"relax.nn.conv2d": legalize_blocked_conv2d})(
        blocked
    )
    _close(_run(legal, inputs), _run(mod, inputs))


def test_channels_the_block_does_not_divide_stay_as_they_are() -> None:
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 12, 6, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((12, 12, 3, 3)).astype("float32"))
            out = bb.emit_output(R.nn.relu(R.nn.conv2d(x, w, padding=1)))
        bb.emit_func_output(out)
    mod = bb.get()
    same, converted = block_channels(mod, 8)
    assert converted == 0 and same is mod
    _, converted = block_channels(mod, 4)
    assert converted == 1


def test_channels_between_blocks_take_a_smaller_block() -> None:
    # 16 -> 24 -> 24 (depthwise) -> 16 channels in blocks of 16: the 24-channel tensors take
    # blocks of 8, so no convolution stays in NCHW and no layout transform sits between them.
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 16, 7, 7), "float32"))
    bb = relax.BlockBuilder()

    def weight(*shape: int) -> relax.Expr:
        return relax.const(rng.standard_normal(shape).astype("float32"))

    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(R.nn.relu(R.nn.conv2d(x, weight(16, 16, 1, 1))))
            y = bb.emit(R.nn.conv2d(y, weight(24, 16, 1, 1)))
            y = bb.emit(R.nn.conv2d(y, weight(24, 1, 3, 3), padding=1, groups=24))
            out = bb.emit_output(R.nn.conv2d(y, weight(16, 24, 1, 1)))
        bb.emit_func_output(out)
    mod = bb.get()
    blocked, converted = block_channels(mod, 16)
    assert converted == 4
    layouts = [
        (str(v.value.attrs.data_layout), str(v.value.attrs.kernel_layout), str(v.value.attrs.out_layout))
        for blk in blocked["main"].body.blocks
        for v in blk.bindings
        if isinstance(v.value, relax.Call) and getattr(v.value.op, "name", "") == "relax.nn.conv2d"
    ]
    assert layouts == [
        ("NCHW16c", "OIHW16i16o", "NCHW16c"),
        ("NCHW16c", "OIHW16i8o", "NCHW8c"),
        ("NCHW8c", "OIHW1i8o", "NCHW8c"),
        ("NCHW8c", "OIHW8i16o", "NCHW16c"),
    ]
    inputs = [rng.standard_normal((1, 16, 7, 7)).astype("float32")]
    legal = relax.transform.LegalizeOps(customize_legalize_map={"relax.nn.conv2d": legalize_blocked_conv2d})(
        blocked
    )
    _close(_run(legal, inputs), _run(mod, inputs))


def _store_indices(func: tvm.tirx.PrimFunc) -> list[str]:
    """The indices the single block of ``func`` stores at, as text."""
    text = func.script()
    store = next(line for line in text.splitlines() if "] = " in line and "T.axis" not in line)
    return store.split("[", 1)[1].split("]", 1)[0].replace(" ", "").split(",")


def test_blocking_transforms_are_indexed_by_their_output() -> None:
    # NCHW -> NCHW8c legalizes to out[i, j, k, m, cb] = x[i, j*8 + cb, k, m], whose innermost
    # loop walks the output; a transform of another kind (NCHW -> NHWC) keeps TVM's rule.
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 24, 5, 7), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            blocked = bb.emit(R.layout_transform(x, index_map=lambda i, j, k, m: (i, j // 8, k, m, j % 8)))
            nhwc = bb.emit(R.layout_transform(x, index_map=lambda i, j, k, m: (i, k, m, j)))
            out = bb.emit_output(relax.Tuple([blocked, nhwc]))
        bb.emit_func_output(out)
    mod = bb.get()
    ours = relax.transform.LegalizeOps(customize_legalize_map=legalize_rules())(mod)
    tvms = relax.transform.LegalizeOps()(mod)
    funcs = {g.name_hint: f for g, f in ours.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    theirs = {g.name_hint: f for g, f in tvms.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert len(funcs) == len(theirs) == 2, funcs.keys()
    by_rank = {len(f.params[-1].shape): f for f in funcs.values()}
    assert _store_indices(by_rank[5]) == ["v_i", "v_j", "v_k", "v_m", "v_cb"], by_rank[5].script()
    assert [_store_indices(f) for f in theirs.values() if len(f.params[-1].shape) == 5] != [
        _store_indices(by_rank[5])
    ]
    nhwc_theirs = next(f for f in theirs.values() if len(f.params[-1].shape) == 4)
    assert _store_indices(by_rank[4]) == _store_indices(nhwc_theirs)
    data = rng.standard_normal((1, 24, 5, 7)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(ours, target=TARGET), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(data))
    np.testing.assert_array_equal(got[0].numpy(), data.reshape(1, 3, 8, 5, 7).transpose(0, 1, 3, 4, 2))
    np.testing.assert_array_equal(got[1].numpy(), data.transpose(0, 2, 3, 1))


def test_layout_arguments() -> None:
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})
    assert parse_layout("NCHW") is None
    assert parse_layout("NCHWc") == 8
    assert parse_layout("NCHW16c") == 16
    assert parse_layout("NCHW8c", avx512) == 8
    # "NCHWc" fills the target's float32 vectors: 16 lanes with AVX-512, 8 with AVX2.
    assert parse_layout("NCHWc", avx512) == 16
    assert parse_layout("NCHWc", avx2) == 8
    for bad in ("NHWC", "NCHW0c", "nchwc", ""):
        with pytest.raises(MalformedInput, match="layout"):
            parse_layout(bad)


@pytest.mark.tuning
def test_a_tuned_blocked_model_matches_the_reference(tmp_path) -> None:
    model = onnx_zoo.build("mobilenet-v2-small")
    feeds = onnx_zoo.model_input(model)
    ref = onnx_zoo.reference_outputs(model, feeds)[0]
    result = tune(
        onnx_zoo.load(model),
        TARGET,
        trials=24,
        batch_size=8,
        work_dir=tmp_path,
        progress=False,
        layout="NCHWc",
    )
    tuned = [t for t in result.tasks.values() if t.skipped is None and t.best_latency_us is not None]
    assert any(len(t.mod["main"].params[-1].shape) == 5 for t in tuned)
    out = relax.VirtualMachine(result.compile(), tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in feeds.values()]
    )
    while not hasattr(out, "numpy"):
        out = out[0]
    _close(out.numpy(), ref)


@pytest.mark.tuning
def test_layout_search_tunes_both_layouts_and_keeps_the_faster(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 16, 14, 14), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w1 = relax.const(rng.standard_normal((32, 16, 1, 1)).astype("float32"))
            w2 = relax.const(rng.standard_normal((32, 1, 3, 3)).astype("float32"))
            y = bb.emit(R.nn.relu(R.nn.conv2d(x, w1)))
            out = bb.emit_output(R.nn.relu(R.nn.conv2d(y, w2, padding=1, groups=32)))
        bb.emit_func_output(out)
    mod = bb.get()
    result = tune(mod, TARGET, trials=30, work_dir=tmp_path, progress=False, layout="search")
    choice = result.layout_choice
    assert choice is not None and set(choice.estimates_us) == {"NCHWc", "NCHW"}
    # A fifth of the trials each, or a first batch of every task, whichever is more.
    assert 6 <= choice.probe_trials <= 15
    estimates = choice.estimates_us
    assert all(v is not None and v > 0 for v in estimates.values()), choice
    assert choice.chosen == min(estimates, key=lambda k: estimates[k] or 0.0)
    # The rest of the run tuned the kept layout's tasks (blocked ones read 5-D tensors).
    tuned = [t for t in result.tasks.values() if t.skipped is None]
    blocked = any(len(t.mod["main"].params[0].shape) == 5 for t in tuned)
    assert blocked == (choice.chosen == "NCHWc")
    assert result.trials_measured <= 30 and "layout" in result.timing
    # Each layout tuned in a directory of its own (their tasks share names); the kept one resumed.
    assert result.work_dir == tmp_path / f"layout-{choice.chosen}"
    assert {p.name for p in tmp_path.iterdir()} == {"layout-NCHWc", "layout-NCHW"}
    text = summary("search", (), result, None)
    assert (
        f"layout       {choice.chosen} kept: tuned tasks' sums after {choice.probe_trials} trials each"
        in text
    )
    inputs = [rng.standard_normal((1, 16, 14, 14)).astype("float32")]
    out = relax.VirtualMachine(result.compile(), tvm.cpu())["main"](tvm.runtime.tensor(inputs[0]))
    _close(out.numpy(), _run(relax.transform.LegalizeOps()(mod), inputs))
