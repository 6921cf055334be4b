"""Small Relax models built in code (random weights, batch 1), for trying ``fastsearch tune`` on a
whole model without a model file, and for tests. ``MODELS`` maps each name to a builder.

``resnet-tiny`` and ``mlp-tiny`` are deliberately tiny (tuning one takes a minute on a laptop)
and repeat identical layers, so the task deduplication shows: ``resnet-tiny`` has two identical
basic blocks, ``mlp-tiny`` three identical hidden layers. ``resnet-18`` is the real network at
224x224 (random weights), the end-to-end benchmark's model; ``bert-layer`` one BERT encoder layer
(sequence 128, hidden 256), whose attention moves data between layouts with transposes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from fastsearch.errors import UnsupportedWorkload

__all__ = ["MODELS", "bert_layer", "load_model", "mlp", "resnet18", "resnet_tiny"]


def _weight(rng: np.random.Generator, *shape: int) -> relax.Expr:
    return relax.const((rng.standard_normal(shape) * 0.1).astype("float32"))


def resnet_tiny(channels: int = 8, size: int = 16, blocks: int = 2, seed: int = 0) -> tvm.IRModule:
    """A stem convolution, ``blocks`` identical residual basic blocks (conv-relu-conv + skip,
    relu), global average pooling and a dense classifier of 10 classes."""
    rng = np.random.default_rng(seed)
    data = relax.Var("data", relax.TensorType((1, 3, size, size), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [data]):
        with bb.dataflow():

            def conv(x: relax.Expr, cin: int, relu: bool) -> relax.Expr:
                y = bb.emit(R.nn.conv2d(x, _weight(rng, channels, cin, 3, 3), padding=1))
                y = bb.emit(R.add(y, _weight(rng, 1, channels, 1, 1)))
                return bb.emit(R.nn.relu(y)) if relu else y

            x = conv(data, 3, relu=True)
            for _ in range(blocks):
                y = conv(conv(x, channels, relu=True), channels, relu=False)
                x = bb.emit(R.nn.relu(bb.emit(R.add(y, x))))
            x = bb.emit(R.mean(x, axis=[2, 3]))
            x = bb.emit(R.matmul(x, _weight(rng, channels, 10)))
            out = bb.emit_output(R.add(x, _weight(rng, 10)))
        bb.emit_func_output(out)
    return bb.get()


def resnet18(size: int = 224, classes: int = 1000, seed: int = 0) -> tvm.IRModule:
    """ResNet-18 at batch 1 (He et al. 2016; the torchvision layout): a 7x7 stem convolution of
    stride 2 and max pooling, four stages of two basic blocks (64, 128, 256, 512 channels; the
    first block of stages 2-4 has stride 2 and a 1x1 projection shortcut), global average pooling
    and a dense classifier. Batch norm is folded into each convolution's per-channel bias, as in
    an inference-optimized export."""
    rng = np.random.default_rng(seed)
    data = relax.Var("data", relax.TensorType((1, 3, size, size), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [data]):
        with bb.dataflow():

            def conv(x: relax.Expr, cin: int, cout: int, k: int, stride: int, relu: bool) -> relax.Expr:
                # He initialization keeps activations in range through 18 layers.
                w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype("float32")
                y = bb.emit(R.nn.conv2d(x, relax.const(w), strides=stride, padding=k // 2))
                y = bb.emit(R.add(y, _weight(rng, 1, cout, 1, 1)))
                return bb.emit(R.nn.relu(y)) if relu else y

            x = conv(data, 3, 64, 7, 2, relu=True)
            x = bb.emit(R.nn.max_pool2d(x, pool_size=3, strides=2, padding=1))
            cin = 64
            for stage, width in enumerate([64, 128, 256, 512]):
                for block in range(2):
                    stride = 2 if block == 0 and stage > 0 else 1
                    y = conv(x, cin, width, 3, stride, relu=True)
                    y = conv(y, width, width, 3, 1, relu=False)
                    shortcut = (
                        x if stride == 1 and cin == width else conv(x, cin, width, 1, stride, relu=False)
                    )
                    x = bb.emit(R.nn.relu(bb.emit(R.add(y, shortcut))))
                    cin = width
            x = bb.emit(R.mean(x, axis=[2, 3]))
            x = bb.emit(R.matmul(x, _weight(rng, 512, classes)))
            out = bb.emit_output(R.add(x, _weight(rng, classes)))
        bb.emit_func_output(out)
    return bb.get()


def bert_layer(seq: int = 128, hidden: int = 256, heads: int = 4, seed: int = 0) -> tvm.IRModule:
    """One BERT encoder layer at batch 1 (Devlin et al. 2019): query, key and value projections,
    scaled dot-product attention over ``heads`` heads (reshape and transpose into heads and
    back), the output projection with a residual add and layer norm, then a GELU feed-forward
    layer of 4x ``hidden`` with a residual add and layer norm."""
    rng = np.random.default_rng(seed)
    data = relax.Var("data", relax.TensorType((1, seq, hidden), "float32"))
    head_dim = hidden // heads
    bb = relax.BlockBuilder()
    with bb.function("main", [data]):
        with bb.dataflow():

            def dense(x: relax.Expr, cin: int, cout: int) -> relax.Expr:
                w = (rng.standard_normal((cin, cout)) / np.sqrt(cin)).astype("float32")
                return bb.emit(R.add(bb.emit(R.matmul(x, relax.const(w))), _weight(rng, cout)))

            def split_heads(x: relax.Expr) -> relax.Expr:
                x = bb.emit(R.reshape(x, (1, seq, heads, head_dim)))
                return bb.emit(R.permute_dims(x, [0, 2, 1, 3]))

            def layer_norm(x: relax.Expr) -> relax.Expr:
                gamma = relax.const(np.ones(hidden, "float32"))
                return bb.emit(R.nn.layer_norm(x, gamma, _weight(rng, hidden), axes=[-1]))

            q = split_heads(dense(data, hidden, hidden))
            k = split_heads(dense(data, hidden, hidden))
            v = split_heads(dense(data, hidden, hidden))
            scores = bb.emit(R.matmul(q, bb.emit(R.permute_dims(k, [0, 1, 3, 2]))))
            scores = bb.emit(R.divide(scores, relax.const(float(np.sqrt(head_dim)), "float32")))
            ctx = bb.emit(R.matmul(bb.emit(R.nn.softmax(scores, axis=-1)), v))
            ctx = bb.emit(R.reshape(bb.emit(R.permute_dims(ctx, [0, 2, 1, 3])), (1, seq, hidden)))
            x = layer_norm(bb.emit(R.add(dense(ctx, hidden, hidden), data)))
            h = bb.emit(R.nn.gelu(dense(x, hidden, 4 * hidden)))
            out = bb.emit_output(layer_norm(bb.emit(R.add(dense(h, 4 * hidden, hidden), x))))
        bb.emit_func_output(out)
    return bb.get()


def mlp(features: int = 64, hidden_layers: int = 3, classes: int = 10, seed: int = 0) -> tvm.IRModule:
    """Dense layers with bias and ReLU (``hidden_layers`` identical ones), then a classifier."""
    rng = np.random.default_rng(seed)
    data = relax.Var("data", relax.TensorType((1, features), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [data]):
        with bb.dataflow():
            x: relax.Expr = data
            for _ in range(hidden_layers):
                x = bb.emit(R.matmul(x, _weight(rng, features, features)))
                x = bb.emit(R.nn.relu(bb.emit(R.add(x, _weight(rng, features)))))
            x = bb.emit(R.matmul(x, _weight(rng, features, classes)))
            out = bb.emit_output(R.add(x, _weight(rng, classes)))
        bb.emit_func_output(out)
    return bb.get()


#: Built-in models by name (``fastsearch tune --model NAME``).
MODELS: dict[str, Callable[[], tvm.IRModule]] = {
    "resnet-tiny": resnet_tiny,
    "mlp-tiny": mlp,
    "resnet-18": resnet18,
    "bert-layer": bert_layer,
}


def load_model(name: str) -> tvm.IRModule:
    """The built-in model called ``name``."""
    builder = MODELS.get(name.lower())
    if builder is None:
        raise UnsupportedWorkload(f"unknown model {name!r}; built-in models: {', '.join(MODELS)}")
    return builder()
