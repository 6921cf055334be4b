"""Tuning whole Relax models: tasks deduplicated and weighted, the task schedulers, the tuned
model compiled through MetaScheduleApplyDatabase and checked against the untuned one, and the
command on a built-in model and on an ONNX file."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import tvm
from fastsearch import UnsupportedWorkload
from fastsearch.cli.main import load_onnx
from fastsearch.graph.model_timing import model_inputs
from fastsearch.graph.relax_tasks import extract_tasks
from fastsearch.testing.relax_models import mlp, resnet_tiny
from fastsearch.tuning.scheduler import (
    GradientScheduler,
    RoundRobinScheduler,
    TaskState,
    expected_gain,
)
from fastsearch.tuning.tune import tune
from test_cli import run as run_cli
from tvm import relax
from tvm.relax import op as R
from tvm.s_tir import meta_schedule as ms
from tvm.script import ir as I
from tvm.script import relax as RS
from tvm.script import tirx as T

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def _run_vm(exe: tvm.runtime.Executable, inputs: list[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


# -- tasks ------------------------------------------------------------------------------------


def _repeated_layers(layers: int = 3) -> tvm.IRModule:
    """``layers`` identical conv + bias + relu + residual layers, then a reshape."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h: relax.Expr = x
            for _ in range(layers):
                w = relax.const((rng.standard_normal((4, 4, 3, 3)) * 0.1).astype("float32"))
                b = relax.const(rng.standard_normal((1, 4, 1, 1)).astype("float32"))
                y = bb.emit(R.nn.relu(bb.emit(R.add(bb.emit(R.nn.conv2d(h, w, padding=1)), b))))
                h = bb.emit(R.add(y, h))
            out = bb.emit_output(R.reshape(h, (1, 144)))
        bb.emit_func_output(out)
    return bb.get()


def test_repeated_layers_are_one_task_weighted_by_calls() -> None:
    _, tasks = extract_tasks(_repeated_layers(3))
    assert [(t.weight, t.skip) for t in tasks] == [(3, None), (1, "reshape (a view at run time)")]
    assert tasks[0].name.startswith("fused_conv2d")
    _, five = extract_tasks(_repeated_layers(5))
    assert five[0].weight == 5


@I.ir_module
class _Twins:
    """Two structurally identical PrimFuncs under different names (TVMScript keeps both)."""

    @T.prim_func(private=True, s_tir=True)
    def f1(A: T.Buffer((16, 16), "float32"), B: T.Buffer((16, 16), "float32")):
        for i, j in T.grid(16, 16):
            with T.sblock("B"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vi, vj] * T.float32(2.0)

    @T.prim_func(private=True, s_tir=True)
    def f2(X: T.Buffer((16, 16), "float32"), Y: T.Buffer((16, 16), "float32")):
        for i, j in T.grid(16, 16):
            with T.sblock("Y"):
                vi, vj = T.axis.remap("SS", [i, j])
                Y[vi, vj] = X[vi, vj] * T.float32(2.0)

    @RS.function
    def main(x: RS.Tensor((16, 16), "float32")):
        cls = _Twins
        with RS.dataflow():
            a = RS.call_tir(cls.f1, (x,), out_ty=RS.Tensor((16, 16), "float32"))
            b = RS.call_tir(cls.f2, (x,), out_ty=RS.Tensor((16, 16), "float32"))
            c = RS.call_tir(cls.f1, (x,), out_ty=RS.Tensor((16, 16), "float32"))
            out = (a, b, c)
            RS.output(out)
        return out


def test_structurally_equal_functions_share_a_task() -> None:
    _, tasks = extract_tasks(_Twins)
    assert [(t.name, t.weight, t.functions) for t in tasks] == [("f1", 3, ["f1", "f2"])]


def test_a_module_without_main_is_rejected(tmp_path) -> None:
    mod = _repeated_layers(1)
    renamed = tvm.IRModule(
        {"forward" if gv.name_hint == "main" else gv.name_hint: f for gv, f in mod.functions_items()}
    )
    with pytest.raises(UnsupportedWorkload, match="main"):
        tune(renamed, TARGET, trials=1, work_dir=tmp_path)


# -- schedulers -------------------------------------------------------------------------------


def test_expected_gain_is_ansors_rule() -> None:
    # weight 2, best 4 after 4 rounds, 8 three rounds ago: backward 4/3, forward 4/4.
    task = TaskState(weight=2, history=[8.0, 6.0, 5.0, 4.0])
    assert expected_gain(task) == pytest.approx(2 * (0.2 * 4 / 3 + 0.8 * 1.0))
    assert expected_gain(TaskState(weight=1)) == math.inf  # warm-up first
    assert expected_gain(TaskState(1, [math.inf])) == math.inf  # one failed round: try again
    assert expected_gain(TaskState(1, [math.inf, math.inf])) == 0.0  # then stop starving others


def test_gradient_scheduler_prefers_the_task_that_should_gain_most() -> None:
    # Warm-up: every task once, in order.
    states = [TaskState(1), TaskState(1), TaskState(1)]
    sched = GradientScheduler(states)
    picks = []
    for latency in (1.0, 1.0, 1.0):
        picks.append(sched.next())
        sched.record(picks[-1], latency)
    assert picks == [0, 1, 2]
    # Same latency and history: the heavier task (called more often) wins.
    assert GradientScheduler([TaskState(1, [5.0]), TaskState(3, [5.0])]).next() == 1
    # Same best and rounds: the task still improving wins over a flat one.
    flat = TaskState(1, [10.0] * 5)
    improving = TaskState(1, [20.0, 15.0, 12.0, 10.0, 10.0])
    assert GradientScheduler([flat, improving]).next() == 1
    # Same best: fewer rounds spent means more to gain.
    assert GradientScheduler([TaskState(1, [3.0] * 8), TaskState(1, [3.0] * 2)]).next() == 1
    # A slow task outweighs a fast one; inactive tasks are never picked.
    sched = GradientScheduler([TaskState(1, [100.0]), TaskState(1, [1.0])])
    assert sched.next() == 0
    sched.deactivate(0)
    assert sched.next() == 1
    sched.deactivate(1)
    assert sched.next() is None


def test_gradient_scheduler_simulated_run() -> None:
    """Synthetic tuning curves: the heavy, slow task gets most batches, every task gets one."""
    curves = {0: 100.0, 1: 10.0, 2: 10.0}  # latency each task starts at
    weights = [4, 1, 1]
    states = [TaskState(w) for w in weights]
    sched = GradientScheduler(states)
    given = [0, 0, 0]
    for _ in range(20):
        i = sched.next()
        assert i is not None
        given[i] += 1
        sched.record(i, curves[i] * 0.9 ** given[i])  # each batch trims 10%
    assert min(given) >= 1
    assert given[0] > given[1] + given[2]


def test_round_robin_cycles_over_active_tasks() -> None:
    sched = RoundRobinScheduler([TaskState(1), TaskState(1), TaskState(1)])
    assert [sched.next() for _ in range(4)] == [0, 1, 2, 0]
    sched.deactivate(1)
    assert [sched.next() for _ in range(3)] == [2, 0, 2]


def test_unknown_scheduler_is_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="task_scheduler"):
        tune(mlp(), TARGET, trials=1, work_dir=tmp_path, task_scheduler="fifo")


# -- end to end -------------------------------------------------------------------------------


def _tiny_resnet() -> tvm.IRModule:
    return resnet_tiny(channels=4, size=8, blocks=2)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    work = tmp_path_factory.mktemp("resnet")
    result = tune(_tiny_resnet(), TARGET, trials=7, work_dir=work, batch_size=1, progress=False)
    return work, result


def test_model_tasks_and_trials(tuned) -> None:
    _, result = tuned
    assert result.is_relax and result.task_scheduler == "gradient"
    weights = [(t.weight, t.skipped) for t in result.tasks.values()]
    # stem conv, the block's first conv (x2), its second conv + residual + relu (x2), mean, dense
    assert weights == [(1, None), (2, None), (2, None), (1, None), (1, None)]
    trials = [t.trials_measured for t in result.tasks.values()]
    assert sum(trials) == result.trials_measured == 7
    assert min(trials) >= 1  # the warm-up round reaches every task
    assert all(t.trials == t.trials_measured for t in result.tasks.values())
    assert all(t.best_latency_us for t in result.tasks.values())
    total = sum(t.weight * t.best_latency_us for t in result.tasks.values())
    assert result.best_latency_us == pytest.approx(total)
    # The final round and the model round can only lower a task's best below what its trials found.
    switched = [t.name for t in result.tasks.values() if t.final is not None and t.final.chosen is not None]
    if result.model_round is not None:
        switched += [c.task for c in result.model_round.chosen]
    assert (
        result.history[-1].best_us == pytest.approx(total)
        if not switched
        else result.history[-1].best_us > total
    )


def test_compiled_model_matches_the_untuned_one(tuned) -> None:
    _, result = tuned
    exe = result.compile()
    assert isinstance(exe, tvm.runtime.Executable)
    inputs = model_inputs(_tiny_resnet(), seed=3)
    expected = _run_vm(tvm.compile(_tiny_resnet(), target="llvm"), inputs)
    np.testing.assert_allclose(_run_vm(exe, inputs), expected, rtol=1e-4, atol=1e-4)


def test_weights_are_prepacked_when_the_model_is_compiled(tuned) -> None:
    """Tuned convolutions read their weights in the layout their schedule wants (RewriteLayout
    on the layout-free weights); the rewrite is folded into the constants when the model is
    compiled, so no inference runs it and ``main`` takes the model's own input."""
    _, result = tuned
    best = result.best_module()
    prims = {gv.name_hint: f for gv, f in best.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert any(name.endswith("_prepacked") for name in prims)
    called = set()

    def visit(node: object) -> None:
        if (
            isinstance(node, relax.Call)
            and isinstance(node.op, tvm.ir.Op)
            and node.op.name == "relax.call_tir"
        ):
            called.add(node.args[0].name_hint)

    relax.analysis.post_order_visit(best["main"], visit)
    assert not [n for n in called if "weight_layout_rewrite" in n or n.endswith("_weight_prepack")]
    assert [p.name for p in best["main"].params] == [p.name for p in _tiny_resnet()["main"].params]


def test_database_works_with_meta_schedule_apply_database(tuned) -> None:
    work, result = tuned
    database = ms.database.JSONDatabase(work_dir=str(work))  # TVM's own reader of our files
    with TARGET, database:
        applied = relax.transform.MetaScheduleApplyDatabase(enable_warning=True)(result.mod)
    scheduled = sorted(
        gv.name_hint
        for gv, f in applied.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "tirx.is_scheduled" in f.attrs
    )
    # Every tuned function (each copy of a deduplicated task) found its record.
    assert scheduled == sorted(n for t in result.tasks.values() for n in t.functions)
    inputs = model_inputs(_tiny_resnet(), seed=4)
    expected = _run_vm(tvm.compile(result.mod, target="llvm"), inputs)
    np.testing.assert_allclose(_run_vm(tvm.compile(applied, TARGET), inputs), expected, rtol=1e-4, atol=1e-4)


def test_resumed_model_run_measures_nothing_again(tuned) -> None:
    work, result = tuned
    again = tune(_tiny_resnet(), TARGET, trials=7, work_dir=work, batch_size=1, progress=False)
    assert again.trials_measured == 0
    assert again.best_latency_us == pytest.approx(result.best_latency_us)


def test_round_robin_splits_trials_evenly(tmp_path) -> None:
    result = tune(
        mlp(features=16, hidden_layers=3),
        TARGET,
        trials=4,
        work_dir=tmp_path,
        task_scheduler="round-robin",
        batch_size=1,
        progress=False,
    )
    assert [(t.weight, t.trials_measured) for t in result.tasks.values()] == [(3, 2), (1, 2)]
    order = [h.task for h in result.history]
    assert order[0] != order[1] and order[0] == order[2]  # one batch each in turn


# -- command ----------------------------------------------------------------------------------


def test_cli_tunes_a_built_in_model(tmp_path) -> None:
    out = run_cli(
        "tune",
        "--model",
        "mlp-tiny",
        "--trials",
        "3",
        "--work-dir",
        str(tmp_path / "w"),
        "--e2e-processes",
        "1",
    )
    assert out.returncode == 0, out.stderr
    assert "3/3 trials" in out.stderr
    lines = out.stdout.splitlines()
    assert "model        mlp-tiny" in lines
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["task", "weight"])
    rows = [line.split() for line in lines[header + 1 : header + 3]]
    assert [r[1] for r in rows] == ["3", "1"]  # hidden layers (x3), classifier
    assert sum(int(r[2]) for r in rows) == 3 and min(int(r[2]) for r in rows) >= 1
    assert lines[header + 3].startswith("total (weighted)")
    assert sum(float(r[-2].rstrip("%")) for r in rows) == pytest.approx(100, abs=0.2)
    # The whole model, before and after tuning, timed in fresh processes; outputs agree.
    assert any(line.startswith("end to end   untuned ") and "x faster" in line for line in lines)
    assert any(line.startswith("outputs      tuned matches untuned") for line in lines)
    # The task with two records (the hidden layers) was tried inside the model's sequence.
    assert any(line.startswith("model round  ") and "tasks timed in the model" in line for line in lines)


def test_missing_onnx_is_a_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if it were not installed
    with pytest.raises(UnsupportedWorkload, match="needs the `onnx` Python package"):
        load_onnx(str(tmp_path / "model.onnx"))


def _tiny_onnx(path) -> None:
    """Conv + bias + relu, a residual add, global average pooling and a dense layer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    init = [
        numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.1).astype("float32"), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype("float32"), "b"),
        numpy_helper.from_array((rng.standard_normal((4, 10)) * 0.1).astype("float32"), "fc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["s"]),
        helper.make_node("GlobalAveragePool", ["s"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_cli_tunes_an_onnx_model(tmp_path) -> None:
    pytest.importorskip("onnx", reason="the ONNX path needs the `onnx` package (pip install onnx)")
    model = tmp_path / "tiny.onnx"
    _tiny_onnx(model)
    mod = load_onnx(str(model))
    _, tasks = extract_tasks(mod)
    assert any(t.skip is None and t.name.startswith("fused_conv2d") for t in tasks)
    out = run_cli("tune", str(model), "--trials", "3", "--work-dir", str(tmp_path / "w"), "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "model        tiny" in out.stdout
    assert "total (weighted)" in out.stdout


def test_cli_without_onnx_names_the_package(tmp_path) -> None:
    """The real command, run where `onnx` cannot be imported."""
    code = (
        "import sys; sys.modules['onnx'] = None; from fastsearch.cli.main import main; "
        f"sys.exit(main(['tune', {str(tmp_path / 'm.onnx')!r}, '--trials', '1']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 1
    assert "onnx" in out.stderr and "pip install onnx" in out.stderr
    assert "Traceback" not in out.stderr
