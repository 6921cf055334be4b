"""How well the search's cost models rank the next batch of a real tuning run.

For every fastsearch run of a suite (``benches/suite.py``) whose work directory is still on disk,
the measured candidates are replayed in the order they were measured. At each checkpoint
(``--starts``), every model is trained on the records measured before it and ranks the next
``--window`` records; the score is pairwise accuracy on them (the share of pairs ordered as
measured). These are the candidates the search actually chose to measure, so this is the
question the model answers inside a run: which of the search's next proposals is fastest.

Models: the sketch-feature XGBoost of ``fastsearch.costmodel.learned.CostModel`` at several tree depths,
and the per-store-feature model (``StoreFeatureModel``) on the same candidates.

    python -m benches.next_batch_ranking /tmp/suite256a /tmp/suite256b
    python -m benches.next_batch_ranking --starts 16 32 48 --window 16 /tmp/suite256a

(``--out-dir`` folders of ``suite.py`` runs whose databases are on disk; the repository keeps
only runs' summaries)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from fastsearch import _core
from fastsearch.cli.main import load_workload
from fastsearch.costmodel.learned import CostModel, StoreFeatureModel, pairwise_accuracy, pooled_features
from fastsearch.database import candidate_key
from fastsearch.ir.tir_import import program_json
from fastsearch.search.state import state_file

from benches.runs import mean_us, records_in_order

DEPTHS = (6, 4, 3, 2)


def _run_records(run: dict) -> tuple[str, list[str], np.ndarray, dict[str, str]] | None:
    """(program JSON, keys in measured order, latencies in us, genome by key) of one run."""
    work = Path(run["work_dir"]) / "fastsearch"
    try:
        genomes_path = state_file(work, "main", "genomes.jsonl")
    except FileNotFoundError:
        return None
    func = load_workload(run["workload"]).func
    genomes: dict[str, str] = {}
    for line in genomes_path.read_text().splitlines():
        entry = json.loads(line)
        genomes[entry["key"]] = entry["genome"]
    keys: list[str] = []
    lats: list[float] = []
    for rec in records_in_order(work, func):
        key = candidate_key(rec.trace)
        if key in genomes and key not in keys:  # a final round's re-stored winner counts once
            keys.append(key)
            lats.append(mean_us(rec))
    return program_json(func), keys, np.array(lats), genomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suites", nargs="+", help="suite --out-dir folders")
    parser.add_argument("--starts", type=int, nargs="+", default=[64, 96, 128, 160, 192, 224])
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--vector-bytes", type=int, default=64)
    parser.add_argument(
        "--fma-per-cycle", type=float, default=2.0, help="1 on Zen 4 (fastsearch.search.sample.fma_per_cycle)"
    )
    args = parser.parse_args(argv)

    names = [f"sketch depth {d}" for d in DEPTHS] + ["per-store features"]
    scores: dict[str, list[float]] = {n: [] for n in names}
    per_workload: dict[str, dict[str, list[float]]] = {}
    for suite in args.suites:
        for path in sorted(Path(suite).glob("run_*.json")):
            run = json.loads(path.read_text())
            got = _run_records(run)
            if got is None:
                continue
            text, keys, lats, genomes = got
            program = _core.Program(text)
            rows = np.asarray(
                program.sketch_feature_rows(
                    _core.Target(
                        args.cores, vector_bytes=args.vector_bytes, fma_per_cycle=args.fma_per_cycle
                    ),
                    [genomes[k] for k in keys],
                )
            ).reshape(len(keys), -1)
            pooled = np.nan_to_num(pooled_features(program, keys))
            wl = per_workload.setdefault(run["workload"], {n: [] for n in names})
            for start in args.starts:
                train, test = slice(0, start), slice(start, start + args.window)
                lat = lats[test]
                ok = np.isfinite(lat)
                if ok.sum() < 4:
                    continue
                labels = CostModel.labels(lats[train])
                for depth, name in zip(DEPTHS, names, strict=False):
                    model = CostModel(params={"max_depth": depth})
                    model.fit_labels(rows[train], labels)
                    acc = pairwise_accuracy(model.predict(rows[test])[ok], lat[ok])
                    scores[name].append(acc)
                    wl[name].append(acc)
                store = StoreFeatureModel()
                store.fit([(pooled[train], lats[train])])
                acc = pairwise_accuracy(store.predict(pooled[test])[ok], lat[ok])
                scores[names[-1]].append(acc)
                wl[names[-1]].append(acc)

    print(f"Checkpoints {args.starts}, next {args.window} records; mean pairwise accuracy.\n")
    print("| workload | windows | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for workload in sorted(per_workload):
        accs = per_workload[workload]
        cells = " | ".join(f"{np.mean(accs[n]):.3f}" for n in names)
        print(f"| {workload} | {len(accs[names[0]])} | {cells} |")
    cells = " | ".join(f"**{np.mean(scores[n]):.3f}**" for n in names)
    print(f"| all | {len(scores[names[0]])} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
