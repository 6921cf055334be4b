"""ONNX models built in code (``onnx.helper``, random weights, batch 1), with no download.

These are the files a TVM user brings: every convolution is followed by a
``BatchNormalization`` node with its own statistics (as an exporter writes a model that was not
folded), ReLU6 is ``Clip(0, 6)`` with its bounds as inputs (opset 13), residuals are ``Add``
nodes, attention reshapes and transposes between layouts, and GELU is written out with ``Erf``.
They are imported with TVM's ONNX frontend (:func:`load`), so what fastsearch tunes is what
``relax.frontend.onnx.from_onnx`` gives a user.

``ZOO`` maps each name to a builder of the full-size model; ``SMALL`` to a small version of the
same graph (the same operators and structure, fewer channels and pixels) for tests. Every
builder takes ``seed``; weights are scaled so that activations stay in range through the depth.

Needs the ``onnx`` package (``pip install onnx``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fastsearch.errors import UnsupportedWorkload

__all__ = [
    "SMALL",
    "ZOO",
    "bert_layer",
    "build",
    "efficientnet_b0",
    "inception_block",
    "load",
    "mobilenet_v2",
    "model_input",
    "prefix",
    "reference_outputs",
    "resnet",
    "stage_cuts",
    "vit_block",
]

OPSET = 17


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise UnsupportedWorkload(
            "the ONNX model zoo needs the `onnx` Python package: pip install onnx"
        ) from None
    return onnx


class _Graph:
    """A graph under construction: nodes, initializers and fresh names."""

    def __init__(self, seed: int) -> None:
        self.onnx = _onnx()
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, array: np.ndarray, prefix: str = "w") -> str:
        name = self.name(prefix)
        self.inits.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(op.lower())
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [out], **attrs))
        return out

    # Layers ------------------------------------------------------------------------------------

    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        k: int,
        stride: int = 1,
        groups: int = 1,
        bias: bool = False,
        pad: int | None = None,
    ) -> str:
        """A convolution with He-initialized weights, padded by ``k // 2`` unless ``pad`` says."""
        fan_in = cin // groups * k * k
        w = (self.rng.standard_normal((cout, cin // groups, k, k)) * math.sqrt(2.0 / fan_in)).astype(
            "float32"
        )
        inputs = [x, self.const(w)]
        if bias:
            inputs.append(self.const((self.rng.standard_normal(cout) * 0.1).astype("float32"), "b"))
        pad = k // 2 if pad is None else pad
        return self.node(
            "Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups
        )

    def batch_norm(self, x: str, c: int) -> str:
        gamma = self.rng.uniform(0.5, 1.5, c).astype("float32")
        beta = (self.rng.standard_normal(c) * 0.1).astype("float32")
        mean = (self.rng.standard_normal(c) * 0.1).astype("float32")
        var = self.rng.uniform(0.5, 1.5, c).astype("float32")
        names = [self.const(a, "bn") for a in (gamma, beta, mean, var)]
        return self.node("BatchNormalization", [x, *names], epsilon=1e-5)

    def conv_bn(
        self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: str | None = "relu"
    ) -> str:
        y = self.batch_norm(self.conv(x, cin, cout, k, stride, groups), cout)
        if act == "relu":
            return self.node("Relu", [y])
        if act == "relu6":
            lo, hi = self.const(np.array(0.0, "float32"), "lo"), self.const(np.array(6.0, "float32"), "hi")
            return self.node("Clip", [y, lo, hi])
        return y

    def silu(self, x: str) -> str:
        """SiLU as exporters write it: ``Mul(x, Sigmoid(x))``."""
        return self.node("Mul", [x, self.node("Sigmoid", [x])])

    def squeeze_excite(self, x: str, c: int, reduced: int) -> str:
        """Squeeze-and-excitation: global average pooling, a 1x1 conv to ``reduced`` channels
        and SiLU, a 1x1 conv back and a sigmoid, and ``x`` scaled channel by channel."""
        s = self.silu(self.conv(self.node("GlobalAveragePool", [x]), c, reduced, 1, bias=True))
        s = self.node("Sigmoid", [self.conv(s, reduced, c, 1, bias=True)])
        return self.node("Mul", [x, s])

    def dense(self, x: str, cin: int, cout: int) -> str:
        w = (self.rng.standard_normal((cin, cout)) / math.sqrt(cin)).astype("float32")
        b = (self.rng.standard_normal(cout) * 0.1).astype("float32")
        return self.node("Add", [self.node("MatMul", [x, self.const(w)]), self.const(b, "b")])

    def layer_norm(self, x: str, c: int) -> str:
        gamma = self.rng.uniform(0.8, 1.2, c).astype("float32")
        beta = (self.rng.standard_normal(c) * 0.1).astype("float32")
        return self.node(
            "LayerNormalization", [x, self.const(gamma, "ln"), self.const(beta, "ln")], axis=-1, epsilon=1e-5
        )

    def gelu(self, x: str) -> str:
        """GELU as exporters write it before opset 20: ``0.5 x (1 + erf(x / sqrt 2))``."""
        scaled = self.node("Div", [x, self.const(np.array(math.sqrt(2.0), "float32"), "c")])
        one = self.node("Add", [self.node("Erf", [scaled]), self.const(np.array(1.0, "float32"), "c")])
        return self.node("Mul", [self.node("Mul", [x, one]), self.const(np.array(0.5, "float32"), "c")])

    def reshape(self, x: str, shape: list[int]) -> str:
        return self.node("Reshape", [x, self.const(np.array(shape, "int64"), "shape")])

    def classifier(self, x: str, cin: int, classes: int) -> str:
        """Global average pooling, flatten, a Gemm classifier and softmax."""
        pooled = self.node("Flatten", [self.node("GlobalAveragePool", [x])])
        w = (self.rng.standard_normal((classes, cin)) / math.sqrt(cin)).astype("float32")
        b = (self.rng.standard_normal(classes) * 0.1).astype("float32")
        logits = self.node("Gemm", [pooled, self.const(w), self.const(b, "b")], transB=1)
        return self.node("Softmax", [logits], axis=-1)

    def attention(self, x: str, seq: int, hidden: int, heads: int) -> str:
        """Multi-head self-attention of ``x`` (1, seq, hidden) with the output projection."""
        dim = hidden // heads

        def split_heads(t: str) -> str:
            return self.node("Transpose", [self.reshape(t, [1, seq, heads, dim])], perm=[0, 2, 1, 3])

        q = split_heads(self.dense(x, hidden, hidden))
        k = self.node(
            "Transpose",
            [self.reshape(self.dense(x, hidden, hidden), [1, seq, heads, dim])],
            perm=[0, 2, 3, 1],
        )
        v = split_heads(self.dense(x, hidden, hidden))
        scores = self.node(
            "Div", [self.node("MatMul", [q, k]), self.const(np.array(math.sqrt(dim), "float32"), "c")]
        )
        ctx = self.node("MatMul", [self.node("Softmax", [scores], axis=-1), v])
        ctx = self.reshape(self.node("Transpose", [ctx], perm=[0, 2, 1, 3]), [1, seq, hidden])
        return self.dense(ctx, hidden, hidden)

    def model(self, name: str, x: str, shape: list[int], out: str) -> Any:
        helper = self.onnx.helper
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(x, self.onnx.TensorProto.FLOAT, shape)],
            [],
            initializer=self.inits,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="fastsearch"
        )
        model.ir_version = 8
        # The output's shape comes from ONNX's shape inference, as an exporter writes it.
        inferred = self.onnx.shape_inference.infer_shapes(model)
        info = next(v for v in inferred.graph.value_info if v.name == out)
        model.graph.output.append(info)
        self.onnx.checker.check_model(model, full_check=True)
        return model


#: MobileNetV2's inverted residual stages (Sandler et al. 2018): expansion t, channels c,
#: repeats n, first stride s.
MOBILENET_V2_STAGES = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def mobilenet_v2(
    size: int = 224,
    stages: list[tuple[int, int, int, int]] | None = None,
    stem: int = 32,
    head: int = 1280,
    classes: int = 1000,
    seed: int = 0,
) -> Any:
    """MobileNetV2: a 3x3 stem of stride 2, inverted residual blocks (1x1 expand, 3x3
    depthwise, 1x1 project, batch norm after every conv, ReLU6 as ``Clip``, a residual ``Add``
    when shapes allow), a 1x1 head, global average pooling, ``Gemm`` and ``Softmax``."""
    g = _Graph(seed)
    x = g.conv_bn("input", 3, stem, 3, 2, act="relu6")
    cin = stem
    for t, c, n, s in stages if stages is not None else MOBILENET_V2_STAGES:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x if t == 1 else g.conv_bn(x, cin, hidden, 1, act="relu6")
            y = g.conv_bn(y, hidden, hidden, 3, stride, groups=hidden, act="relu6")
            y = g.conv_bn(y, hidden, c, 1, act=None)
            x = g.node("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    x = g.conv_bn(x, cin, head, 1, act="relu6")
    return g.model("mobilenet_v2", "input", [1, 3, size, size], g.classifier(x, head, classes))


#: EfficientNet-B0's MBConv stages: (expansion, channels, blocks, first stride, kernel).
EFFICIENTNET_B0_STAGES = [
    (1, 16, 1, 1, 3),
    (6, 24, 2, 2, 3),
    (6, 40, 2, 2, 5),
    (6, 80, 3, 2, 3),
    (6, 112, 3, 1, 5),
    (6, 192, 4, 2, 5),
    (6, 320, 1, 1, 3),
]


def efficientnet_b0(
    size: int = 224,
    stages: list[tuple[int, int, int, int, int]] | None = None,
    stem: int = 32,
    head: int = 1280,
    classes: int = 1000,
    seed: int = 0,
) -> Any:
    """EfficientNet-B0 (Tan and Le 2019): a 3x3 stem of stride 2, MBConv blocks (1x1 expand,
    3x3 or 5x5 depthwise, squeeze-and-excitation to a quarter of the block's input channels,
    1x1 project, a residual ``Add`` when shapes allow), batch norm after every conv, SiLU as
    ``Sigmoid`` and ``Mul``, a 1x1 head, global average pooling, ``Gemm`` and ``Softmax``."""
    g = _Graph(seed)
    x = g.silu(g.conv_bn("input", 3, stem, 3, 2, act=None))
    cin = stem
    for t, c, n, s, k in stages if stages is not None else EFFICIENTNET_B0_STAGES:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x if t == 1 else g.silu(g.conv_bn(x, cin, hidden, 1, act=None))
            y = g.silu(g.conv_bn(y, hidden, hidden, k, stride, groups=hidden, act=None))
            y = g.conv_bn(g.squeeze_excite(y, hidden, max(1, cin // 4)), hidden, c, 1, act=None)
            x = g.node("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    x = g.silu(g.conv_bn(x, cin, head, 1, act=None))
    return g.model("efficientnet_b0", "input", [1, 3, size, size], g.classifier(x, head, classes))


def resnet(depth: int = 18, size: int = 224, width: int = 64, classes: int = 1000, seed: int = 0) -> Any:
    """ResNet-18/34 (basic blocks) or ResNet-50/101 (bottlenecks), torchvision's layout: a 7x7
    stem of stride 2 and max pooling, four stages, every conv followed by batch norm, residual
    ``Add`` then ``Relu``, global average pooling, ``Gemm`` and ``Softmax``."""
    layers = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3]}
    if depth not in layers:
        raise UnsupportedWorkload(f"ResNet depth {depth} is not one of {sorted(layers)}")
    bottleneck = depth >= 50
    g = _Graph(seed)
    x = g.conv_bn("input", 3, width, 7, 2)
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, blocks in enumerate(layers[depth]):
        planes = width * 2**stage
        cout = planes * 4 if bottleneck else planes
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            if bottleneck:
                y = g.conv_bn(x, cin, planes, 1)
                y = g.conv_bn(y, planes, planes, 3, stride)
                y = g.conv_bn(y, planes, cout, 1, act=None)
            else:
                y = g.conv_bn(x, cin, planes, 3, stride)
                y = g.conv_bn(y, planes, cout, 3, act=None)
            shortcut = x if stride == 1 and cin == cout else g.conv_bn(x, cin, cout, 1, stride, act=None)
            x = g.node("Relu", [g.node("Add", [y, shortcut])])
            cin = cout
    return g.model(f"resnet{depth}", "input", [1, 3, size, size], g.classifier(x, cin, classes))


def bert_layer(
    seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int | None = None, seed: int = 0
) -> Any:
    """One BERT encoder layer (BERT-base by default): self-attention with the output projection,
    residual ``Add`` and ``LayerNormalization``, then a GELU feed-forward layer (``Erf``) of
    ``ffn`` (4x ``hidden``) with a residual ``Add`` and ``LayerNormalization``."""
    g = _Graph(seed)
    x = g.layer_norm(g.node("Add", [g.attention("input", seq, hidden, heads), "input"]), hidden)
    h = g.gelu(g.dense(x, hidden, ffn or 4 * hidden))
    out = g.layer_norm(g.node("Add", [g.dense(h, ffn or 4 * hidden, hidden), x]), hidden)
    return g.model("bert_layer", "input", [1, seq, hidden], out)


def inception_block(size: int = 35, cin: int = 192, width: int = 64, seed: int = 0) -> Any:
    """Inception-v3's 35x35 block (Szegedy et al. 2016): four branches (1x1; 1x1 then 5x5; 1x1
    then two 3x3; 3x3 average pooling then 1x1), each conv with batch norm and ReLU, joined by
    ``Concat`` on channels, then a 1x1 conv that reads the concatenation."""
    g = _Graph(seed)
    b1 = g.conv_bn("input", cin, width, 1)
    b2 = g.conv_bn(g.conv_bn("input", cin, width * 3 // 4, 1), width * 3 // 4, width, 5)
    b3 = g.conv_bn(g.conv_bn("input", cin, width, 1), width, width * 3 // 2, 3)
    b3 = g.conv_bn(b3, width * 3 // 2, width * 3 // 2, 3)
    pool = g.node("AveragePool", ["input"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    b4 = g.conv_bn(pool, cin, width // 2, 1)
    cat = g.node("Concat", [b1, b2, b3, b4], axis=1)
    total = width + width + width * 3 // 2 + width // 2
    out = g.conv_bn(cat, total, cin, 1)
    return g.model("inception_block", "input", [1, cin, size, size], out)


def vit_block(size: int = 224, patch: int = 16, hidden: int = 384, heads: int = 6, seed: int = 0) -> Any:
    """A vision transformer's patch embedding and one pre-norm encoder block (ViT-S/16 sizes):
    a ``patch`` x ``patch`` convolution of the same stride, reshaped and transposed into tokens,
    then ``LayerNormalization``, self-attention and a residual ``Add``, ``LayerNormalization``
    and a GELU MLP of 4x ``hidden`` and a residual ``Add``."""
    g = _Graph(seed)
    tokens = (size // patch) ** 2
    emb = g.conv("input", 3, hidden, patch, patch, bias=True, pad=0)  # patches do not overlap
    x = g.node("Transpose", [g.reshape(emb, [1, hidden, tokens])], perm=[0, 2, 1])
    x = g.node("Add", [x, g.attention(g.layer_norm(x, hidden), tokens, hidden, heads)])
    h = g.dense(g.gelu(g.dense(g.layer_norm(x, hidden), hidden, 4 * hidden)), 4 * hidden, hidden)
    out = g.node("Add", [x, h])
    return g.model("vit_block", "input", [1, 3, size, size], out)


#: Full-size models by name.
ZOO: dict[str, Callable[[], Any]] = {
    "mobilenet-v2": mobilenet_v2,
    "resnet-18": lambda: resnet(18),
    "resnet-50": lambda: resnet(50),
    "bert-base-layer": bert_layer,
    "inception-block": inception_block,
    "vit-block": vit_block,
    "efficientnet-b0": efficientnet_b0,
}

#: Small versions of the same graphs (tests, the CLI's quick runs). ``mobilenet-v2-small`` is a
#: 3x3 stem, two inverted residual blocks and the head at 56x56.
SMALL: dict[str, Callable[[], Any]] = {
    "mobilenet-v2-small": lambda: mobilenet_v2(
        56, stages=[(1, 16, 1, 1), (6, 24, 2, 2)], stem=16, head=128, classes=10
    ),
    "resnet-18-small": lambda: resnet(18, size=32, width=8, classes=10),
    "resnet-50-small": lambda: resnet(50, size=32, width=8, classes=10),
    "bert-layer-small": lambda: bert_layer(seq=16, hidden=32, heads=2),
    "inception-block-small": lambda: inception_block(size=9, cin=16, width=8),
    "vit-block-small": lambda: vit_block(size=32, patch=8, hidden=32, heads=2),
    "efficientnet-b0-small": lambda: efficientnet_b0(
        32, stages=[(1, 16, 1, 1, 3), (6, 32, 2, 2, 5)], stem=16, head=64, classes=10
    ),
}


def build(name: str) -> Any:
    """The zoo model called ``name`` (a key of :data:`ZOO` or :data:`SMALL`) as an
    ``onnx.ModelProto``."""
    builder = ZOO.get(name) or SMALL.get(name)
    if builder is None:
        raise UnsupportedWorkload(f"unknown zoo model {name!r}; models: {', '.join([*ZOO, *SMALL])}")
    return builder()


def load(model: Any) -> Any:
    """An ONNX model (a ``ModelProto``, or a zoo name) imported by TVM's ONNX frontend as a Relax
    IRModule, its weights as constants."""
    from tvm.relax.frontend.onnx import from_onnx

    if isinstance(model, str):
        model = build(model)
    return from_onnx(model, keep_params_in_input=False)


def model_input(model: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs in [-1, 1) for every graph input of ``model`` (static shapes)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.uniform(-1, 1, dims).astype("float32")
    return feeds


def reference_outputs(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX's reference evaluator's outputs of ``model`` on ``feeds``."""
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]


def stage_cuts(model: Any) -> list[str]:
    """Where to cut ``model`` to time it stage by stage: the last residual ``Add`` at each image
    size (else the last of its tensors with the fewest channels, so that returning it costs
    little), in order, then the model's output."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    narrowest: dict[tuple[int, int], tuple[int, str]] = {}
    last_add: dict[tuple[int, int], str] = {}
    for node in inferred.graph.node:
        shape = shapes.get(node.output[0])
        if shape is None or len(shape) != 4:
            continue
        size = (shape[2], shape[3])
        if size not in narrowest or shape[1] <= narrowest[size][0]:
            narrowest[size] = (shape[1], node.output[0])
        if node.op_type == "Add":
            last_add[size] = node.output[0]
    cuts = [last_add.get(size, name) for size, (_, name) in narrowest.items()]
    return cuts + [inferred.graph.output[0].name]


def prefix(model: Any, cut: str) -> Any:
    """``model`` up to tensor ``cut``, which becomes its one output (``model`` itself when
    ``cut`` is its output)."""
    onnx = _onnx()
    from onnx import shape_inference

    if cut == model.graph.output[0].name:
        return model
    inferred = shape_inference.infer_shapes(model)
    weights = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in weights]
    return onnx.utils.Extractor(inferred).extract_model(inputs, [cut])
