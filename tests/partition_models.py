"""Relax models for the partitioner's differential tests, built in code with random weights.

Batch 1 and small spatial sizes: the tests compare fusion groups, which do not depend on sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from fastsearch.testing.onnx_zoo import MOBILENET_V2_STAGES
from tvm import relax
from tvm.relax import op as R

_rng = np.random.default_rng(0)


def _weight(*shape: int) -> relax.Expr:
    return relax.const((_rng.standard_normal(shape) * 0.1).astype("float32"))


def _input(name: str, *shape: int) -> relax.Var:
    return relax.Var(name, relax.TensorType(shape, "float32"))


def _build(inputs: list[relax.Var], body: Callable[[relax.BlockBuilder], relax.Expr]) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    with bb.function("main", inputs):
        with bb.dataflow():
            out = bb.emit_output(body(bb))
        bb.emit_func_output(out)
    return bb.get()


class _Conv:
    """conv2d followed by batch norm, either as the batch_norm op (a tuple and a tuple-get-item
    after legalization) or folded into a per-channel scale and shift (broadcast ops)."""

    def __init__(self, bb: relax.BlockBuilder, bn_op: bool) -> None:
        self.bb = bb
        self.bn_op = bn_op

    def __call__(
        self,
        x: relax.Expr,
        cin: int,
        cout: int,
        k: int,
        stride: int = 1,
        groups: int = 1,
        act: str | None = "relu",
    ) -> relax.Expr:
        bb = self.bb
        y = bb.emit(
            R.nn.conv2d(x, _weight(cout, cin // groups, k, k), strides=stride, padding=k // 2, groups=groups)
        )
        if self.bn_op:
            bn = bb.emit(
                R.nn.batch_norm(
                    y,
                    _weight(cout),
                    _weight(cout),
                    _weight(cout),
                    relax.const(np.ones(cout, "float32")),
                    axis=1,
                    training=False,
                )
            )
            y = bb.emit(relax.TupleGetItem(bn, 0))
        else:
            y = bb.emit(R.multiply(y, _weight(1, cout, 1, 1)))
            y = bb.emit(R.add(y, _weight(1, cout, 1, 1)))
        if act == "relu":
            y = bb.emit(R.nn.relu(y))
        elif act == "relu6":
            y = bb.emit(R.clip(y, 0.0, 6.0))
        return y


def _head(bb: relax.BlockBuilder, x: relax.Expr, channels: int, classes: int) -> relax.Expr:
    x = bb.emit(R.mean(x, axis=[2, 3]))
    x = bb.emit(R.matmul(x, _weight(channels, classes)))
    return bb.emit(R.add(x, _weight(classes)))


def resnet(depth: int, size: int = 32, bn_op: bool = True) -> tvm.IRModule:
    """ResNet-18/34 (basic blocks) or ResNet-50 (bottlenecks), width 1/4, for ImageNet layout."""
    layers = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3]}[depth]
    bottleneck = depth >= 50
    data = _input("data", 1, 3, size, size)

    def body(bb: relax.BlockBuilder) -> relax.Expr:
        conv = _Conv(bb, bn_op)
        x = conv(data, 3, 16, 7, stride=2)
        x = bb.emit(R.nn.max_pool2d(x, pool_size=3, strides=2, padding=1))
        cin = 16
        for stage, blocks in enumerate(layers):
            width = 16 * 2**stage
            cout = width * 4 if bottleneck else width
            for b in range(blocks):
                stride = 2 if b == 0 and stage > 0 else 1
                if bottleneck:
                    y = conv(x, cin, width, 1)
                    y = conv(y, width, width, 3, stride=stride)
                    y = conv(y, width, cout, 1, act=None)
                else:
                    y = conv(x, cin, width, 3, stride=stride)
                    y = conv(y, width, cout, 3, act=None)
                shortcut = x if stride == 1 and cin == cout else conv(x, cin, cout, 1, stride, act=None)
                x = bb.emit(R.nn.relu(bb.emit(R.add(y, shortcut))))
                cin = cout
        return _head(bb, x, cin, 10)

    return _build([data], body)


def mobilenet_v2(size: int = 32) -> tvm.IRModule:
    """MobileNetV2 (width 1/4): inverted residuals with depthwise convolutions and ReLU6."""
    settings = MOBILENET_V2_STAGES
    data = _input("data", 1, 3, size, size)

    def body(bb: relax.BlockBuilder) -> relax.Expr:
        conv = _Conv(bb, bn_op=False)
        x = conv(data, 3, 8, 3, stride=2, act="relu6")
        cin = 8
        for expand, c, n, s in settings:
            cout = c // 4
            for i in range(n):
                stride = s if i == 0 else 1
                hidden = cin * expand
                y = conv(x, cin, hidden, 1, act="relu6") if expand != 1 else x
                y = conv(y, hidden, hidden, 3, stride=stride, groups=hidden, act="relu6")
                y = conv(y, hidden, cout, 1, act=None)
                x = bb.emit(R.add(x, y)) if stride == 1 and cin == cout else y
                cin = cout
        x = conv(x, cin, 320, 1, act="relu6")
        return _head(bb, x, 320, 10)

    return _build([data], body)


def bert_layer(seq: int = 32, hidden: int = 64, heads: int = 4) -> tvm.IRModule:
    """One BERT encoder layer: self-attention, residual, layer norm, GELU feed-forward."""
    data = _input("data", 1, seq, hidden)
    head_dim = hidden // heads

    def body(bb: relax.BlockBuilder) -> relax.Expr:
        def dense(x: relax.Expr, cin: int, cout: int) -> relax.Expr:
            y = bb.emit(R.matmul(x, _weight(cin, cout)))
            return bb.emit(R.add(y, _weight(cout)))

        def split_heads(x: relax.Expr) -> relax.Expr:
            x = bb.emit(R.reshape(x, (1, seq, heads, head_dim)))
            return bb.emit(R.permute_dims(x, [0, 2, 1, 3]))

        def layer_norm(x: relax.Expr) -> relax.Expr:
            return bb.emit(R.nn.layer_norm(x, _weight(hidden), _weight(hidden), axes=[-1]))

        q = split_heads(dense(data, hidden, hidden))
        k = split_heads(dense(data, hidden, hidden))
        v = split_heads(dense(data, hidden, hidden))
        kt = bb.emit(R.permute_dims(k, [0, 1, 3, 2]))
        scores = bb.emit(R.matmul(q, kt))
        scores = bb.emit(R.divide(scores, relax.const(float(np.sqrt(head_dim)), "float32")))
        probs = bb.emit(R.nn.softmax(scores, axis=-1))
        ctx = bb.emit(R.matmul(probs, v))
        ctx = bb.emit(R.permute_dims(ctx, [0, 2, 1, 3]))
        ctx = bb.emit(R.reshape(ctx, (1, seq, hidden)))
        x = layer_norm(bb.emit(R.add(dense(ctx, hidden, hidden), data)))
        h = bb.emit(R.nn.gelu(dense(x, hidden, 4 * hidden)))
        return layer_norm(bb.emit(R.add(dense(h, 4 * hidden, hidden), x)))

    return _build([data], body)


def branches_and_concat() -> tvm.IRModule:
    """An inception-like block: parallel branches, concat, residual add, split, two outputs."""
    data = _input("data", 1, 8, 16, 16)

    def body(bb: relax.BlockBuilder) -> relax.Expr:
        conv = _Conv(bb, bn_op=False)
        stem = conv(data, 8, 8, 3)
        a = conv(stem, 8, 8, 1)
        b = conv(conv(stem, 8, 8, 1), 8, 8, 3)
        c = bb.emit(R.nn.max_pool2d(stem, pool_size=3, strides=1, padding=1))
        d = bb.emit(R.exp(bb.emit(R.nn.relu(stem))))
        cat = bb.emit(R.concat([a, b, c, d], axis=1))
        cat = bb.emit(R.nn.relu(cat))
        res = bb.emit(R.add(cat, R.concat([stem, stem, stem, stem], axis=1)))
        parts = bb.emit(R.split(res, 2, axis=1))
        left = bb.emit(relax.TupleGetItem(parts, 0))
        right = bb.emit(R.sigmoid(bb.emit(relax.TupleGetItem(parts, 1))))
        total = bb.emit(R.sum(bb.emit(R.multiply(left, right)), axis=[1]))
        flat = bb.emit(R.reshape(right, (1, 16 * 16 * 16)))
        return relax.Tuple([total, flat, stem])

    return _build([data], body)


def long_chain(length: int = 300) -> tvm.IRModule:
    """More elementwise ops in a row than FuseOps' maximum fuse depth."""
    data = _input("data", 4, 4)

    def body(bb: relax.BlockBuilder) -> relax.Expr:
        x: relax.Expr = data
        for i in range(length):
            x = bb.emit(R.nn.relu(x) if i % 2 else R.multiply(x, relax.const(0.5, "float32")))
        return x

    return _build([data], body)


def diamonds_and_reductions() -> tvm.IRModule:
    """Diamonds after an anchor, softmax-like reductions, transposes and shared inputs."""
    data = _input("data", 1, 16, 32)

    def body(bb: relax.BlockBuilder) -> relax.Expr:
        m = bb.emit(R.matmul(data, _weight(32, 32)))
        left = bb.emit(R.nn.relu(m))
        right = bb.emit(R.tanh(m))
        joined = bb.emit(R.add(left, right))
        mx = bb.emit(R.max(joined, axis=[-1], keepdims=True))
        ex = bb.emit(R.exp(bb.emit(R.subtract(joined, mx))))
        sm = bb.emit(R.divide(ex, bb.emit(R.sum(ex, axis=[-1], keepdims=True))))
        t = bb.emit(R.permute_dims(sm, [0, 2, 1]))
        both = bb.emit(R.matmul(sm, t))
        side = bb.emit(R.sum(bb.emit(R.permute_dims(joined, [0, 2, 1])), axis=[1]))
        return relax.Tuple([both, side, bb.emit(R.nn.relu(both))])

    return _build([data], body)


MODELS: dict[str, Callable[[], tvm.IRModule]] = {
    "resnet18": lambda: resnet(18),
    "resnet50": lambda: resnet(50, bn_op=False),
    "mobilenet_v2": mobilenet_v2,
    "bert_layer": bert_layer,
    "branches_and_concat": branches_and_concat,
    "long_chain": long_chain,
    "diamonds_and_reductions": diamonds_and_reductions,
}


def random_graph(seed: int, n: int = 30) -> tvm.IRModule:
    """A random DAG of (8, 8) tensors: elementwise, broadcast, injective, reduction, matmul,
    concat + split and several outputs."""
    rng = np.random.default_rng(seed)
    data = _input("data", 8, 8)

    def body(bb: relax.BlockBuilder) -> relax.Expr:
        values: list[relax.Expr] = [data]
        used: set[int] = set()

        def pick() -> relax.Expr:
            # Mostly recent values, sometimes any: chains with skip connections.
            i = len(values) - 1 - int(rng.integers(0, min(len(values), 4)))
            if rng.random() < 0.2:
                i = int(rng.integers(0, len(values)))
            used.add(i)
            return values[i]

        for _ in range(n):
            kind = int(rng.integers(0, 8))
            if kind == 0:
                v = bb.emit(R.nn.relu(pick()))
            elif kind == 1:
                v = bb.emit(R.add(pick(), pick()))
            elif kind == 2:
                v = bb.emit(R.multiply(pick(), _weight(8)))
            elif kind == 3:
                v = bb.emit(R.permute_dims(pick(), [1, 0]))
            elif kind == 4:
                v = bb.emit(R.matmul(pick(), pick()))
            elif kind == 5:
                s = bb.emit(R.sum(pick(), axis=[1], keepdims=True))
                v = bb.emit(R.broadcast_to(s, (8, 8)))
            elif kind == 6:
                cat = bb.emit(R.concat([pick(), pick()], axis=0))
                parts = bb.emit(R.split(cat, 2, axis=0))
                v = bb.emit(relax.TupleGetItem(parts, int(rng.integers(0, 2))))
            else:
                v = bb.emit(R.exp(pick()))
            values.append(v)
        outputs = [v for i, v in enumerate(values[1:], 1) if i not in used or rng.random() < 0.1]
        return relax.Tuple(outputs)

    return _build([data], body)
