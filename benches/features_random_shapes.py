"""Per-store features, fastsearch's engine vs MetaSchedule's PerStoreFeature, on random shapes.

Every te_workload family is built with a shape drawn at random from a seeded numpy Generator
(``random_workload``): batches 1-3, odd and prime extents (5-31 spatial, channels such as 3, 5,
17, 37, 61 next to 24, 48, 64, 96), kernel sizes 1/3/5/7 where the family allows, strides 1-2,
paddings, groups and dilations. On each shape, candidates from MetaSchedule's own design spaces
(random decisions, TVM's postprocessors) and fastsearch's sketches (``sample_candidates``) are
compared candidate by candidate as ``tests/test_features.py`` compares them (same rows, values
within 1e-3, a tied buffer pair in either order; ``fastsearch.costmodel.feature_parity``). Per family: the shape, candidates compared,
equal, not replayed by the engine (with its error), and the first difference of each differing
candidate (row, feature, ours vs TVM), grouped by feature column. Ends with the total
"N of M equal (parity X.XXX)", M counting the candidates the engine replayed. A family's shape
depends only on the seed and the family (``family_rng``); ``--out`` writes every candidate's
record as JSON, or the per-family table as markdown when the name ends in ``.md``.

    python -m benches.features_random_shapes --seed 0 --per-family 40 --kinds both --out random0.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import tvm
from fastsearch.costmodel.feature_parity import (
    FAMILIES,
    family_rng,
    feature_difference,
    feature_target,
    ours_per_candidate,
    random_workload,
    space_candidates,
    tune_context,
    tvm_features,
)
from fastsearch.ir.loop_nest import trace_json
from fastsearch.ir.tir_import import program_json
from fastsearch.search.sample import sample_candidates


def candidates(func: tvm.tirx.PrimFunc, kind: str, n: int, seed: int) -> list:
    if kind == "space":
        return space_candidates(func, n)
    return [c.schedule for c in sample_candidates(func, feature_target(), n, seed=seed)]


def compare_candidates(func: tvm.tirx.PrimFunc, schs: list) -> list[dict]:
    """One record per candidate: ``equal``, or ``error`` (not replayed by the engine), or
    ``diff``: the first difference (row, column, feature, ours, TVM, values differing) and
    ``columns``, every feature that differs in some row."""
    theirs = tvm_features(tune_context(func), func, schs)
    ours = ours_per_candidate(program_json(func), [trace_json(s.trace) for s in schs])
    names = [str(b.name) for b in func.params]
    same_names = len(names) != len(set(names))
    out: list[dict] = []
    for o, t in zip(ours, theirs):
        if isinstance(o, str):
            out.append({"error": o})
            continue
        d = feature_difference(o, t, same_names)
        if d is None:
            out.append({"equal": True})
            continue
        diff = {
            "feature": d.feature,
            "column": d.column,
            "row": d.row,
            "ours": round(d.ours, 4),
            "tvm": round(d.tvm, 4),
            "n": d.count,
        }
        out.append({"diff": diff, "columns": list(d.columns)})
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
