"""The program model imports every suite workload and the common operators."""

from __future__ import annotations

import json

import fastsearch
import pytest
import tvm
from fastsearch import _core
from fastsearch.ir.tir_import import program_json
from tvm import te
from workloads import FAMILIES, extra, relax_legalized, suite


def summary(func) -> dict:
    return json.loads(_core.Program(program_json(func)).summary())


def test_whole_suite_imports():
    seen = set()
    for family, idx, func in suite():
        s = summary(func)
        assert s["blocks"], f"{family}[{idx}] has no blocks"
        seen.add(family)
    assert seen == set(FAMILIES)


def test_gmm_model_is_faithful():
    from tvm.s_tir.meta_schedule.testing import te_workload

    s = summary(te_workload.create_te_workload("GMM", 2))  # (1, 512, 512, 512)
    (z,) = s["blocks"]
    assert z["name"] == "Z"
    assert z["iter_kinds"] == "SSSR"
    assert z["extents"] == [1, 512, 512, 512]
    assert z["reduction"] is True
    assert z["float_ops"] == 2  # one multiply, one add per iteration
    assert z["loads"] == 3  # Z, X, Y


def test_conv_padding_keeps_its_predicate():
    from tvm.s_tir.meta_schedule.testing import te_workload

    doc = json.loads(program_json(te_workload.create_te_workload("C2D", 0)))
    pad = next(b for b in doc["blocks"] if b["name"] == "PadInput")
    assert pad["body"][0]["value"][0] == "select"  # if_then_else of the padding condition


@pytest.mark.parametrize("name", ["matmul", "matmul_relu", "softmax", "layer_norm", "max_pool", "avg_pool"])
def test_operators_import(name):
    s = summary(extra()[name])
    assert s["blocks"]


def test_relax_legalized_functions_import():
    funcs = relax_legalized()
    names = " ".join(funcs)
    for op in ("conv2d", "add", "relu", "matmul"):
        assert op in names, names
    for func in funcs.values():
        assert summary(func)["blocks"]


def test_dynamic_shape_is_unsupported():
    n = tvm.tirx.Var("n", "int32")
    a = te.placeholder((n, 4), name="A")
    b = te.compute((n, 4), lambda i, j: a[i, j] * 2.0, name="B")
    func = te.create_prim_func([a, b])
    with pytest.raises(fastsearch.UnsupportedWorkload, match="dynamic"):
        program_json(func)


def test_malformed_program_json_is_typed():
    with pytest.raises(fastsearch.FastsearchError):
        _core.Program('{"buffers": 3}').summary()
    with pytest.raises(fastsearch.MalformedInput):
        _core.Program("not json").summary()


def test_public_api_is_curated_and_complete():
    # What the README and the drop-in docs tell users to reach from the top level.
    public = {
        "tune", "sample", "extract_features", "partition", "TuneResult", "MeasureConfig",
        "RPCRunner", "WarmStart", "SearchStrategy", "FeatureExtractor", "CostModel",
        "FastsearchError", "UnsupportedWorkload", "MalformedInput", "InvalidTarget",
    }  # fmt: skip
    assert public <= set(fastsearch.__all__)
    for name in fastsearch.__all__:
        assert getattr(fastsearch, name) is not None, name
    assert fastsearch.extract_features is fastsearch.costmodel.features.extract_features
    assert issubclass(fastsearch.UnsupportedWorkload, fastsearch.FastsearchError)
    # The drop-in classes are fastsearch.metaschedule's, and what they build are MetaSchedule's roles.
    from fastsearch import metaschedule as dropin
    from tvm.s_tir import meta_schedule as ms

    assert (fastsearch.SearchStrategy, fastsearch.CostModel, fastsearch.FeatureExtractor) == (
        dropin.SearchStrategy, dropin.CostModel, dropin.FeatureExtractor
    )  # fmt: skip
    assert isinstance(fastsearch.FeatureExtractor(), ms.feature_extractor.FeatureExtractor)
