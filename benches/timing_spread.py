"""How steady a candidate's measured time is with repeats of different lengths.

The search times each candidate with ``MeasureConfig.repeat`` repeats of at least
``min_repeat_ms``, in one call of its runner. Between two calls, a kernel's time moves with where
its arguments land in memory; shorter repeats are worth taking only where that movement, not
the repeat's length, sets how steady a call's mean is. This benchmark takes three kernels of each
workload from a suite's fastsearch runs (the best, the lower quartile and the median of a run's
measured candidates), builds them as tuning does, and calls the runner ``--calls`` times for each
repeat length, interleaved, on the kernels' threads. Per kernel and length it reports the median
of the calls' means, their spread (standard deviation over mean), the fastest call against the
median and the wall seconds per call.

    python -m benches.timing_spread --suite-dir ~/fastsearch-runs/suite256prior \\
        --workloads GMM:2 C1D:2 DEP:1 SFM:0 --seed 0 --calls 12 --min-repeat-ms 20 10
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from fastsearch.cli.main import load_workload
from fastsearch.ir.target import resolve_target
from fastsearch.measure.measurer import MeasureConfig, Measurer
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import LocalRunner, RunnerInput

from benches.runs import fastsearch_dir, mean_us, records_in_order, replay_record, suite_runs


def picked_records(suite_dir: Path, workload: str, func: Any, seed: int) -> list[tuple[str, Any]]:
    """(label, record) of the best, lower-quartile and median measured candidates of the suite's
    longest run of ``workload`` and ``seed``."""
    runs = suite_runs(suite_dir, workload, seed)
    if not runs:
        raise SystemExit(f"no run of {workload}, seed {seed}, in {suite_dir}")
    path, run = max(runs, key=lambda pr: int(pr[1]["trials"]))
    work = fastsearch_dir(run, suite_dir, path.stem)
    if work is None:
        raise SystemExit(f"{path.name}: fastsearch's database was not kept")
    recs = [r for r in records_in_order(work, func) if math.isfinite(mean_us(r))]
    recs.sort(key=mean_us)
    return [("best", recs[0]), ("quartile", recs[len(recs) // 4]), ("median", recs[len(recs) // 2])]


def spread(means: list[float]) -> float:
    return statistics.stdev(means) / statistics.fmean(means)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--suite-dir", required=True, help="a benches.suite out-dir with fastsearch's databases"
    )
    parser.add_argument("--workloads", nargs="+", required=True)
    parser.add_argument("--seed", type=int, default=0, help="whose run's kernels (default 0)")
    parser.add_argument("--calls", type=int, default=12, help="runner calls per kernel and length")
    parser.add_argument("--min-repeat-ms", type=int, nargs="+", default=[20, 10])
    parser.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = parser.parse_args(argv)
    if args.calls < 2:
        parser.error("--calls must be at least 2 (a spread needs two calls)")

    target = resolve_target(None)
    lengths = list(dict.fromkeys(args.min_repeat_ms))
    header = "| workload | kernel | " + " | ".join(
        f"{m} ms: median us, spread, fastest/median, s per call" for m in lengths
    )
    lines = [header + " |", "|---|---|" + "---|" * len(lengths)]
    spreads: dict[int, list[float]] = {m: [] for m in lengths}
    call_s: dict[int, list[float]] = {m: [] for m in lengths}
    for workload in args.workloads:
        func = load_workload(workload).func
        picked = picked_records(Path(args.suite_dir).expanduser(), workload, func, args.seed)
        args_info = ms.arg_info.ArgInfo.from_prim_func(func)
        # The Measurer builds as tuning does and holds the kernels' thread count while the
        # runners below (started inside it) time them.
        with Measurer(target, MeasureConfig()) as measurer:
            built = measurer.build([replay_record(rec) for _, rec in picked])
            runners = {
                m: LocalRunner(
                    timeout_sec=measurer.config.run_timeout_s,
                    evaluator_config=MeasureConfig(min_repeat_ms=m).evaluator_config(),
                )
                for m in lengths
            }
            try:
                for (label, _), res in zip(picked, built, strict=True):
                    if res.artifact_path is None:
                        print(f"{workload} {label}: did not build: {res.error}", file=sys.stderr)
                        continue
                    means: dict[int, list[float]] = {m: [] for m in lengths}
                    secs: dict[int, list[float]] = {m: [] for m in lengths}
                    for _ in range(args.calls):
                        for m, runner in runners.items():
                            t0 = time.perf_counter()
                            (future,) = runner.run(
                                [RunnerInput(res.artifact_path, "cpu", res.args_info or args_info)]
                            )
                            out = future.result()
                            secs[m].append(time.perf_counter() - t0)
                            if out.error_msg is not None or not out.run_secs:
                                raise SystemExit(f"{workload} {label}: {out.error_msg}")
                            means[m].append(statistics.fmean(float(s) for s in out.run_secs) * 1e6)
                    cells = []
                    for m in lengths:
                        med = statistics.median(means[m])
                        spreads[m].append(spread(means[m]))
                        call_s[m].append(statistics.median(secs[m]))
                        cells.append(
                            f"{med:.1f}, {spreads[m][-1]:.3f}, {min(means[m]) / med:.3f}, {call_s[m][-1]:.3f}"
                        )
                    line = f"| {workload} | {label} | " + " | ".join(cells) + " |"
                    lines.append(line)
                    print(line, flush=True)
            finally:
                for runner in runners.values():
                    runner.pool.shutdown()
                Measurer.release(built)
    for m in lengths:
        if spreads[m]:
            lines.append(
                f"\n{m} ms: spread median {statistics.median(spreads[m]):.3f}, mean "
                f"{statistics.fmean(spreads[m]):.3f}; seconds per call, median {statistics.median(call_s[m]):.3f}"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
