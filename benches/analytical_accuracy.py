"""How well the analytical model ranks candidates it did not choose: random sketch candidates
of each workload, measured on this machine, against the model's estimates.

The candidates the search measures are the ones its models liked, so the model's accuracy on
them is biased (the ones it over-rated are over-represented). Here each workload gets ``--n``
candidates drawn uniformly from fastsearch's sketches (``_core.Program.sample_genomes``), replayed with
MetaSchedule's postprocessors, built and timed once each. Reported per workload: pairwise
ranking accuracy of the analytical estimate, and how far from the sample's fastest the best of
the model's top 1, 4 and 16 is (what a cold first batch would find), against the median.

Measured candidates go to ``--out-dir/<workload>.json`` (genome and seconds); ``--report``
scores those files again with the installed model, so a model change can be evaluated on the
same measurements without timing anything:

    python -m benches.analytical_accuracy --n 128 --seed 7 --out-dir analytical
    python -m benches.analytical_accuracy --out-dir analytical --report
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import tvm
from fastsearch import _core
from fastsearch.cli.main import load_workload
from fastsearch.costmodel.learned import pairwise_accuracy
from fastsearch.ir.machine import fma_per_cycle, machine_of, num_cores, vector_bytes
from fastsearch.ir.target import resolve_target
from fastsearch.ir.tir_import import program_json

from benches.measure_keys import measure_keys
from benches.suite import DEFAULT_WORKLOADS


def _file(out_dir: Path, workload: str) -> Path:
    return out_dir / f"{workload.replace(':', '_')}.json"


def measure(workload: str, n: int, seed: int, target: tvm.target.Target, out_dir: Path) -> None:
    func = load_workload(workload).func
    program = program_json(func)
    pairs = _core.Program(program).sample_genomes(
        _core.Target(
            num_cores(target), vector_bytes=vector_bytes(target), fma_per_cycle=fma_per_cycle(target)
        ),
        n,
        seed,
    )
    us = measure_keys(func, target, [key for key, _ in pairs])
    rows = [
        {"genome": genome, "seconds": None if us[key] is None else us[key] * 1e-6}
        for key, genome in pairs
        if key in us
    ]
    doc = {"workload": workload, "seed": seed, "target": str(target), "rows": rows}
    _file(out_dir, workload).write_text(json.dumps(doc))
    print(f"{workload}: {sum(r['seconds'] is not None for r in rows)} of {len(pairs)} measured", flush=True)


def score(path: Path, speedup: str | None = None) -> dict[str, float]:
    """Accuracy of the analytical model on one measured file; ``speedup`` ("linear" or a number)
    replaces the machine's measured parallel speedup (:mod:`fastsearch.ir.machine`)."""
    doc = json.loads(path.read_text())
    target = resolve_target(doc["target"])
    if speedup is None:
        parallel = machine_of(target).parallel_speedup
    else:
        parallel = None if speedup == "linear" else float(speedup)
    program = program_json(load_workload(doc["workload"]).func)
    rows = [r for r in doc["rows"] if r["seconds"] is not None]
    seconds = np.array([r["seconds"] for r in rows])
    scores = np.array(
        _core.Program(program).analytical_scores(
            _core.Target(
                num_cores(target),
                vector_bytes=vector_bytes(target),
                fma_per_cycle=fma_per_cycle(target),
                parallel_speedup=parallel,
            ),
            [r["genome"] for r in rows],
        )
    )
    order = np.argsort(-scores, kind="stable")
    fastest = seconds.min()
    return {
        "workload": doc["workload"],
        "n": len(rows),
        "pairwise": pairwise_accuracy(scores, seconds),
        **{f"top{k}": float(seconds[order[:k]].min() / fastest) for k in (1, 4, 16)},
        "median": float(np.median(seconds) / fastest),
    }


def report(out_dir: Path, speedup: str | None = None) -> str:
    lines = [
        "| workload | candidates | pairwise accuracy | best of model's top 1 | top 4 | top 16 | median |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for path in sorted(out_dir.glob("*.json")):
        s = score(path, speedup)
        lines.append(
            f"| {s['workload']} | {s['n']} | {s['pairwise']:.3f} | {s['top1']:.2f} | {s['top4']:.2f} "
            f"| {s['top16']:.2f} | {s['median']:.2f} |"
        )
    lines.append("")
    lines.append("Latencies as multiples of the fastest candidate of the workload's sample.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    parser.add_argument("--n", type=int, default=128, help="random candidates per workload")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--report", action="store_true", help="only score the files in --out-dir")
    parser.add_argument(
        "--parallel-speedup",
        default=None,
        help="score with this parallel speedup ('linear' or a number) instead of the machine's measured one",
    )
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    if not args.report:
        out_dir.mkdir(parents=True, exist_ok=True)
        target = resolve_target(None)
        for workload in args.workloads:
            measure(workload, args.n, args.seed, target, out_dir)
    text = report(out_dir, args.parallel_speedup)
    (out_dir / "analytical_accuracy.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
