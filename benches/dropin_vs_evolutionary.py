"""fastsearch.metaschedule.SearchStrategy against MetaSchedule's EvolutionarySearch, both inside ``tune_tir``.

Same workloads, trials, builder, runner and seeds; fastsearch runs with its drop-in CostModel,
MetaSchedule with its defaults (EvolutionarySearch, XGBModel). Each run's best schedule is
compiled from its database with ``compile_tir`` and re-timed at the end, all runs' bests
interleaved, so both sides are timed under the same machine load.

    python -m benches.dropin_vs_evolutionary --families GMM C2D CBR --seeds 0 1 --trials 16

``--workloads GMM:2 C2D:3 ...`` takes the suite's shapes instead of the tests' small ones; each
pair of bests is then re-timed in ``--retime-processes`` fresh processes
(:mod:`kernel_retime`), and the ratio is the median of the per-process ratios.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tvm
from fastsearch import metaschedule as fst
from fastsearch.ir.target import resolve_target
from fastsearch.measure.measurer import build_module_tvm_lowering, random_arguments
from tvm.s_tir import meta_schedule as ms

from benches.kernel_retime import pair, retime_in_processes
from tests.workloads import small


def tune(
    func: tvm.tirx.PrimFunc, target: tvm.target.Target, work_dir: str, side: str, seed: int, trials: int
):
    if side == "fastsearch":
        extra = {"strategy": fst.SearchStrategy(seed=seed), "cost_model": fst.CostModel(seed=seed)}
    else:
        extra = {"strategy": "evolutionary", "cost_model": "xgb"}
    t0 = time.perf_counter()
    db = ms.tune_tir(
        func,
        target,
        work_dir,
        trials,
        num_trials_per_iter=8,
        builder=ms.builder.LocalBuilder(f_build=build_module_tvm_lowering, max_workers=1),
        runner=ms.runner.LocalRunner(
            evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=5)
        ),
        num_tuning_cores=1,
        seed=seed,
        **extra,
    )
    wall = time.perf_counter() - t0
    sch = ms.tir_integration.compile_tir(db, func, target)
    return tvm.compile(sch.mod, target=target).jit(), wall


def _suite_shapes(args: argparse.Namespace, target: tvm.target.Target) -> int:
    """Both sides on the suite's shapes; each pair of bests re-timed in fresh processes."""
    from fastsearch.cli.main import load_workload

    lines = [
        (
            f"Best schedule after {args.trials} trials (batches of 8), re-timed in "
            f"{args.retime_processes} fresh processes (median over processes, us); tuning wall time "
            "in parentheses; ratio: median of the per-process ratios fastsearch / MetaSchedule."
        ),
        "",
        "| workload | seed | fastsearch SearchStrategy + CostModel | MetaSchedule EvolutionarySearch + XGBModel | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.workloads:
            func = load_workload(spec).func
            for seed in args.seeds:
                libs, walls = [], []
                for side in ("fastsearch", "MetaSchedule"):
                    wd = f"{args.work_dir or tmp}/{spec.replace(':', '_')}_{seed}_{side}"
                    lib, wall = tune(func, target, wd, side, seed, args.trials)
                    libs.append(lib)
                    walls.append(wall)
                    print(spec, seed, side, f"{wall:.0f} s", file=sys.stderr, flush=True)
                fs_us, ms_us, per_process = pair(
                    retime_in_processes(libs, func, 5, args.retime_processes), 0, 1
                )
                ratio = statistics.median(per_process)
                ratios.append(ratio)
                lines.append(
                    f"| {spec} | {seed} | {fs_us:.1f} ({walls[0]:.0f} s) | {ms_us:.1f} ({walls[1]:.0f} s) "
                    f"| {ratio:.3f} |"
                )
                print(lines[-1], file=sys.stderr, flush=True)
    geo = float(np.exp(np.mean(np.log(ratios))))
    lines += [
        "",
        f"Geometric mean of fastsearch / MetaSchedule latency: **{geo:.3f}** (<1: fastsearch faster).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=["GMM", "C2D", "CBR"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--work-dir", default=None, help="keep the databases here (default: a temporary directory)"
    )
    ap.add_argument("--workloads", nargs="+", default=None, help="suite shapes, e.g. GMM:2 C2D:3")
    ap.add_argument("--retime-processes", type=int, default=4)
    args = ap.parse_args(argv)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    target = resolve_target(None)
    if args.workloads:
        return _suite_shapes(args, target)
    sides = ("fastsearch", "MetaSchedule")
    built: dict[tuple[str, int, str], tuple[tvm.runtime.Module, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            for seed in args.seeds:
                for side in sides:
                    wd = f"{args.work_dir or tmp}/{family}_{seed}_{side}"
                    built[family, seed, side] = tune(small(family), target, wd, side, seed, args.trials)
                    print(family, seed, side, f"{built[family, seed, side][1]:.0f} s", file=sys.stderr)
    # re-time every best schedule, interleaved in rounds, under the same load
    dev = tvm.cpu()
    timings: dict[tuple[str, int, str], list[float]] = {k: [] for k in built}
    inputs = {
        f: [
            tvm.runtime.tensor(a, dev) for a in random_arguments(ms.arg_info.ArgInfo.from_prim_func(small(f)))
        ]
        for f in args.families
    }
    for _ in range(5):
        for key, (lib, _) in built.items():
            timer = lib.time_evaluator("main", dev, number=20, repeat=3, min_repeat_ms=20)
            timings[key].append(float(np.median(timer(*inputs[key[0]]).results)) * 1e6)
    lines = [
        (
            f"Best schedule after {args.trials} trials (batches of 8), re-timed: median of 5 "
            "interleaved rounds, us (lower is better); tuning wall time in parentheses."
        ),
        "",
        "| workload | seed | fastsearch SearchStrategy + CostModel | MetaSchedule EvolutionarySearch + XGBModel |",
        "|---|---:|---:|---:|",
    ]
    ratios = []
    for family in args.families:
        for seed in args.seeds:
            cells = []
            for side in sides:
                us = statistics.median(timings[family, seed, side])
                cells.append(f"{us:.2f} ({built[family, seed, side][1]:.0f} s)")
            ratios.append(
                statistics.median(timings[family, seed, "MetaSchedule"])
                / statistics.median(timings[family, seed, "fastsearch"])
            )
            lines.append(f"| {family} (small) | {seed} | " + " | ".join(cells) + " |")
    geo = float(np.exp(np.mean(np.log(ratios))))
    lines += ["", f"Geometric mean of MetaSchedule / fastsearch latency: {geo:.3f} (>1: fastsearch faster)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
