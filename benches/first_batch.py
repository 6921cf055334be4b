"""How good a cold run's first batch is for several search settings: for each workload and
seed, the proposals of ``_core.Program.propose`` with no records (analytical model only) under each
(population, generations) setting are measured together, and the best of each batch compared.

Evolving on the analytical score alone can hurt: it finds the candidates the model over-rates
most. This is the measurement behind ``fastsearch.search.guided.COLD_GENERATIONS``:

    python -m benches.first_batch --seeds 0 1 2 --out ~/fastsearch-runs/first_batch/first_batch.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from fastsearch import _core
from fastsearch.cli.main import load_workload
from fastsearch.ir.machine import fma_per_cycle, num_cores, vector_bytes
from fastsearch.ir.target import resolve_target
from fastsearch.ir.tir_import import program_json

from benches.measure_keys import measure_keys
from benches.suite import DEFAULT_WORKLOADS

#: (population, generations) settings compared; the first is the reference.
SETTINGS = {"p2048g4": (2048, 4), "p2048g1": (2048, 1), "p2048g0": (2048, 0), "p256g0": (256, 0)}


def best_of_batches(workload: str, seed: int, batch: int) -> dict[str, float]:
    target = resolve_target(None)
    func = load_workload(workload).func
    program = _core.Program(program_json(func))
    cpu = _core.Target(
        num_cores(target), vector_bytes=vector_bytes(target), fma_per_cycle=fma_per_cycle(target)
    )
    picks = {
        name: [
            key
            for key, _, _, _ in program.propose(
                cpu,
                strategy="evolutionary",
                n=batch,
                seed=seed,
                measured={},
                seeds=[],
                population=pop,
                generations=gens,
            )
        ]
        for name, (pop, gens) in SETTINGS.items()
    }
    timed = measure_keys(func, target, sorted({k for keys in picks.values() for k in keys}))
    us = {key: math.inf if t is None else t for key, t in timed.items()}
    return {name: min(us.get(k, math.inf) for k in keys_) for name, keys_ in picks.items()}


def summarize(runs: dict[str, dict[str, float]]) -> str:
    names = list(SETTINGS)
    ref = names[0]
    lines = [
        f"| workload | {' | '.join(names)} |",
        "|---|" + "---:|" * len(names),
    ]
    ratios = {n: [] for n in names}
    for workload in dict.fromkeys(k.rsplit(" s", 1)[0] for k in runs):
        rows = [v for k, v in runs.items() if k.rsplit(" s", 1)[0] == workload]
        cells = []
        for n in names:
            r = [math.log(v[n] / v[ref]) for v in rows]
            ratios[n].extend(r)
            cells.append(f"{math.exp(sum(r) / len(r)):.3f}")
        lines.append(f"| {workload} | {' | '.join(cells)} |")
    lines.append(
        "| **geometric mean** | "
        + " | ".join(f"**{math.exp(np.mean(ratios[n])):.3f}**" for n in names)
        + " |"
    )
    logs = np.array(ratios["p2048g0"])
    rng = np.random.default_rng(0)
    boot = [math.exp(rng.choice(logs, len(logs)).mean()) for _ in range(5000)]
    lo, hi = np.percentile(boot, [5, 95])
    lines.append("")
    lines.append(
        f"Best of each batch over {ref}'s, geometric mean over seeds. p2048g0 against {ref}: "
        f"bootstrap 90% interval {lo:.3f}-{hi:.3f}, faster in {(logs < 0).sum()} of {len(logs)} runs."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=16, help="proposals per batch (tune's first batch)")
    parser.add_argument("--out", required=True, help="JSON of every run's best per setting")
    parser.add_argument("--report", action="store_true", help="only summarize --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.report:
        runs = json.loads(out.read_text())
    else:
        runs = {}
        for workload in args.workloads:
            for seed in args.seeds:
                runs[f"{workload} s{seed}"] = best_of_batches(workload, seed, args.batch)
                print(
                    workload,
                    seed,
                    {k: round(v, 1) for k, v in runs[f"{workload} s{seed}"].items()},
                    flush=True,
                )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(runs, indent=1))
    print(summarize(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
