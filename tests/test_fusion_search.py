"""fusion="search": the partitioner's proposals, the merged modules they make, and the tuning loop
that keeps a change only when the model measured end to end gets faster."""

from __future__ import annotations

from pathlib import Path

import fastsearch
import numpy as np
import pytest
import tvm
from fastsearch import _core
from fastsearch.graph.inference import optimize_for_inference
from fastsearch.graph.partition import (
    extract_graph,
    fuse,
    fusion_proposals,
    group_module,
    partition_groups,
    prepare,
)
from fastsearch.tuning.fusion_search import _verdict
from fastsearch.tuning.options import FusionSearch
from partition_models import bert_layer, branches_and_concat, resnet
from tvm import relax


def _run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _data(mod: tvm.IRModule, seed: int = 1) -> list[np.ndarray]:
    shape = [int(d) for d in mod["main"].params[0].ty.shape]
    return [np.random.default_rng(seed).standard_normal(shape).astype("float32")]


def test_bert_gets_prologue_and_epilogue_changes_for_every_copy_kernel() -> None:
    found = fusion_proposals(bert_layer())
    copies = [["reshape", "transpose"], ["reshape", "transpose", "transpose1"], ["transpose2", "reshape1"]]
    # Each head split (q, k, v) and the head merge can join its matmul on either side.
    assert sorted(k for k, _ in found) == ["epilogue"] * 4 + ["prologue"] * 4
    for kind, groups in found:
        assert len(groups) == 2
        light, heavy = (groups[1], groups[0]) if kind == "epilogue" else (groups[0], groups[1])
        assert light in copies, (kind, groups)
        assert any(name.startswith("matmul") for name in heavy), (kind, groups)


def test_resnet_downsampling_blocks_get_horizontal_changes() -> None:
    found = fusion_proposals(resnet(18, bn_op=False))
    assert [k for k, _ in found] == ["horizontal"] * 3
    for _, (first, second) in found:
        # The 3x3 convolution of the block's main path and its 1x1 projection read one tensor.
        assert first[0].startswith("conv2d") and second[0].startswith("conv2d")
        assert "relu" in first[-1] and "relu" not in second[-1]


@pytest.mark.parametrize(
    ("name", "build", "take"),
    [("bert_layer", bert_layer, 8), ("resnet18", lambda: resnet(18, size=32, bn_op=False), 1)],
)
def test_every_merge_compiles_and_computes_what_the_rule_grouping_does(name: str, build, take: int) -> None:
    mod = build()
    graph = extract_graph(prepare(mod))
    rules = partition_groups(graph)
    inputs = _data(mod)
    expected = _run(fuse(mod), inputs)
    proposals = _core.fusion_proposals(graph.to_json(), rules)[:take]
    assert proposals
    for kind, groups in proposals:
        merged = _core.merge_fusion_groups(graph.to_json(), rules, [groups])
        assert len(merged) == len(rules) - 1
        fused = fuse(mod, groups=merged)
        assert relax.analysis.check_well_formed(fused)
        np.testing.assert_allclose(_run(fused, inputs), expected, rtol=1e-4, atol=1e-4, err_msg=kind)


def test_explicit_groups_are_checked() -> None:
    mod = branches_and_concat()
    graph = extract_graph(prepare(mod))
    rules = partition_groups(graph)
    for bad in (rules[1:], [*rules, [0]], [rules[1], rules[0], *rules[2:]], [[], *rules]):
        with pytest.raises(fastsearch.MalformedInput):
            group_module(mod, groups=bad)
    with pytest.raises(fastsearch.MalformedInput):  # a merge around a group in between: a cycle
        _core.merge_fusion_groups(graph.to_json(), rules, [[0, len(rules) - 1]])


def test_verdict_needs_a_median_gain_and_three_rounds_of_four() -> None:
    assert _verdict([0.95] * 8, 0.01) == (0.95, True)
    assert _verdict(sorted([0.9] * 5 + [1.01] * 3), 0.01)[1] is False  # 3 of 8 rounds slower
    assert _verdict([0.995] * 8, 0.01)[1] is False  # faster, but by less than the minimum gain
    assert _verdict(sorted([0.9] * 6 + [1.2] * 2), 0.01)[1] is True


def test_fusion_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fusion"):
        fastsearch.tune(bert_layer(), trials=1, work_dir=tmp_path, fusion="greedy")
    kernel = next(f for _, f in fuse(bert_layer()).functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    prim = tvm.IRModule({"main": kernel})
    with pytest.raises(fastsearch.UnsupportedWorkload, match="Relax model"):
        fastsearch.tune(prim, trials=1, work_dir=tmp_path, fusion="search")
    with pytest.raises(ValueError, match="share"):
        fastsearch.tune(bert_layer(), trials=1, work_dir=tmp_path, fusion=FusionSearch(share=1.0))
    assert not any(tmp_path.iterdir())  # nothing written


def test_fusion_search_tunes_the_slowest_changes_and_keeps_only_measured_wins(tmp_path: Path) -> None:
    mod = bert_layer()
    result = fastsearch.tune(
        mod, trials=48, work_dir=tmp_path, fusion=FusionSearch(share=0.34, rounds=8), progress=False
    )
    report = result.fusion
    assert report is not None
    assert result.model_round is not None and result.model_round.skipped is None  # on the final grouping
    # Q's and V's head splits make the same function: one change at both sites.
    assert len(report.changes) == 7
    assert sum(len(c.sites) for c in report.changes) == 8
    tried = [c for c in report.changes if c.ratio is not None]
    assert len(tried) == 1  # 16 trials for changes: one change of at least 16
    assert tried[0].trials == 16 and tried[0].tasks
    assert tried[0].removed_us == max(c.removed_us or 0.0 for c in report.changes)
    assert report.trials_rules == 32 and result.trials_measured == 48
    for c in report.changes:
        assert c.reason
        if c.kept:
            assert c.ratio is not None and c.ratio <= 0.99
    rules = partition_groups(extract_graph(prepare(optimize_for_inference(mod))))  # what tune() partitions
    if any(c.kept for c in report.changes):
        assert len(report.groups) < len(rules)
    else:
        assert report.groups == rules
    # The chosen grouping is what compiles, with the tuned kernels, and computes the model.
    kernels = sum(1 for _, f in result.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    assert kernels <= len(rules)
    inputs = _data(mod)
    vm = relax.VirtualMachine(result.compile(), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    np.testing.assert_allclose(got, _run(prepare(mod), inputs), rtol=1e-3, atol=1e-3)
    assert result.timing["fusion"] > 0 and len(result.history) == 48


def test_changes_that_cannot_save_enough_get_no_trials(tmp_path: Path) -> None:
    mod = bert_layer()
    # No copy kernel is 90% of the model: every trial goes to the rule grouping.
    result = fastsearch.tune(
        mod,
        trials=24,
        work_dir=tmp_path,
        fusion=FusionSearch(min_gain=0.9),
        progress=False,
        measure=fastsearch.MeasureConfig(model_candidates=0),  # the other test runs the model round
    )
    report = result.fusion
    assert report is not None
    assert report.trials_rules == 24 and report.trials_changes == 0 and result.trials_measured == 24
    assert report.groups == partition_groups(extract_graph(prepare(optimize_for_inference(mod))))
    assert all(c.reason.startswith("not tried: the kernels it removes") for c in report.changes)
    assert all(c.removed_us is not None and c.removed_us > 0 for c in report.changes)
