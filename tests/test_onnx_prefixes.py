"""The cuts of ``benches.stages_vs_onnxruntime``: prefixes of a zoo model that end where the docs say."""

from __future__ import annotations

import numpy as np
import onnx
from fastsearch.testing import onnx_zoo
from onnx import shape_inference


def test_cuts_end_each_image_size_and_prefixes_compute_them() -> None:
    model = onnx_zoo.build("mobilenet-v2-small")
    cuts = onnx_zoo.stage_cuts(model)
    inferred = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    producers = {n.output[0]: n.op_type for n in model.graph.node}
    inner = cuts[:-1]
    sizes = [tuple(shapes[c][2:]) for c in inner]
    assert len(set(sizes)) == len(sizes) and sizes == sorted(sizes, reverse=True), sizes
    assert cuts[-1] == model.graph.output[0].name
    assert any(producers[c] == "Add" for c in inner)  # a residual block's end where there is one
    feeds = onnx_zoo.model_input(model, seed=1)
    for cut in inner[:2]:
        sub = onnx_zoo.prefix(model, cut)
        assert [o.name for o in sub.graph.output] == [cut]
        onnx.checker.check_model(sub)
        out = onnx_zoo.reference_outputs(sub, feeds)[0]
        assert list(out.shape) == shapes[cut] and np.isfinite(out).all()
