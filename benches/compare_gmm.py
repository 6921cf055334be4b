"""Side by side on one machine: fastsearch vs MetaSchedule's ``tune_tir`` on GMM, and numpy's BLAS.

Both tuners get the same workload, target (host CPU with ``mcpu`` and ``num-cores``), number of
measured trials and seed, each in its own fresh work directory. Their best kernels are then
compiled from their databases and re-timed here with one and the same ``time_evaluator`` setting,
so the comparison does not depend on how each measured during tuning. numpy's ``matmul`` on the
same shape is the physical reference.

    python -m benches.compare_gmm --trials 64 --out gmm.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tvm
from fastsearch.cli.main import load_workload, workload_flops
from fastsearch.ir.target import physical_cores, resolve_target
from fastsearch.measure.measurer import build_module_tvm_lowering, random_arguments
from fastsearch.tuning.tune import TuneResult, tune
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod


def retime(libs: list[tvm.runtime.Executable], func: Any, repeat: int) -> list[list[float]]:
    """Seconds per call of ``main`` of each library: ``repeat`` rounds, each timing every library
    once for at least 100 ms, interleaved so that load changes on a shared machine hit all alike."""
    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(a, dev) for a in random_arguments(ms.arg_info.ArgInfo.from_prim_func(func))]
    timers = [lib.jit().time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=100) for lib in libs]
    for timer in timers:
        timer(*args)  # warm-up
    results: list[list[float]] = [[] for _ in libs]
    for _ in range(repeat):
        for i, timer in enumerate(timers):
            results[i].append(float(timer(*args).results[0]))
    return results


def run_fastsearch(
    func: Any, target: tvm.target.Target, trials: int, seed: int, work: Path, strategy: str
) -> TuneResult:
    return tune(func, target, trials=trials, seed=seed, work_dir=work, strategy=strategy, name="GMM")


def run_metaschedule(
    func: Any,
    target: tvm.target.Target,
    trials: int,
    seed: int,
    work: Path,
    default_builder: bool,
    measure_callbacks: Any = "default",
    f_build: Any = build_module_tvm_lowering,
) -> tuple[Any, float | None]:
    """MetaSchedule's default tuning; returns its database and its best mean run time (us).

    Unless ``default_builder``, its LocalBuilder uses fastsearch's build function with TVM's
    default lowering (MetaSchedule's own minus the tensor-intrinsic import that every fresh
    build worker repeats, which alone can exceed the builder's 30 s timeout on a small
    machine): the code MetaSchedule's own builder makes, built as fast as fastsearch builds.
    ``f_build`` replaces that build function (``build_module``: fastsearch's lowering).
    """
    builder = "local" if default_builder else ms.builder.LocalBuilder(f_build=f_build)
    db = ms.tune_tir(
        mod=func,
        target=target,
        work_dir=str(work),
        max_trials_global=trials,
        num_trials_per_iter=min(64, trials),
        seed=seed,
        builder=builder,
        measure_callbacks=measure_callbacks,
    )
    workload = db.commit_workload(_normalize_mod(func))
    top = db.get_top_k(workload, 1)
    best = statistics.fmean(float(s) for s in top[0].run_secs) * 1e6 if len(top) else None
    return db, best


_NUMPY_TIMER = """
import json, sys, time
import numpy as np
b, n, m, k, repeat = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.uniform(-1, 1, (b, n, k)).astype("float32")
y = rng.uniform(-1, 1, (b, k, m)).astype("float32")
out = np.empty((b, n, m), "float32")
np.matmul(x, y, out=out)
t0 = time.perf_counter()
np.matmul(x, y, out=out)
number = max(1, int(0.1 / max(time.perf_counter() - t0, 1e-7)))
res = []
for _ in range(repeat):
    t0 = time.perf_counter()
    for _ in range(number):
        np.matmul(x, y, out=out)
    res.append((time.perf_counter() - t0) / number)
print(json.dumps(res))
"""


def time_numpy(shape: tuple, repeat: int, threads: int) -> list[float]:
    """Seconds per ``np.matmul`` of the GMM operands with ``threads`` BLAS threads.

    Runs in a fresh process: the BLAS thread count is fixed at import, and TVM's thread pool in
    this process would compete with BLAS threads for the cores.
    """
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    # Some machines pin OpenBLAS to an older kernel (AVX2) for safety; the physical limit is what
    # it runs without that pin, so the pin is lifted for this timing process alone.
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(var, None)
    out = subprocess.run(
        [sys.executable, "-c", _NUMPY_TIMER, json.dumps([*shape, repeat])],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return [float(x) for x in json.loads(out.stdout)]


def gflops(flops: float | None, us: float | None) -> str:
    return f"{flops / (us * 1e-6) / 1e9:.1f}" if flops and us else "-"


def fmt(x: float | None, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if x is not None else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="GMM:2", help="te_workload FAMILY:INDEX (default GMM:2)")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--strategy", default="evolutionary", help="fastsearch strategy: random, evolutionary, annealing"
    )
    parser.add_argument("--repeat", type=int, default=10, help="repeats when re-timing the best kernels")
    parser.add_argument("--work-dir", default=None, help="where both databases go (default: a temp dir)")
    parser.add_argument("--skip-metaschedule", action="store_true", help="fastsearch and numpy only")
    parser.add_argument(
        "--ms-default-builder",
        action="store_true",
        help="MetaSchedule's own build function (imports all tensor intrinsics in every build worker)",
    )
    parser.add_argument("--out", default=None, help="write the table as markdown to this file")
    args = parser.parse_args(argv)

    wl = load_workload(args.workload)
    func = wl.func
    flops = workload_flops(func)
    target = resolve_target(None)
    base = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="compare_gmm_"))
    base.mkdir(parents=True, exist_ok=True)
    for sub in ("fastsearch", "metaschedule"):
        if (base / sub).exists() and any((base / sub).iterdir()):
            parser.error(f"{base / sub} is not empty; each run needs fresh work directories")

    print(f"{wl.name} {wl.shape}, {args.trials} trials, seed {args.seed}, target {target}", file=sys.stderr)
    load_start = os.getloadavg()[0]

    t0 = time.perf_counter()
    fs = run_fastsearch(func, target, args.trials, args.seed, base / "fastsearch", args.strategy)
    fs_wall = time.perf_counter() - t0
    libs = [fs.compile()]

    ms_wall = ms_tuned = ms_retimed = None
    if not args.skip_metaschedule:
        t0 = time.perf_counter()
        ms_db, ms_tuned = run_metaschedule(
            func, target, args.trials, args.seed, base / "metaschedule", args.ms_default_builder
        )
        ms_wall = time.perf_counter() - t0
        sch = ms.tir_integration.compile_tir(ms_db, func, target)
        if sch is not None:
            libs.append(tvm.compile(sch.mod, target=target))

    all_times = retime(libs, func, args.repeat)
    retimed = [statistics.median(times) * 1e6 for times in all_times]
    spread = [(min(times) * 1e6, max(times) * 1e6) for times in all_times]
    fs_retimed = retimed[0]
    ms_spread = None
    if len(retimed) > 1:
        ms_retimed, ms_spread = retimed[1], spread[1]

    # numpy's matmul is the physical reference for GMM only (other families have none here);
    # with one BLAS thread and with one per core, the faster one is reported
    np_us = None
    if wl.name.startswith("GMM"):
        np_all = {th: time_numpy(tuple(wl.shape), args.repeat, th) for th in sorted({1, physical_cores()})}
        np_times = {th: statistics.median(t) * 1e6 for th, t in np_all.items()}
        np_threads, np_us = min(np_times.items(), key=lambda kv: kv[1])
        np_spread = (min(np_all[np_threads]) * 1e6, max(np_all[np_threads]) * 1e6)
    load_end = os.getloadavg()[0]

    parity = None
    if ms_tuned is not None:
        for h in fs.history:
            if h.best_us is not None and h.best_us <= ms_tuned:
                parity = (h.trial, h.elapsed_s)
                break

    now = datetime.datetime.now(datetime.timezone.utc)
    host = platform.processor() or platform.machine()
    how = "`time_evaluator`, interleaved, the same for both tuners"
    builder_note = (
        "its own LocalBuilder"
        if args.ms_default_builder
        else "LocalBuilder with fastsearch's build function and TVM's default lowering"
    )
    rows = [
        (f"fastsearch ({args.strategy})", fs.best_latency_us, fs_retimed, spread[0], fs_wall),
        ("MetaSchedule tune_tir", ms_tuned, ms_retimed, ms_spread, ms_wall),
    ]
    if np_us is not None:
        rows.append(
            (
                f"numpy matmul (BLAS, {np_threads} thread{'s' if np_threads > 1 else ''})",
                None,
                np_us,
                np_spread,
                None,
            )
        )
    lines = [
        f"## {wl.name} {tuple(wl.shape)}: fastsearch vs MetaSchedule, {args.trials} trials",
        "",
        (
            f"- date: {now:%Y-%m-%d %H:%M} UTC; host: {host}, {physical_cores()} physical cores; "
            f"load average {load_start:.1f} at the start, {load_end:.1f} at the end (a loaded machine is noisy)"
        ),
        f"- target: `{target}`; seed {args.seed}; TVM {tvm.__version__}",
        f"- best kernels re-timed here: median of {args.repeat} repeats of >= 100 ms ({how})",
        *(
            []
            if args.skip_metaschedule
            else [
                f"- MetaSchedule: `tune_tir` defaults (evolutionary search, XGBoost, LocalRunner), {builder_note}"
            ]
        ),
        "",
        (
            "| method | best during tuning (us) | re-timed median (us) | re-timed min..max (us) "
            "| GFLOP/s (re-timed median) | wall time (s) |"
        ),
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, tuned, retimed, span, wall in rows:
        if name.startswith("MetaSchedule") and args.skip_metaschedule:
            continue
        span_text = f"{span[0]:.1f}..{span[1]:.1f}" if span else "-"
        lines.append(
            f"| {name} | {fmt(tuned)} | {fmt(retimed)} | {span_text} | {gflops(flops, retimed)} | {fmt(wall)} |"
        )
    lines.append("")
    if ms_retimed and fs_retimed:
        lines.append(
            f"- fastsearch / MetaSchedule best latency (re-timed): **{fs_retimed / ms_retimed:.3f}**"
        )
    if ms_wall and fs_wall:
        lines.append(f"- fastsearch / MetaSchedule wall time: **{fs_wall / ms_wall:.3f}**")
    if ms_tuned is not None:
        lines.append(
            f"- fastsearch reached MetaSchedule's final best after trial {parity[0]} ({parity[1]:.1f} s)"
            if parity
            else "- fastsearch did not reach MetaSchedule's final best"
        )
    if np_us is not None:
        lines.append(
            f"- fastsearch / numpy latency: {fs_retimed / np_us:.2f} (numpy by BLAS threads: "
            + ", ".join(f"{th}: {us:.1f} us" for th, us in np_times.items())
            + ")"
        )
    t = fs.timing
    breakdown = ", ".join(
        f"{k} {t[k]:.1f} s" for k in ("search", "apply", "build", "run", "verify", "database", "model")
    )
    lines.append(
        f"- fastsearch time: total {t['total']:.1f} s: {breakdown}; "
        f"{fs.trials_measured} measured, {fs.failed} failed; "
        f"search per measured candidate {1e3 * t['search'] / max(1, fs.trials_measured):.1f} ms"
    )
    lines.append(f"- databases: `{base}`")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
