"""Differential tests of fastsearch's fusion-group partitioner against TVM's Relax FuseOps."""

from __future__ import annotations

import fastsearch
import numpy as np
import pytest
import tvm
from fastsearch.graph.inference import optimize_for_inference
from fastsearch.graph.partition import (
    extract_graph,
    fuse,
    group_module,
    partition,
    partition_groups,
    prepare,
)
from fastsearch.testing.relax_models import MODELS as BUILTIN_MODELS
from fastsearch.testing.relax_models import load_model
from partition_models import MODELS, bert_layer, branches_and_concat, long_chain, random_graph, resnet
from tvm import relax


def _call_tir_callee(value: relax.Expr) -> str | None:
    if (
        isinstance(value, relax.Call)
        and isinstance(value.op, tvm.ir.Op)
        and value.op.name == "relax.call_tir"
    ):
        return value.args[0].name_hint
    return None


def _groups_of_fused(mod: tvm.IRModule) -> list[list[str]]:
    """The groups of a module after FuseOps, in program order: each call to a fused function
    gives its inner call_tir callees, each remaining call_tir a group of its own."""
    groups = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            callee = _call_tir_callee(value)
            if callee is not None:
                groups.append([callee])
            elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
                inner = mod[value.op]
                assert isinstance(inner, relax.Function)
                names = [
                    name
                    for inner_block in inner.body.blocks
                    for b in inner_block.bindings
                    if (name := _call_tir_callee(b.value)) is not None
                ]
                groups.append(names)
    return groups


def _fuse_ops_groups(mod: tvm.IRModule, max_depth: int | None = None) -> list[list[str]]:
    config = {} if max_depth is None else {"relax.FuseOps.max_depth": max_depth}
    with tvm.transform.PassContext(opt_level=2, config=config):
        return _groups_of_fused(relax.transform.FuseOps()(prepare(mod)))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_groups_match_fuse_ops(name: str) -> None:
    mod = MODELS[name]()
    ours = partition(mod)
    assert ours == _fuse_ops_groups(mod)
    # Every call_tir of the legalized module is in exactly one group.
    graph = extract_graph(prepare(mod))
    assert sorted(n for g in ours for n in g) == sorted(c for c in graph.callee if c)
    assert any(len(g) > 1 for g in ours)


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_builtin_models_group_as_fuse_ops(name: str) -> None:
    # The models `fastsearch tune --model` and the end-to-end benchmark tune, ResNet-18 included.
    mod = load_model(name)
    assert partition(mod) == _fuse_ops_groups(mod)


@pytest.mark.parametrize(
    "name", ["mobilenet-v2-small", "resnet-18-small", "bert-layer-small", "inception-block-small"]
)
def test_zoo_models_after_the_inference_pipeline_group_as_fuse_ops(name: str) -> None:
    # What tune() partitions: ONNX imports after fastsearch's inference pipeline.
    onnx_zoo = pytest.importorskip("fastsearch.testing.onnx_zoo")
    pytest.importorskip("onnx")
    mod = optimize_for_inference(onnx_zoo.load(name))
    assert partition(mod) == _fuse_ops_groups(mod)


@pytest.mark.parametrize("depth", [2, 5, 64])
def test_max_fuse_depth_matches(depth: int) -> None:
    mod = long_chain(40)
    assert partition(mod, max_fuse_depth=depth) == _fuse_ops_groups(mod, depth)
    assert max(len(g) for g in partition(mod, max_fuse_depth=depth)) <= depth


def test_resnet_with_folded_batch_norm_and_bn_op() -> None:
    # Folded BN fuses conv + scale + shift + relu; the batch_norm op (a tuple) stops the conv.
    folded = partition(resnet(18, bn_op=False))
    assert folded == _fuse_ops_groups(resnet(18, bn_op=False))
    assert folded[0][0].startswith("conv2d") and len(folded[0]) >= 3


def test_malformed_graph_is_a_fastsearch_error() -> None:
    with pytest.raises(fastsearch.MalformedInput):
        fastsearch._core.partition_graph('{"nodes": [{"pattern": 9}]}')
    with pytest.raises(fastsearch.FastsearchError):
        fastsearch._core.partition_graph('{"nodes": [{"pattern": 0, "inputs": [0]}]}')
    with pytest.raises(fastsearch.MalformedInput):
        partition(long_chain(3), max_fuse_depth=0)
    with pytest.raises(fastsearch.UnsupportedWorkload):
        partition(tvm.IRModule())


def test_group_module_is_well_formed_and_has_our_groups() -> None:
    mod = branches_and_concat()
    grouped = group_module(mod)
    assert relax.analysis.check_well_formed(grouped)
    assert _groups_of_fused(grouped) == partition(mod)
    graph = extract_graph(prepare(mod))
    assert len(partition_groups(graph)) >= len(partition(mod))


def _run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    items = [out] if hasattr(out, "numpy") else list(out)
    return [item.numpy() for item in items]


_COMPILED = {
    "branches_and_concat": branches_and_concat,
    "resnet18_folded_bn": lambda: resnet(18, size=32, bn_op=False),
    "bert_layer": bert_layer,
}


@pytest.mark.parametrize("name", sorted(_COMPILED))
def test_fused_module_compiles_and_matches_unfused(name: str) -> None:
    mod = _COMPILED[name]()
    shape = [int(d) for d in mod["main"].params[0].ty.shape]
    data = np.random.default_rng(1).standard_normal(shape).astype("float32")
    fused = fuse(mod)
    # Exactly our groups reach the compiler: one PrimFunc call per group.
    calls = [
        c
        for block in fused["main"].body.blocks
        for b in block.bindings
        if (c := _call_tir_callee(b.value)) is not None
    ]
    assert len(calls) == len(partition(mod))
    expected = _run(prepare(mod), [data])
    got = _run(fused, [data])
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed", range(25))
def test_random_graphs_match_fuse_ops(seed: int) -> None:
    mod = random_graph(seed)
    assert partition(mod) == _fuse_ops_groups(mod)
