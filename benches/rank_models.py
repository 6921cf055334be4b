"""How well fastsearch's cost models rank measured candidates, per workload and on held-out tasks.

Draws candidates from fastsearch's sketches for each workload, builds and times each one on
this machine, then reports the pairwise ranking accuracy (share of candidate pairs ordered as
measured) and whether the best measured is among the top-8 predicted, for:

* the analytical cold-start model (no training at all);
* XGBoost on sketch features trained on the *other* workloads (leave one workload out).

Records are appended to ``--records`` (JSON lines) and reused on the next run.

    python -m benches.rank_models --per-workload 48 GMM:2 C2D:1 CBR:1 C1D:2 --out rank.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import tvm
import xgboost as xgb
from fastsearch import _core
from fastsearch.costmodel.learned import CostModel, pairwise_accuracy
from fastsearch.ir.machine import fma_per_cycle, num_cores, vector_bytes
from fastsearch.ir.target import resolve_target
from fastsearch.ir.tir_import import program_json
from fastsearch.search.sample import Postprocessor, replay
from tvm.s_tir.meta_schedule.testing import te_workload


def measure(func, target, keys: list[str]) -> list[float]:
    post = Postprocessor(func, target)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    args = [
        tvm.runtime.tensor(rng.random([int(d) for d in p.shape]).astype(str(p.dtype)), dev)
        for p in func.params
    ]
    out = []
    for key in keys:
        sch = replay(func, key, post)
        try:
            lib = tvm.compile(sch.mod, target=target).jit()
            out.append(lib.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=30)(*args).min)
        except (tvm.TVMError, RuntimeError, ValueError):  # a candidate that fails to build or run ranks last
            out.append(float("inf"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="+", help="FAMILY:INDEX of te_workload")
    ap.add_argument("--per-workload", type=int, default=48)
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--records", default="rank_records.jsonl")
    ap.add_argument("--out", default=None, help="write the table as markdown here")
    args = ap.parse_args()
    target = resolve_target(None)
    cores, vbytes, fmas = num_cores(target), vector_bytes(target), fma_per_cycle(target)
    records = Path(args.records)
    have: dict[str, list[dict]] = {}
    if records.exists():
        for line in records.read_text().splitlines():
            r = json.loads(line)
            have.setdefault(r["w"], []).append(r)
    data = {}
    for w in args.workloads:
        family, idx = w.split(":")
        func = te_workload.create_te_workload(family, int(idx))
        doc = program_json(func)
        rs = have.get(w, [])
        missing = args.per_workload - len(rs)
        if missing > 0:
            pairs = _core.Program(doc).sample_genomes(
                _core.Target(cores, vector_bytes=vbytes),
                args.per_workload,
                args.seed,
                exclude=[r["key"] for r in rs],
            )
            pairs = pairs[:missing]
            lat = measure(func, target, [k for k, _ in pairs])
            with records.open("a") as f:
                for (k, g), t in zip(pairs, lat):
                    r = {"w": w, "key": k, "genome": g, "lat": t}
                    f.write(json.dumps(r) + "\n")
                    rs.append(r)
        genomes = [r["genome"] for r in rs]
        lat = np.array([r["lat"] for r in rs])
        rows = _core.Program(doc).sketch_feature_rows(
            _core.Target(cores, vector_bytes=vbytes, fma_per_cycle=fmas), genomes
        )
        analytical = np.array(
            _core.Program(doc).analytical_scores(
                _core.Target(cores, vector_bytes=vbytes, fma_per_cycle=fmas), genomes
            )
        )
        data[w] = (rows, lat, analytical)

    lines = [
        (
            "| workload | candidates | best us | median us | analytical pairwise | best in analytical top-8 "
            "| XGBoost (other workloads) pairwise | best in XGBoost top-8 |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for w, (rows, lat, analytical) in data.items():
        valid = np.isfinite(lat)
        others = [x for x in data if x != w]
        xgb_pw, xgb_top = float("nan"), "-"
        if others:
            model = CostModel()
            x = np.concatenate([data[o][0] for o in others])
            y = np.concatenate([CostModel.labels(data[o][1]) for o in others])
            model.booster = xgb.train(model.params, xgb.DMatrix(x, label=y), model.rounds)
            pred = model.predict(rows)
            xgb_pw = pairwise_accuracy(pred, lat)
            xgb_top = "yes" if lat[np.argsort(-pred)[:8]].min() == lat[valid].min() else "no"
        an_top = "yes" if lat[np.argsort(-analytical)[:8]].min() == lat[valid].min() else "no"
        lines.append(
            f"| {w} | {len(lat)} | {lat[valid].min() * 1e6:.0f} | {np.median(lat[valid]) * 1e6:.0f} "
            f"| {pairwise_accuracy(analytical, lat):.3f} | {an_top} | {xgb_pw:.3f} | {xgb_top} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
