"""Ranking on held-out tasks: XGBoost on fastsearch's per-store features vs MetaSchedule's XGBModel.

Records are the measured candidates of ``benches/suite.py`` runs (both tuners' databases, so
the candidates come from both search spaces). For each workload in turn, every model is trained
on the records of the *other* workloads only and ranks the held-out workload's candidates; the
score is pairwise accuracy (the share of pairs of valid candidates ordered as measured) and
whether the measured best is in the model's top 8.

Models, all on the same records:

* MetaSchedule's ``XGBModel`` (PerStoreFeature, its pack-sum objective, default config,
  ``num_warmup_samples=0``), fed one ``update`` per training workload as during tuning;
* fastsearch: XGBoost on ``fastsearch.extract_features`` rows pooled per candidate (sum and
  max over stores), labels = relative throughput per task, with a squared-error objective
  (``fastsearch.costmodel.learned.StoreFeatureModel``, the model of the drop-in
  ``fastsearch.metaschedule.CostModel``) and with a pairwise ranking objective (one query group per task).

    python -m benches.rank_vs_xgbmodel --suite-dir suite64 --out rank_heldout.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import xgboost as xgb
from fastsearch.cli.main import load_workload
from fastsearch.costmodel.features import extract_features
from fastsearch.costmodel.learned import (
    STORE_ROUNDS,
    STORE_XGB_PARAMS,
    CostModel,
    StoreFeatureModel,
    pairwise_accuracy,
    pool_store_features,
)
from fastsearch.ir.target import resolve_target
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

from benches.runs import fastsearch_dir, mean_us, metaschedule_dir, records_in_order

# the ranking variant trains with the regression model's parameters and rounds
XGB_PARAMS = {k: v for k, v in STORE_XGB_PARAMS.items() if k != "objective"}
ROUNDS = STORE_ROUNDS


def top8_has_best(pred: np.ndarray, lat: np.ndarray) -> bool:
    ok = np.isfinite(lat)
    best = int(np.argmin(np.where(ok, lat, np.inf)))
    return best in set(np.argsort(-pred)[:8].tolist())


def load_tasks(suite_dir: Path) -> dict[str, dict[str, Any]]:
    """workload -> {func, traces, latencies (s)} over every run's two databases."""
    tasks: dict[str, dict[str, Any]] = {}
    for path in sorted(suite_dir.glob("run_*.json")):
        run = json.loads(path.read_text())
        wl = run["workload"]
        func = load_workload(wl).func
        task = tasks.setdefault(wl, {"func": func, "records": []})
        # Each tuner's database, from the run's work directory or the copy the suite kept.
        for d in (fastsearch_dir(run, suite_dir, path.stem), metaschedule_dir(run, suite_dir, path.stem)):
            if d is not None and (d / "database_tuning_record.json").exists():
                task["records"].extend(records_in_order(d, func))
    for task in tasks.values():
        task["latency_us"] = np.array([mean_us(r) for r in task["records"]])
    return tasks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite-dir", required=True, help="an --out-dir of benches/suite.py")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    target = resolve_target(None)
    tasks = load_tasks(Path(args.suite_dir))
    names = list(tasks)

    t0 = time.perf_counter()
    for t in tasks.values():
        traces = [r.trace for r in t["records"]]
        t["x"] = pool_store_features(extract_features(t["func"], traces, target))
        t["y"] = CostModel.labels(t["latency_us"])
    fs_feature_s = time.perf_counter() - t0

    # MetaSchedule's side: candidates as postprocessed schedules, contexts per task
    t0 = time.perf_counter()
    for name, t in tasks.items():
        mod = _normalize_mod(t["func"])
        t["context"] = ms.TuneContext(mod=mod, target=target, task_name=name)
        args_info = ms.arg_info.ArgInfo.from_prim_func(t["func"])
        cands, results = [], []
        for r in t["records"]:
            sch = tvm.s_tir.Schedule(mod)
            r.trace.apply_to_schedule(sch, remove_postproc=False)
            cands.append(ms.MeasureCandidate(sch, args_info))
            results.append(ms.runner.RunnerResult([float(s) for s in r.run_secs], None))
        t["cands"], t["results"] = cands, results
    ms_prep_s = time.perf_counter() - t0

    rows = []
    for held in names:
        test = tasks[held]
        lat = test["latency_us"]
        train = [tasks[n] for n in names if n != held]
        scores: dict[str, tuple[float, bool]] = {}

        reg = StoreFeatureModel()  # what fastsearch.metaschedule.CostModel trains
        reg.fit([(t["x"], t["latency_us"]) for t in train])
        pred = reg.predict(test["x"])
        scores["fastsearch reg"] = (pairwise_accuracy(pred, lat), top8_has_best(pred, lat))

        x = np.concatenate([t["x"] for t in train])
        y = np.concatenate([t["y"] for t in train])

        # ranks within a task are what matter: graded relevance 0..31 from relative throughput
        d = xgb.DMatrix(x, label=np.floor(y * 31))
        d.set_group([len(t["y"]) for t in train])
        rank = xgb.train({**XGB_PARAMS, "objective": "rank:pairwise"}, d, ROUNDS)
        pred = rank.predict(xgb.DMatrix(test["x"]))
        scores["fastsearch rank"] = (pairwise_accuracy(pred, lat), top8_has_best(pred, lat))

        model = ms.cost_model.XGBModel(num_warmup_samples=0, adaptive_training=False, verbose_eval=0)
        for t in train:
            model.update(t["context"], t["cands"], t["results"])
        pred = np.asarray(model.predict(test["context"], test["cands"]))
        scores["MetaSchedule XGBModel"] = (pairwise_accuracy(pred, lat), top8_has_best(pred, lat))
        rows.append((held, int(np.isfinite(lat).sum()), scores))
        print(held, {k: round(v[0], 3) for k, v in scores.items()}, file=sys.stderr, flush=True)

    models = list(rows[0][2])
    lines = [
        (
            "| held-out workload | valid candidates | "
            + " | ".join(f"{m} pairwise | best in top-8" for m in models)
            + " |"
        ),
        "|---|---:|" + "---:|---|" * len(models),
    ]
    for held, n, scores in rows:
        cells = " | ".join(f"{scores[m][0]:.3f} | {'yes' if scores[m][1] else 'no'}" for m in models)
        lines.append(f"| {held} | {n} | {cells} |")
    means = {m: statistics.fmean(s[m][0] for _, _, s in rows if not math.isnan(s[m][0])) for m in models}
    tops = {m: sum(s[m][1] for _, _, s in rows) for m in models}
    lines.append(
        "| **mean** | | " + " | ".join(f"**{means[m]:.3f}** | {tops[m]}/{len(rows)}" for m in models) + " |"
    )
    lines += [
        "",
        (
            f"Feature extraction for all {sum(len(t['records']) for t in tasks.values())} records: "
            f"fastsearch {fs_feature_s:.1f} s; MetaSchedule's candidates prepared (trace replay) in "
            f"{ms_prep_s:.1f} s, its PerStoreFeature runs inside each update/predict."
        ),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
