"""Warm starts: how many trials a new shape needs when other shapes of its operator are tuned.

For each operator family: tune its source shapes once (fastsearch, or MetaSchedule's ``tune_tir``
with ``--metaschedule-sources``) into one database each; then, for every seed, tune the target
shape cold (fresh work directory) and warm (``tune(..., warm_start=<the source databases>)``),
with the same trials and seed. The figures: the trial at which the warm run's best (as measured
while tuning) first reaches the cold run's final best, as a share of the cold run's trials; and,
free of run-to-run measurement noise, the warm run's best among its first third of the trials
re-timed against the cold run's final best, both compiled from their databases and timed
together in ``--retime-processes`` fresh processes (:mod:`kernel_retime`; the median of the
per-process ratios, <= 1: the warm run got there within a third of the trials).

    python -m benches.warm_start --out-dir warm --families GMM:0,1,3:2 C2D:0,1,3:2
    python -m benches.warm_start --out-dir warm --report

Each family is ``FAMILY:SOURCES:TARGET`` (shape indices of ``fastsearch workloads``). Runs
already in ``--out-dir`` are kept, so an interrupted benchmark resumes; ``--report`` writes
``warm_start.md`` and ``warm_start.png`` from them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from fastsearch.cli.main import load_workload
from fastsearch.ir.target import resolve_target
from fastsearch.ir.vector_math import TIR_PIPELINE
from fastsearch.measure.measurer import build_module_tvm_lowering
from fastsearch.search.warm_start import WarmStart
from fastsearch.tuning.tune import tune
from tvm.s_tir import meta_schedule as ms

from benches.kernel_retime import pair, retime_in_processes
from benches.runs import best_within, compile_record, records_in_order

DEFAULT_FAMILIES = ["GMM:0,1,3:2", "C2D:0,1,3:2", "C1D:0,1,3:2", "DEP:0,2,3:1"]


def _parse(spec: str) -> tuple[str, list[int], int]:
    family, sources, target = spec.split(":")
    return family, [int(s) for s in sources.split(",")], int(target)


def _source_db(family: str, index: int, trials: int, out_dir: Path, metaschedule: bool) -> Path:
    """The database of one source shape, tuned once (seed 0) and kept in ``out_dir``."""
    tool = "ms" if metaschedule else "fs"
    path = out_dir / "sources" / f"{tool}_{family}_{index}_t{trials}"
    if (path / "done").exists():
        return path
    func = load_workload(f"{family}:{index}").func
    target = resolve_target(None)
    print(f"source {family}:{index} ({tool}), {trials} trials ...", file=sys.stderr, flush=True)
    if metaschedule:
        ms.tune_tir(
            mod=func,
            target=target,
            work_dir=str(path),
            max_trials_global=trials,
            num_trials_per_iter=min(64, trials),
            seed=0,
            builder=ms.builder.LocalBuilder(f_build=build_module_tvm_lowering),
        )
    else:
        tune(func, target, trials=trials, seed=0, work_dir=path, progress=False)
    (path / "done").write_text("")
    return path


def _curve(result: Any) -> list[float | None]:
    """Best latency (us) after each measured trial."""
    return [h.best_us for h in result.history]


def run_family(
    spec: str,
    seeds: list[int],
    trials: int,
    source_trials: int,
    out_dir: Path,
    metaschedule: bool,
    repeat: int,
    processes: int = 4,
) -> None:
    family, sources, target_index = _parse(spec)
    tool = "ms" if metaschedule else "fs"
    dbs = [_source_db(family, i, source_trials, out_dir, metaschedule) for i in sources]
    func = load_workload(f"{family}:{target_index}").func
    target = resolve_target(None)
    for seed in seeds:
        path = out_dir / f"run_{tool}_{family}_{target_index}_s{seed}_t{trials}.json"
        if path.exists():
            continue
        print(f"{family}:{target_index} seed {seed}: cold, then warm ...", file=sys.stderr, flush=True)
        scratch = out_dir / "scratch" / path.stem
        t0 = time.perf_counter()
        cold = tune(func, target, trials=trials, seed=seed, work_dir=scratch / "cold", progress=False)
        cold_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm_from = WarmStart(dbs)
        warm = tune(
            func,
            target,
            trials=trials,
            seed=seed,
            work_dir=scratch / "warm",
            progress=False,
            warm_start=warm_from,
        )
        warm_wall = time.perf_counter() - t0
        third = math.ceil(trials / 3)
        cold_best = best_within(records_in_order(scratch / "cold", func), trials)  # final round included
        warm_best = best_within(records_in_order(scratch / "warm", func), third, last=False)
        retimed = None
        if cold_best is not None and warm_best is not None:
            # in fresh processes, each timing both (benches/kernel_retime.py)
            rows = retime_in_processes(
                [
                    compile_record(cold_best, target, TIR_PIPELINE),
                    compile_record(warm_best, target, TIR_PIPELINE),
                ],
                func,
                repeat,
                processes,
            )
            warm_us, cold_us, ratios = pair(rows, 1, 0)
            retimed = {
                "cold_final_us": cold_us,
                "warm_third_us": warm_us,
                "ratio": statistics.median(ratios),
                "ratios_per_process": ratios,
                "processes": processes,
            }
        res = {
            "family": family,
            "sources": [f"{family}:{i}" for i in sources],
            "source_tool": "metaschedule" if metaschedule else "fastsearch",
            "source_trials": source_trials,
            "target": f"{family}:{target_index}",
            "shape": list(load_workload(f"{family}:{target_index}").shape),
            "seed": seed,
            "trials": trials,
            "warm_records": warm_from.num_records,
            "retimed": retimed,
            "cold": {"curve": _curve(cold), "wall_s": cold_wall, "timing": cold.timing},
            "warm": {"curve": _curve(warm), "wall_s": warm_wall, "timing": warm.timing},
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "target_json": str(target),
        }
        path.write_text(json.dumps(res, indent=1))
        r = _reach(res)
        print(f"  cold best {res['cold']['curve'][-1]:.1f} us; warm reaches it at trial {r}", file=sys.stderr)


def _reach(run: dict[str, Any]) -> int | None:
    """1-based trial at which the warm run's best first reaches the cold run's final best."""
    goal = next((b for b in reversed(run["cold"]["curve"]) if b is not None), None)
    if goal is None:
        return None
    for i, best in enumerate(run["warm"]["curve"], start=1):
        if best is not None and best <= goal:
            return i
    return None


def _ratio(t: dict[str, Any]) -> float:
    """Warm best of the first third over cold final: the median per-process ratio when re-timed
    in several processes (older runs: one process's ratio of medians)."""
    return float(t["ratio"]) if t.get("ratio") else t["warm_third_us"] / t["cold_final_us"]


def _retimed_ratio(run: dict[str, Any]) -> str:
    t = run.get("retimed")
    return f"{t['warm_third_us']:.1f} / {t['cold_final_us']:.1f}: {_ratio(t):.3f}" if t else "-"


def _geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def _first_best(curve: list[float | None], n: int) -> float | None:
    vals = [b for b in curve[:n] if b is not None]
    return vals[-1] if vals else None


def report(out_dir: Path) -> str:
    runs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("run_*.json"))]
    if not runs:
        return "no runs"
    lines = [
        "## Warm starts: trials for a new shape to reach the cold run's final latency",
        "",
        f"Machine: {platform.processor() or platform.machine()}, target `{runs[0]['target_json']}`.",
        "",
        (
            "| target | from | seed | cold final best (us) | warm best at trial 1 / 8 / 16 (us) "
            "| warm final (us) | warm reaches cold final at trial | share of cold trials "
            "| re-timed: warm best of first third / cold final |"
        ),
        "|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    shares = []
    for r in runs:
        reach = _reach(r)
        share = reach / r["trials"] if reach is not None else math.inf
        shares.append(share)
        early = " / ".join(
            f"{v:.1f}" if v is not None else "-"
            for v in (_first_best(r["warm"]["curve"], n) for n in (1, 8, 16))
        )
        lines.append(
            f"| {r['target']} | {r['source_tool']} {', '.join(r['sources'])} ({r['warm_records']} records) "
            f"| {r['seed']} | {r['cold']['curve'][-1]:.1f} | {early} | {r['warm']['curve'][-1]:.1f} "
            f"| {reach if reach is not None else 'not reached'} / {r['trials']} "
            f"| {share:.2f} | {_retimed_ratio(r)} |"
        )
    finite = [s for s in shares if math.isfinite(s)]
    ratios = [_ratio(r["retimed"]) for r in runs if r.get("retimed")]
    lines += [
        "",
        (
            f"Runs: {len(runs)}; the warm run reached the cold run's final best (as measured while tuning) "
            f"in {len(finite)}, within a third of the trials in {sum(1 for s in shares if s <= 1 / 3)}. "
            f"Median share of the cold run's trials: **{statistics.median(shares):.2f}**."
        ),
        "",
    ]
    if ratios:
        lines += [
            (
                f"Re-timed together: the warm run's best of its first third of the trials against the cold "
                f"run's final best, geometric mean **{_geomean(ratios):.3f}**, worst {max(ratios):.3f}, "
                f"at most 1.0 in {sum(1 for x in ratios if x <= 1.0)} of {len(ratios)} runs."
            ),
            "",
        ]
    _plot(runs, out_dir)
    lines.append("Curves, beside this file: `warm_start.png`.")
    text = "\n".join(lines) + "\n"
    (out_dir / "warm_start.md").write_text(text)
    return text


def _plot(runs: list[dict[str, Any]], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["target"], r["source_tool"]) for r in runs})
    fig, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.2), squeeze=False)
    for ax, (tgt, tool) in zip(axes.flat, groups):
        for r in (r for r in runs if r["target"] == tgt and r["source_tool"] == tool):
            for who, color in (("cold", "tab:gray"), ("warm", "tab:blue")):
                pts = [(i, b) for i, b in enumerate(r[who]["curve"], start=1) if b is not None]
                if pts:
                    xs, ys = zip(*pts)
                    ax.step(
                        xs, ys, where="post", color=color, alpha=0.8, label=who if r["seed"] == 0 else None
                    )
        ax.set_title(f"{tgt} (from {tool})")
        ax.set_xlabel("measured trials")
        ax.set_ylabel("best latency (us)")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "warm_start.png", dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=DEFAULT_FAMILIES, help="FAMILY:SOURCES:TARGET")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--trials", type=int, default=64, help="trials of the cold and the warm run")
    parser.add_argument("--source-trials", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds per re-timing process")
    parser.add_argument("--retime-processes", type=int, default=4, help="fresh processes re-timing each pair")
    parser.add_argument("--metaschedule-sources", action="store_true", help="tune the sources with tune_tir")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--report", action="store_true", help="only aggregate the runs in --out-dir")
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for spec in args.families:
            run_family(
                spec,
                args.seeds,
                args.trials,
                args.source_trials,
                out_dir,
                args.metaschedule_sources,
                args.repeat,
                args.retime_processes,
            )
    print(report(out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
