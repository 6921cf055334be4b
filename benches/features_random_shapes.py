"""Per-store features, fastsearch's engine vs MetaSchedule's PerStoreFeature, on random shapes.

Every te_workload family is built with a shape drawn at random from a seeded numpy Generator
(``random_workload``): batches 1-3, odd and prime extents (5-31 spatial, channels such as 3, 5,
17, 37, 61 next to 24, 48, 64, 96), kernel sizes 1/3/5/7 where the family allows, strides 1-2,
paddings, groups and dilations. On each shape, candidates from MetaSchedule's own design spaces
(random decisions, TVM's postprocessors) and fastsearch's sketches (``sample_candidates``) are
compared candidate by candidate exactly as ``tests/test_features.py`` does (same rows, values
within 1e-3, a tied buffer pair in either order). Per family: the shape, candidates compared,
equal, not replayed by the engine (with its error), and the first difference of each differing
candidate (row, feature, ours vs TVM), grouped by feature column. Ends with the total
"N of M equal (parity X.XXX)", M counting the candidates the engine replayed. A family's shape
depends only on the seed and the family (``family_rng``); ``--out`` writes every candidate's
record as JSON, or the per-family table as markdown when the name ends in ``.md``.

    python -m benches.features_random_shapes --seed 0 --per-family 40 --kinds both --out random0.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tvm
from fastsearch.costmodel.features import FEATURE_NAMES
from fastsearch.ir.loop_nest import trace_json
from fastsearch.ir.tir_import import program_json
from fastsearch.search.sample import sample_candidates
from tvm import te
from tvm.s_tir.meta_schedule.testing import te_workload

# The comparison itself (TVM's side, ours, the tolerance and tied buffers) is the test's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_features import (
    FAMILIES,
    TOLERANCE,
    space_candidates,
    target,
    tune_context,
    tvm_features,
    untied,
)
from test_features import ours_per_candidate as ours_features

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
        ch = (3, 5, 8, 16, 17, 24, 32)
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


def candidates(func: tvm.tirx.PrimFunc, kind: str, n: int, seed: int) -> list:
    if kind == "space":
        return space_candidates(func, n)
    return [c.schedule for c in sample_candidates(func, target(), n, seed=seed)]


def compare_candidates(func: tvm.tirx.PrimFunc, schs: list) -> list[dict]:
    """One record per candidate: ``equal``, or ``error`` (not replayed by the engine), or
    ``diff``: the first difference (row, column, feature, ours, TVM, values differing) and
    ``columns``, every feature that differs in some row."""
    theirs = tvm_features(tune_context(func), func, schs)
    ours = ours_features(program_json(func), [trace_json(s.trace) for s in schs])
    names = [str(b.name) for b in func.params]
    same_names = len(names) != len(set(names))
    out: list[dict] = []
    for o, t in zip(ours, theirs):
        if isinstance(o, str):
            out.append({"error": o})
            continue
        if o.shape != t.shape:
            diff = {"feature": "rows", "column": -1, "row": -1, "ours": o.shape[0], "tvm": t.shape[0], "n": 0}
            out.append({"diff": diff, "columns": ["rows"]})
            continue
        o = untied(o, t, same_names)
        bad = np.argwhere(np.abs(o - t) > TOLERANCE)
        if len(bad) == 0:
            out.append({"equal": True})
            continue
        r, c = (int(x) for x in bad[0])
        diff = {
            "feature": FEATURE_NAMES[c],
            "column": c,
            "row": r,
            "ours": round(float(o[r, c]), 4),
            "tvm": round(float(t[r, c]), 4),
            "n": len(bad),
        }
        out.append({"diff": diff, "columns": [FEATURE_NAMES[i] for i in sorted({int(x) for x in bad[:, 1]})]})
    return out


def run_family(family: str, rng: np.random.Generator, kinds: list[str], per_family: int, seed: int) -> dict:
    func, desc = random_workload(family, rng)
    result: dict = {"family": family, "shape": desc, "kinds": {}}
    for kind in kinds:
        t0 = time.perf_counter()
        try:
            schs = candidates(func, kind, per_family, seed)
            records = compare_candidates(func, schs) if schs else []
            failed = None
        except Exception as e:  # noqa: BLE001  (TVM raises tvm.error.*, ValueError, RuntimeError)
            records, failed = [], f"{type(e).__name__}: {e}".splitlines()[0]
        result["kinds"][kind] = {
            "records": records,
            "failed": failed,
            "seconds": round(time.perf_counter() - t0, 1),
        }
    return result


def summarize(result: dict) -> dict:
    recs = [(kind, i, r) for kind, k in result["kinds"].items() for i, r in enumerate(k["records"])]
    return {
        "candidates": len(recs),
        "compared": sum("error" not in r for _, _, r in recs),
        "equal": sum("equal" in r for _, _, r in recs),
        "not_replayed": sum("error" in r for _, _, r in recs),
    }


def report(result: dict) -> None:
    """The family's shape and counts; then the differing candidates grouped by the feature of
    their first difference (candidates with the same row and values on one line), the features
    that differ anywhere, and the engine's errors."""
    s = summarize(result)
    per_kind = ", ".join(
        f"{kind} {sum('equal' in r for r in k['records'])}/{sum('error' not in r for r in k['records'])}"
        f" in {k['seconds']}s" + (f" FAILED {k['failed']}" if k["failed"] else "")
        for kind, k in result["kinds"].items()
    )
    print(
        f"\n{result['family']}  {result['shape']}\n  {s['compared']} compared, {s['equal']} equal, "
        f"{s['not_replayed']} not replayed  ({per_kind})"
    )
    by_column: dict[str, dict[tuple, list[str]]] = defaultdict(lambda: defaultdict(list))
    anywhere: dict[str, int] = defaultdict(int)
    errors: dict[str, list[str]] = defaultdict(list)
    for kind, k in result["kinds"].items():
        for i, r in enumerate(k["records"]):
            if "error" in r:
                errors[r["error"]].append(f"{kind}#{i}")
            elif "diff" in r:
                d = r["diff"]
                by_column[d["feature"]][(d["row"], d["ours"], d["tvm"], d["n"])].append(f"{kind}#{i}")
                for c in r["columns"]:
                    anywhere[c] += 1
    for feature, groups in sorted(by_column.items(), key=lambda kv: -sum(map(len, kv[1].values()))):
        print(f"  first difference in {feature}: {sum(map(len, groups.values()))} candidates")
        for (row, ours, theirs, n), where in groups.items():
            print(f"    row {row}: ours {ours:.4f} vs TVM {theirs:.4f} ({n} values): {' '.join(where)}")
    if anywhere:
        cols = ", ".join(f"{c} ({n})" for c, n in sorted(anywhere.items(), key=lambda kv: -kv[1]))
        print(f"  features differing in any row (candidates): {cols}")
    for error, where in errors.items():
        print(f"  not replayed ({len(where)}: {' '.join(where)}): {error}")


def markdown(results: list[dict], seed: int) -> str:
    lines = [
        f"# Per-store features vs PerStoreFeature, random shapes (seed {seed})",
        "",
        "| family | shape | compared | equal | not replayed | first differing features |",
        "|---|---|---:|---:|---:|---|",
    ]
    for res in results:
        s = summarize(res)
        cols: dict[str, int] = defaultdict(int)
        for k in res["kinds"].values():
            for r in k["records"]:
                if "diff" in r:
                    cols[r["diff"]["feature"]] += 1
        feats = ", ".join(f"{c} ({n})" for c, n in sorted(cols.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"| {res['family']} | `{res['shape']}` | {s['compared']} | {s['equal']} | {s['not_replayed']} | {feats} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-family", type=int, default=40, help="candidates per family and kind")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--kinds", choices=("space", "sketch", "both"), default="both")
    ap.add_argument("--out", help="write the results as JSON (.json) or a markdown table (.md)")
    args = ap.parse_args()
    kinds = ["space", "sketch"] if args.kinds == "both" else [args.kinds]
    results = []
    for family in args.families.split(","):
        res = run_family(family, family_rng(args.seed, family), kinds, args.per_family, args.seed)
        report(res)
        results.append(res)
    total = {k: sum(summarize(r)[k] for r in results) for k in ("compared", "equal", "not_replayed")}
    print("\n" + markdown(results, args.seed))
    parity = total["equal"] / total["compared"] if total["compared"] else 0.0
    print(
        f"{total['equal']} of {total['compared']} equal (parity {parity:.3f}); "
        f"{total['not_replayed']} more not replayed by the engine"
    )
    if args.out:
        out = Path(args.out)
        if out.suffix == ".md":
            out.write_text(markdown(results, args.seed))
        else:
            out.write_text(json.dumps({"seed": args.seed, "results": results, "total": total}, indent=1))


if __name__ == "__main__":
    main()
