"""Where one round of fastsearch's search spends its time, on the states of real tuning runs.

For every fastsearch run of a suite (``benches/suite.py --out-dir``; its database and genomes are
kept there), the sampler of ``fastsearch.tune`` is rebuilt on the run's first N measured records
(``--records``), and one round proposing a batch (``--batch``, the suite's 16) is timed: model
training (model time), the Rust search (``propose``), the late re-ranking's per-store features and
scores (``rerank``) and TVM's replay of the batch (``replay``). Nothing is measured on hardware.
Rounds of different code can be compared side by side by running this script from each
installation in turn on the same suite.

    python -m benches.search_round --out-dir ~/fastsearch-runs/suite256 --records 64 160 240
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from fastsearch.cli.main import load_workload
from fastsearch.database import candidate_key, mean_run_secs
from fastsearch.ir.target import resolve_target
from fastsearch.search.guided import ModelGuidedSampler
from fastsearch.search.sample import Postprocessor
from fastsearch.search.state import state_file

from benches.runs import fastsearch_dir, records_in_order

PARTS = ("model", "propose", "rerank", "replay")


def time_round(run: dict, fs_dir: Path, records: int, batch: int, seed: int) -> dict[str, float]:
    """Seconds of each part of one round on the run's first ``records`` measurements."""
    func = load_workload(run["workload"]).func
    target = resolve_target(None)
    history: list[tuple[str, float]] = []
    seen: set[str] = set()
    for rec in records_in_order(fs_dir, func):
        key = candidate_key(rec.trace)
        if key in seen:
            continue  # a final round's winner, stored again
        seen.add(key)
        secs = mean_run_secs([float(s) for s in rec.run_secs] if rec.run_secs is not None else None)
        history.append((key, secs if secs < 1e9 else math.inf))
        if len(history) == records:
            break
    sampler = ModelGuidedSampler(func, target, "evolutionary", lambda: history, Postprocessor(func, target))
    for line in state_file(fs_dir, "main", "genomes.jsonl").read_text().splitlines():
        row = json.loads(line)
        sampler.genomes[row["key"]] = row["genome"]
    t0 = time.perf_counter()
    out = sampler(func, target, batch, seed, set())
    total = time.perf_counter() - t0
    if len(out) < batch:
        print(f"  {run['workload']}: {len(out)} of {batch} proposals replayed", file=sys.stderr)
    return {"total": total, "model": sampler.timing["model"], **sampler.search_parts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True, help="a suite.py out-dir")
    parser.add_argument("--records", nargs="+", type=int, default=[64, 160, 240])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="which runs of the suite")
    parser.add_argument("--workloads", nargs="*", default=None)
    parser.add_argument("--json", default=None, help="also write every timing here")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    rows: dict[int, list[dict[str, float]]] = {n: [] for n in args.records}
    for path in sorted(out.glob("run_*.json")):
        run = json.loads(path.read_text())
        if run["seed"] not in args.seeds or (args.workloads and run["workload"] not in args.workloads):
            continue
        fs_dir = fastsearch_dir(run, out, path.stem)
        if fs_dir is None:
            print(f"{path.name}: no fastsearch database, skipped", file=sys.stderr)
            continue
        for n in args.records:
            t = time_round(run, fs_dir, n, args.batch, seed=run["seed"] * 1000 + n)
            t.update(workload=run["workload"], seed=run["seed"])
            rows[n].append(t)
            print(
                f"{run['workload']} s{run['seed']} at {n}: "
                + ", ".join(f"{k} {t[k] * 1e3:.0f} ms" for k in ("total", *PARTS)),
                file=sys.stderr,
                flush=True,
            )
    lines = [
        f"One round of {args.batch} proposals (`{' '.join(sys.argv)}`), mean ms over runs:",
        "",
        "| records | runs | total | model | propose | rerank | replay | search per candidate |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, ts in rows.items():
        if not ts:
            continue
        mean = {k: statistics.fmean(t[k] for t in ts) * 1e3 for k in ("total", *PARTS)}
        search = mean["total"] - mean["model"]
        lines.append(
            f"| {n} | {len(ts)} | {mean['total']:.0f} | {mean['model']:.0f} | {mean['propose']:.0f} "
            f"| {mean['rerank']:.0f} | {mean['replay']:.0f} | {search / args.batch:.1f} |"
        )
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({str(n): ts for n, ts in rows.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
