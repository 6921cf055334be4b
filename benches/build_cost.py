"""Build cost in the search, on and off: the same workloads and seeds tuned both ways.

For each workload and seed, fastsearch tunes twice in this process, once with proposals ranked
by their predicted build time (the default) and once without (``TuningPlan(build_cost=False)``),
and reports the seconds spent building, the slowest build, the whole run's wall time and the
best kernel as measured while tuning. How well the build-time model ranks builds it has not
seen is reported too: trained on each ``--off`` run's first half of builds, its Spearman
correlation with the second half.

    TVM_NUM_THREADS=2 python -m benches.build_cost --workloads TBG:0 C2D:1 --seeds 0 1 --trials 128 --out /tmp/bc.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _run(workload: str, seed: int, trials: int, build_cost: bool, work: Path) -> dict[str, Any]:
    from fastsearch.cli.main import load_workload
    from fastsearch.ir.target import resolve_target
    from fastsearch.tuning import loop
    from fastsearch.tuning.options import TuningPlan

    func = load_workload(workload).func
    plan = TuningPlan(resolve_target(None), trials, seed, work, "main", progress=False, build_cost=build_cost)
    t0 = time.perf_counter()
    result = loop.run(func, plan)
    wall = time.perf_counter() - t0
    builds = [h.build_s for h in result.history if h.build_s is not None]
    return {
        "workload": workload,
        "seed": seed,
        "trials": trials,
        "build_cost": build_cost,
        "wall_s": wall,
        "build_s": sum(builds),
        "builds": builds,
        "slowest_build_s": max(builds, default=0.0),
        "best_us": result.best_latency_us,
        "work_dir": str(work),
    }


def held_out_spearman(work: Path, workload: str) -> float | None:
    """The build-time model trained on the first half of a run's builds (in measurement order),
    ranked against the second half: Spearman's correlation."""
    from fastsearch import _core
    from fastsearch.cli.main import load_workload
    from fastsearch.costmodel.build_time import BuildTimeModel
    from fastsearch.ir.tir_import import program_json
    from fastsearch.search.state import SearchState

    builds = SearchState.found(work, "main", "builds.jsonl").load_builds()
    keys = list(builds)  # file order: measurement order
    if len(keys) < 32:
        return None
    program = _core.Program(program_json(load_workload(workload).func))
    rows = np.asarray(program.code_sizes(keys))
    secs = np.array([builds[k] for k in keys])
    half = len(keys) // 2
    model = BuildTimeModel()
    if not model.fit(rows[:half], secs[:half]):
        return None
    predicted = model.predict(rows[half:])
    ranks = [np.argsort(np.argsort(x)) for x in (predicted, secs[half:])]
    return float(np.corrcoef(*ranks)[0, 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--out", required=True, help="JSON file of the runs (appended to when it exists)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    runs: list[dict[str, Any]] = json.loads(out.read_text()) if out.exists() else []
    done = {(r["workload"], r["seed"], r["trials"], r["build_cost"]) for r in runs}
    for workload in args.workloads:
        for seed in args.seeds:
            for build_cost in (True, False):  # alternated, so drift hits both alike
                if (workload, seed, args.trials, build_cost) in done:
                    continue
                work = Path(tempfile.mkdtemp(prefix=f"build_cost_{workload.replace(':', '_')}_"))
                run = _run(workload, seed, args.trials, build_cost, work)
                if not build_cost:
                    run["held_out_spearman"] = held_out_spearman(work, workload)
                runs.append(run)
                out.write_text(json.dumps(runs, indent=1))
    print(report(runs))
    return 0


def report(runs: list[dict[str, Any]]) -> str:
    """One row per workload and seed: build seconds, slowest build, wall and best, on / off."""
    lines = [
        "| workload | seed | build s on / off | slowest on / off | wall s on / off | best us on / off | held-out rank corr. |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    pairs = {}
    for r in runs:
        pairs.setdefault((r["workload"], r["seed"], r["trials"]), {})[r["build_cost"]] = r
    ratios = []
    for (wl, seed, _), pair in sorted(pairs.items()):
        if True not in pair or False not in pair:
            continue
        on, off = pair[True], pair[False]
        rho = off.get("held_out_spearman")
        lines.append(
            f"| {wl} | {seed} | {on['build_s']:.1f} / {off['build_s']:.1f} | {on['slowest_build_s']:.2f} / "
            f"{off['slowest_build_s']:.2f} | {on['wall_s']:.0f} / {off['wall_s']:.0f} | {on['best_us']:.1f} / "
            f"{off['best_us']:.1f} | {'-' if rho is None else f'{rho:.2f}'} |"
        )
        ratios.append(
            (on["build_s"] / off["build_s"], on["wall_s"] / off["wall_s"], on["best_us"] / off["best_us"])
        )
    if ratios:
        geo = [statistics.geometric_mean(x[i] for x in ratios) for i in range(3)]
        lines.append(
            f"\ngeomean on/off: build {geo[0]:.3f}, wall {geo[1]:.3f}, best {geo[2]:.3f} ({len(ratios)} pairs)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
