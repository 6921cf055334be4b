"""Per-store features of fastsearch's engine against TVM's ``PerStoreFeature`` on the same
candidates: what the differential tests (``tests/test_features.py``) and
``benches.features_random_shapes`` share, and the random shapes that bench draws.

Both sides see the same trace: TVM extracts from the scheduled module, the engine replays the
trace JSON. Row counts must be equal, values within :data:`TOLERANCE` (log scale).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

from fastsearch.costmodel.features import FEATURE_NAMES, design_space_candidates, extract_features_each
from fastsearch.errors import FastsearchError
from fastsearch.ir.tune_context import tune_context as bare_tune_context

__all__ = [
    "BUFFER0",
    "FAMILIES",
    "TOLERANCE",
    "Difference",
    "family_rng",
    "feature_difference",
    "feature_target",
    "ours_per_candidate",
    "random_workload",
    "space_candidates",
    "tune_context",
    "tvm_features",
    "untied",
]

FAMILIES = ["C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG"]
TOLERANCE = 1e-3
# Column of the first buffer-access feature.
BUFFER0 = 57


def feature_target() -> tvm.target.Target:
    """This CPU with 2 cores: the target both sides extract for."""
    return tvm.target.Target(
        {"kind": "llvm", "num-cores": 2, "mcpu": tvm.target.codegen.llvm_get_system_cpu()}
    )


def tune_context(func: tvm.tirx.PrimFunc) -> ms.TuneContext:
    # PerStoreFeature needs no space generator and no tensor intrinsic (TuneContext's own
    # constructor imports them all: 35 s the first time on a 2-vCPU host).
    return bare_tune_context(func, feature_target())


def space_candidates(func: tvm.tirx.PrimFunc, n: int) -> list[tvm.s_tir.Schedule]:
    """``n`` MetaSchedule design-space candidates with random decisions, postprocessed by TVM."""
    return design_space_candidates(func, feature_target(), n)


def tvm_features(ctx: ms.TuneContext, func: tvm.tirx.PrimFunc, schs: list) -> list[np.ndarray]:
    """TVM's ``PerStoreFeature`` of each scheduled candidate."""
    args = ms.arg_info.ArgInfo.from_prim_func(func)
    cands = [ms.MeasureCandidate(s, args) for s in schs]
    return [t.numpy() for t in ms.feature_extractor.PerStoreFeature().extract_from(ctx, cands)]


def ours_per_candidate(program: str, texts: list[str]) -> list[np.ndarray | str]:
    """Our features, or the engine's error (as text) for a candidate it cannot replay."""
    return [
        f"{type(x).__name__}: {x}" if isinstance(x, FastsearchError) else x
        for x in extract_features_each(program, texts)
    ]


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all(np.abs(a - b) <= TOLERANCE))


def untied(ours: np.ndarray, theirs: np.ndarray, same_names: bool) -> np.ndarray:
    """``ours`` (same shape as ``theirs``) with tied buffer pairs put in TVM's order.

    PerStoreFeature orders a store's buffers by lines, then bytes, then name; two buffers equal
    on all three (possible only when the function has two buffers of the same name, as DEP's
    two ``placeholder``) come in its hash map's order, which follows memory addresses. With
    ``same_names``, such a tied pair may come in either order."""
    ours = ours.copy()
    if same_names:
        for r in range(len(ours)):
            for b in range(4):
                x = slice(BUFFER0 + 18 * b, BUFFER0 + 18 * (b + 1))
                y = slice(BUFFER0 + 18 * (b + 1), BUFFER0 + 18 * (b + 2))
                tied = ours[r, x][3] == ours[r, y][3] and ours[r, x][5] == ours[r, y][5]
                p, q = ours[r, x].copy(), ours[r, y].copy()
                if tied and _close(p, theirs[r, y]) and _close(q, theirs[r, x]):
                    ours[r, x], ours[r, y] = q, p
    return ours


@dataclass(frozen=True)
class Difference:
    """Where two feature matrices first differ: ``row`` and ``column`` (``-1`` when the row
    counts differ, ``ours`` and ``tvm`` then being the counts), the values, how many values
    differ, and every feature that differs in some row."""

    row: int
    column: int
    ours: float
    tvm: float
    count: int
    columns: tuple[str, ...]

    @property
    def feature(self) -> str:
        return FEATURE_NAMES[self.column] if self.column >= 0 else "rows"


def feature_difference(ours: np.ndarray, theirs: np.ndarray, same_names: bool) -> Difference | None:
    """None when equal within :data:`TOLERANCE` (a tied buffer pair in either order, see
    :func:`untied`); otherwise the first difference."""
    if ours.shape != theirs.shape:
        return Difference(-1, -1, float(ours.shape[0]), float(theirs.shape[0]), 0, ("rows",))
    ours = untied(ours, theirs, same_names)
    bad = np.argwhere(np.abs(ours - theirs) > TOLERANCE)
    if len(bad) == 0:
        return None
    r, c = (int(x) for x in bad[0])
    columns = tuple(FEATURE_NAMES[i] for i in sorted({int(x) for x in bad[:, 1]}))
    return Difference(r, c, float(ours[r, c]), float(theirs[r, c]), len(bad), columns)


# Random shapes --------------------------------------------------------------------------------

SPATIAL = (5, 6, 7, 9, 11, 12, 13, 14, 15, 16, 17, 19, 21, 23, 25, 28, 29, 31)
CHANNELS = (3, 5, 8, 16, 17, 24, 32, 37, 48, 61, 64, 96)
KERNELS = (1, 3, 5, 7)
# Matrix and reduction extents.
EXTENTS = (5, 7, 12, 13, 16, 17, 24, 29, 31, 37, 48, 61, 64, 96, 97, 127, 128)


def _pick(rng: np.random.Generator, values: Sequence[int]) -> int:
    return int(values[int(rng.integers(len(values)))])


def _batch(rng: np.random.Generator) -> int:
    return int(rng.integers(1, 4))


def _window(
    rng: np.random.Generator, size: int, kernels: Sequence[int] = KERNELS, dilation: int = 1
) -> tuple[int, int, int]:
    """Kernel, stride and padding for an input extent ``size`` (the smallest spatial one)."""
    k = _pick(rng, [k for k in kernels if dilation * (k - 1) + 1 <= size])
    return k, int(rng.integers(1, 3)), int(rng.integers(0, k // 2 + 1))


def _draw(family: str, rng: np.random.Generator) -> tuple:
    """The builder's positional arguments for ``family`` (te_workload.CONFIGS' layout)."""
    if family == "C1D":  # N, L, CI, CO, kernel, stride, padding
        n, length = _batch(rng), _pick(rng, (*SPATIAL, 37, 49, 61, 64))
        return (n, length, _pick(rng, CHANNELS), _pick(rng, CHANNELS), *_window(rng, length))
    if family in ("C2D", "CBR"):  # N, H, W, CI, CO, kernel, stride, padding
        n, h, w = _batch(rng), _pick(rng, SPATIAL), _pick(rng, SPATIAL)
        return (n, h, w, _pick(rng, CHANNELS), _pick(rng, CHANNELS), *_window(rng, min(h, w)))
    if family == "C3D":  # N, D, H, W, CI, CO, kernel, stride, padding
        n, d = int(rng.integers(1, 3)), _pick(rng, (3, 4, 5, 7, 8))
        h, w = _pick(rng, (5, 7, 8, 9, 11, 13)), _pick(rng, (5, 7, 8, 9, 11, 13))
        ch: tuple[int, ...] = (3, 5, 8, 16, 17, 24, 32)
        return (n, d, h, w, _pick(rng, ch), _pick(rng, ch), *_window(rng, min(d, h, w), (1, 3, 5)))
    if family == "GMM":  # B, N, M, K
        return (_batch(rng), _pick(rng, EXTENTS), _pick(rng, EXTENTS), _pick(rng, EXTENTS))
    if family == "GRP":  # N, H, W, CI, CO, kernel, stride, padding, dilation, groups
        g = _pick(rng, (2, 3, 4))
        per = (1, 2, 3, 5, 8, 16)
        n, h, w = _batch(rng), _pick(rng, SPATIAL), _pick(rng, SPATIAL)
        return (n, h, w, g * _pick(rng, per), g * _pick(rng, per), *_window(rng, min(h, w)), 1, g)
    if family == "DIL":  # N, H, W, CI, CO, kernel, stride, padding, dilation
        n, h, w = _batch(rng), _pick(rng, SPATIAL), _pick(rng, SPATIAL)
        dil = _pick(rng, (2, 3)) if min(h, w) >= 7 else 2  # a 3-wide kernel dilated by 3 spans 7
        window = _window(rng, min(h, w), (3, 5, 7), dilation=dil)
        return (n, h, w, _pick(rng, CHANNELS), _pick(rng, CHANNELS), *window, dil)
    if family == "DEP":  # N, H, W, C, kernel, stride, padding
        n, h, w = _batch(rng), _pick(rng, SPATIAL), _pick(rng, SPATIAL)
        return (n, h, w, _pick(rng, CHANNELS), *_window(rng, min(h, w)))
    if family == "T2D":  # N, H, W, CI, CO, kernel, stride, padding (padding <= kernel - 1)
        n = _batch(rng)
        h, w = _pick(rng, (5, 7, 8, 9, 11, 13, 16)), _pick(rng, (5, 7, 8, 9, 11, 13, 16))
        k = _pick(rng, (2, 3, 4, 5))
        stride, pad = int(rng.integers(1, 3)), int(rng.integers(0, k))
        return (n, h, w, _pick(rng, CHANNELS), _pick(rng, CHANNELS), k, stride, pad)
    if family == "CAP":  # N, H, W, CI, CO, kernel, stride, padding, capsule size
        n = _batch(rng)
        h, w = _pick(rng, (5, 7, 8, 9, 11, 13)), _pick(rng, (5, 7, 8, 9, 11, 13))
        ch = (3, 5, 8, 16, 17, 24)
        return (
            n,
            h,
            w,
            _pick(rng, ch),
            _pick(rng, ch),
            *_window(rng, min(h, w), (1, 3)),
            _pick(rng, (2, 3, 4)),
        )
    if family == "NRM":  # B, M, N
        big = (5, 7, 13, 17, 31, 61, 64, 97, 127, 128, 255, 256, 257)
        return (_batch(rng), _pick(rng, big), _pick(rng, big))
    if family == "SFM":  # M, N
        big = (5, 7, 13, 17, 31, 61, 64, 97, 127, 128, 255, 256, 257)
        return (_pick(rng, big), _pick(rng, big))
    if family == "TBG":  # batch, seq_len, n_head, n_dim
        return (
            _batch(rng),
            _pick(rng, (5, 7, 13, 17, 31, 37, 61, 64, 97, 128)),
            _pick(rng, (1, 2, 3, 5, 7, 12)),
            _pick(rng, (5, 7, 16, 17, 31, 32, 61, 64)),
        )
    raise ValueError(f"no random shapes for family {family!r}")


def random_workload(family: str, rng: np.random.Generator) -> tuple[tvm.tirx.PrimFunc, str]:
    """``family``'s te_workload builder on a random shape: the PrimFunc and a description
    naming each argument, e.g. ``conv2d_nhwc(N=2, H=13, W=29, CI=17, CO=37, kernel_size=3,
    stride=2, padding=1)``."""
    builder = te_workload.CONFIGS[family][0]
    args = _draw(family, rng)
    names = list(inspect.signature(builder).parameters)
    desc = f"{builder.__name__}({', '.join(f'{k}={v}' for k, v in zip(names, args))})"
    return te.create_prim_func(builder(*args)), desc


def family_rng(seed: int, family: str) -> np.random.Generator:
    """The generator of ``family``'s shape for ``seed``: one per family, so that a family's shape
    does not depend on which others are run."""
    return np.random.default_rng([seed, FAMILIES.index(family)])
