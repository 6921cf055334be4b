"""The model round: each task's best records tried inside the model's call sequence, in a fresh
process; a runner-up chosen there is the best the database gives, and the model still computes
its output with it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from fastsearch.database import candidate_key
from fastsearch.graph.model_timing import model_inputs
from fastsearch.measure.measurer import MeasureConfig
from fastsearch.testing.relax_models import resnet_tiny
from fastsearch.tuning.model_round import _align, _Sequence
from fastsearch.tuning.tune import tune
from tvm import relax

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def _model() -> tvm.IRModule:
    return resnet_tiny(channels=4, size=8, blocks=2)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    work = tmp_path_factory.mktemp("model_round")
    measure = MeasureConfig(model_candidates=3, model_rounds=3, final_candidates=1)
    result = tune(_model(), TARGET, trials=12, work_dir=work, batch_size=2, measure=measure, progress=False)
    return work, result


def test_every_tuned_task_with_runners_up_is_tried(tuned) -> None:
    _, result = tuned
    found = result.model_round
    assert found is not None and found.skipped is None, found
    tried = [t.task for t in found.tasks]
    assert tried == [n for n in result.tasks if n in tried]  # program order
    assert tried, "twelve trials over five tasks leave runners-up to try"
    for choice in found.tasks:
        assert 2 <= len(choice.ratios) == len(choice.keys) <= 3
        assert choice.ratios[0] == 1.0 and choice.sequence_us > 0
        assert len(set(choice.keys)) == len(choice.keys)
        if choice.chosen is not None:
            assert choice.ratios[choice.chosen] < 0.97
    assert found.build_s > 0 and found.time_s > 0 and "model round" not in found.summary()
    assert "model_round" in result.timing


def test_a_chosen_runner_up_is_the_best_the_database_gives(tuned) -> None:
    _, result = tuned
    for choice in result.model_round.tasks:
        best = result.tasks[choice.task].best_trace
        expected = choice.keys[choice.chosen if choice.chosen is not None else 0]
        assert candidate_key(best) == expected


def test_the_model_still_computes_its_output(tuned) -> None:
    _, result = tuned
    inputs = model_inputs(_model(), seed=3)
    args = [tvm.runtime.tensor(x) for x in inputs]
    expected = relax.VirtualMachine(tvm.compile(_model(), target="llvm"), tvm.cpu())["main"](*args).numpy()
    got = relax.VirtualMachine(result.compile(), tvm.cpu())["main"](*args).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_kernels_mixed_from_every_candidate_model_compute_the_model(tuned) -> None:
    """The sequence takes each call's kernel and weights from one model and its activations from
    model 0: any mix gives model 0's output, and a wrong weight is caught."""
    work, result = tuned
    spec = json.loads((work / "model_round" / "plan.json").read_text())
    assert len(spec["libraries"]) >= 2
    args = [tvm.runtime.tensor(x) for x in model_inputs(result.mod, seed=1)]
    seq = _Sequence(spec, args)
    assert seq.computes_the_model(1e-3, 1e-4)
    rng = np.random.default_rng(0)
    n = len(spec["libraries"])
    mixable = [
        t is not None and all(row[i][1] is not None for row in seq.calls) for i, t in enumerate(seq.task_of)
    ]
    assert any(mixable)
    for _ in range(4):
        seq.choice = [int(rng.integers(0, n)) if ok else 0 for ok in mixable]
        assert seq.computes_the_model(1e-3, 1e-4), seq.choice
    # The check can fail: a kernel given a wrong weight no longer computes the model.
    seq.choice = [0] * len(seq.choice)
    i = next(i for i, w in enumerate(seq.weights[0]) if w and seq.task_of[i] is not None)
    weight = seq.calls[0][i][1][min(seq.weights[0][i])]
    kept = weight.numpy().copy()
    weight.copyfrom(rng.uniform(1, 2, kept.shape).astype(kept.dtype))
    assert not seq.computes_the_model(1e-3, 1e-4)
    weight.copyfrom(kept)
    assert seq.computes_the_model(1e-3, 1e-4)


def test_align_drops_planned_calls_the_vm_does_not_make() -> None:
    planned = [("a", [1]), ("reshape", []), ("b", [1, 2]), ("c", [])]
    assert _align(["a", "b", "c"], planned) == [("a", [1]), ("b", [1, 2]), ("c", [])]
    assert _align(["a", "d"], planned) is None
    assert _align(["b", "a"], planned) is None  # order matters
