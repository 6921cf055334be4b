"""Winograd convolution for channel-blocked 3x3 stride-1 convolutions on CPU.

A 3x3 convolution computed as Winograd's F(m x m, 3 x 3) multiplies ``(m + 2)^2`` values for
each ``m x m`` output tile and input channel, where the direct one multiplies ``9 m^2``: 2.25x
fewer multiplications for ``m = 2``, 4x for ``m = 4``. The work becomes three kernels, each of
which fastsearch tunes like any other:

1. the input transform ``V = B^T d B`` of each ``(m + 2) x (m + 2)`` input tile (padding
   included), in two separable passes of ``m + 2`` terms, vectorized along the channel block;
2. ``(m + 2)^2`` independent matrix products ``M[e] = V[e] U[e]``, over input channels;
3. the output transform ``Y = A^T M A``, again in two passes, writing ``NCHW{b}c``; the
   convolution's epilogue (bias, residual add, activation) fuses into it.

The weights' transform ``U = G g G^T`` is done here, once, in float64. The transforms' matrices
come from Cook-Toom interpolation at the points 0, 1, -1, 2, -2 (and infinity), computed
exactly; with ``m = 4`` a convolution's output differs from the direct one's by about 1e-6 of
its magnitude in float32.

The rewrite pays where activations are large against the weights: it writes ``(m + 2)^2 / m^2``
times the input as transformed tiles, and its transformed weights are ``(m + 2)^2 / 9`` times the
kernel's (4x for ``m = 4``). So it is applied to convolutions whose output has at least
:data:`MIN_WINOGRAD_PIXELS` pixels: the stages at 56x56, 28x28 and 14x14 of ImageNet CNNs, not
the 7x7 stage, whose 512x512 kernels would become 38 MB read from memory on every inference.
In ResNet-18 (Zen 5, kernels on both cores, 1,000 trials) the 14x14 stage's product over
channels took 224 us timed with its 9.4 MB of weights cold, against 435-489 us for the direct
convolution.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import tvm
from tvm import relax, te

from fastsearch.graph.layout import blocked_layout
from fastsearch.ir.relax_expr import constant_array, mutate_relax_functions, static_shape

__all__ = [
    "MIN_WINOGRAD_PIXELS",
    "WINOGRAD_TILE",
    "transform_matrices",
    "winograd_convolutions",
]

#: ``m`` of F(m x m, 3 x 3): the output tile's side.
WINOGRAD_TILE = 4

#: Convolutions with fewer output pixels than this stay direct (see the module's docstring).
MIN_WINOGRAD_PIXELS = 14 * 14

#: ``op_pattern`` of an output-elementwise-fusable PrimFunc (TVM's ``kOutEWiseFusable``), so the
#: convolution's epilogue fuses into the output transform.
_OUT_EWISE_FUSABLE = 4


def transform_matrices(m: int, r: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(A^T, G, B^T)`` of Winograd's F(m, r), exact (Cook-Toom at 0, 1, -1, 2, -2, 1/2, -1/2
    and infinity), as float64 arrays of shapes ``(m, a)``, ``(a, r)`` and ``(a, a)``, ``a = m + r
    - 1``; ``y = A^T [(G g) * (B^T d)]`` is the correlation of ``d`` (``a`` values) with ``g``."""
    points = [
        Fraction(0),
        Fraction(1),
        Fraction(-1),
        Fraction(2),
        Fraction(-2),
        Fraction(1, 2),
        Fraction(-1, 2),
    ]
    a = m + r - 1
    if m < 1 or a - 1 > len(points):
        raise ValueError(f"F({m}, {r}) needs {a - 1} finite points; {len(points)} are known")
    pts = points[: a - 1]

    def poly_without(skip: int | None) -> list[Fraction]:
        # Coefficients (lowest degree first) of prod over points but `skip` of (x - p).
        poly = [Fraction(1)]
        for i, p in enumerate(pts):
            if i == skip:
                continue
            poly = [Fraction(0), *poly]
            for t in range(len(poly) - 1):
                poly[t] -= p * poly[t + 1]
        return poly + [Fraction(0)] * (a - len(poly))

    at = [[p**i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = []
    for j, pj in enumerate(pts):
        den = Fraction(1)
        for k, pk in enumerate(pts):
            if k != j:
                den *= pj - pk
        g.append([pj**k / den for k in range(r)])
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    bt = [poly_without(j) for j in range(len(pts))] + [poly_without(None)]
    return (np.array(at, dtype=np.float64), np.array(g, dtype=np.float64), np.array(bt, dtype=np.float64))


def _tiles(extent: int, m: int) -> int:
    return -(-extent // m)


def _input_transform_te(x: te.Tensor, bt: te.Tensor, m: int) -> te.Tensor:
    """``V[e, u, ty, tx, c, cc]``: tile ``(ty, tx)`` of ``x`` (``NCHW{b}c``, padding 1) times
    ``B^T`` from the left (rows) and ``B`` from the right (columns)."""
    _, cb, h, w, b = (int(d) for d in x.shape)
    a = m + 2
    th, tw = _tiles(h, m), _tiles(w, m)
    padded = te.compute(
        (cb, th * m + 2, tw * m + 2, b),
        lambda c, y, z, cc: te.if_then_else(
            te.all(y >= 1, y <= h, z >= 1, z <= w), x[0, c, y - 1, z - 1, cc], tvm.tirx.const(0.0, x.dtype)
        ),
        name="winograd_pad",
    )
    ri = te.reduce_axis((0, a), name="ri")
    rows = te.compute(
        (a, th, tw, cb, a, b),
        lambda e, ty, tx, c, j, cc: te.sum(bt[e, ri] * padded[c, ty * m + ri, tx * m + j, cc], axis=ri),
        name="winograd_input_rows",
    )
    rj = te.reduce_axis((0, a), name="rj")
    return te.compute(
        (a, a, th, tw, cb, b),
        lambda e, u, ty, tx, c, cc: te.sum(rows[e, ty, tx, c, rj, cc] * bt[u, rj], axis=rj),
        name="winograd_input",
    )


def _batched_product_te(v: te.Tensor, u: te.Tensor) -> te.Tensor:
    """``M[e, v, ty, tx, k] = sum_c V[e, v, ty, tx, c] U[e, v, c, k]``, the channel split in
    chunks and blocks as ``V`` and ``U`` hold it."""
    a, _, th, tw, cb, b = (int(d) for d in v.shape)
    k = int(u.shape[4])
    rc = te.reduce_axis((0, cb), name="rc")
    rb = te.reduce_axis((0, b), name="rb")
    return te.compute(
        (a, a, th, tw, k),
        lambda e, w, ty, tx, o: te.sum(v[e, w, ty, tx, rc, rb] * u[e, w, rc, rb, o], axis=[rc, rb]),
        name="winograd_product",
    )


def _output_transform_te(mt: te.Tensor, at: te.Tensor, m: int, h: int, w: int, b: int) -> te.Tensor:
    """``Y`` in ``NCHW{b}c``: ``A^T M A`` of each tile, cropped to ``h x w``."""
    a, _, th, tw, k = (int(d) for d in mt.shape)
    re = te.reduce_axis((0, a), name="re")
    rows = te.compute(
        (m, a, th, tw, k),
        lambda i, u, ty, tx, o: te.sum(at[i, re] * mt[re, u, ty, tx, o], axis=re),
        name="winograd_output_rows",
    )
    ru = te.reduce_axis((0, a), name="ru")
    tiled = te.compute(
        (k // b, th, m, tw, m, b),
        lambda kb, ty, i, tx, j, kk: te.sum(rows[i, ru, ty, tx, kb * b + kk] * at[j, ru], axis=ru),
        name="winograd_output_tiles",
    )
    return te.compute(
        (1, k // b, h, w, b),
        lambda n, kb, y, z, kk: tiled[kb, y // m, y % m, z // m, z % m, kk],
        name="winograd_output",
    )


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


def _eligible_kernel(call: relax.Call, min_pixels: int) -> np.ndarray | None:
    """The kernel (``OIHW{bi}i{bo}o``) of a float32 3x3 stride-1 pad-1 dense convolution of one
    image, blocked in and out, with a constant kernel and at least ``min_pixels`` output pixels;
    ``None`` for any other call."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
        return None
    attrs = call.attrs
    bi, bo = blocked_layout(str(attrs.data_layout)), blocked_layout(str(attrs.out_layout))
    if bi is None or bo is None or str(attrs.kernel_layout) != f"OIHW{bi}i{bo}o" or int(attrs.groups) != 1:
        return None
    if (
        _ints(attrs.strides) != [1, 1]
        or _ints(attrs.dilation) != [1, 1]
        or _ints(attrs.padding) != [1, 1, 1, 1]
    ):
        return None
    data, kernel = call.args
    shape = static_shape(data)
    if shape is None or len(shape) != 5:
        return None
    n, _, h, w, _ = shape
    weights = constant_array(kernel)
    if weights is None or n != 1 or weights.shape[2:4] != (3, 3) or data.ty.dtype != "float32":
        return None
    return weights if h * w >= min_pixels else None


@relax.expr_functor.mutator
class _Winograd(relax.PyExprMutator):  # type: ignore[misc]
    """Replaces each eligible ``conv2d`` with the three ``call_te`` kernels of F(m x m, 3 x 3)."""

    def __init__(self, mod: tvm.IRModule, m: int, min_pixels: int) -> None:
        super().__init__(mod)
        self.m = m
        self.min_pixels = min_pixels
        self.rewritten = 0
        at, self.g, bt = transform_matrices(m)
        self.at = relax.const(at.astype("float32"))
        self.bt = relax.const(bt.astype("float32"))

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        kernel = _eligible_kernel(call, self.min_pixels)
        if kernel is None:
            return call
        data = call.args[0]
        shape = static_shape(data)
        assert shape is not None  # eligible: a static 5-D shape
        _, _, h, w, _ = shape
        weights = kernel.astype(np.float64)  # (K/bo, C/bi, 3, 3, bi, bo)
        ko, _, _, _, _, bo = weights.shape
        # U[e, u, c, b, k] = (G g G^T)[e, u] of input channel c * bi + b and output channel k.
        u = np.einsum("ei,kcijbo,uj->eucbko", self.g, weights, self.g)
        u = u.reshape(*u.shape[:4], ko * bo).astype("float32")
        bb = self.builder_
        v = bb.emit(
            bb.call_te(_input_transform_te, data, self.bt, self.m, primfunc_name_hint="winograd_input")
        )
        mt = bb.emit(
            bb.call_te(_batched_product_te, v, relax.const(u), primfunc_name_hint="winograd_product")
        )
        self.rewritten += 1
        return bb.call_te(
            _output_transform_te,
            mt,
            self.at,
            self.m,
            h,
            w,
            bo,
            primfunc_name_hint="winograd_output",
            primfunc_attrs={"op_pattern": _OUT_EWISE_FUSABLE},
        )


def winograd_convolutions(
    mod: tvm.IRModule, m: int = WINOGRAD_TILE, min_pixels: int | None = None
) -> tuple[tvm.IRModule, int]:
    """``mod`` (a Relax model in ``NCHW{b}c``, after :func:`fastsearch.graph.layout.block_channels`)
    with each eligible 3x3 stride-1 convolution computed as Winograd's F(m x m, 3 x 3), and how
    many were rewritten. Eligible: float32, one image, padding 1, no groups or dilation, a
    constant kernel, and at least ``min_pixels`` (default :data:`MIN_WINOGRAD_PIXELS`) output
    pixels."""
    mutator = _Winograd(mod, m, MIN_WINOGRAD_PIXELS if min_pixels is None else min_pixels)
    rewritten = mutate_relax_functions(mutator, mod)
    return (rewritten, mutator.rewritten) if mutator.rewritten else (mod, 0)
