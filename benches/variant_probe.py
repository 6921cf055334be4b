"""Re-times one tuned kernel with some of its decisions changed: its unroll depth and, for a
MetaSchedule record, where its padding is computed. Shows how much a single decision is worth
on this machine (what the analytical model has to know), on the suite's own records:

    python -m benches.variant_probe ~/fastsearch-runs/suite64/run_DEP_1_s0_t64.json \\
        --tuner metaschedule --rank 0 --locations -2 -1 7

prints the record's own decisions, then every (location, unroll) variant re-timed side by side
in fresh processes (:mod:`kernel_retime`). Locations are ``SampleComputeLocation`` decisions:
-2 inlines the block, -1 computes it at the root, ``k >= 0`` under the consumer's ``k``-th loop.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import tvm
from fastsearch.cli.main import load_workload
from fastsearch.ir.target import resolve_target
from fastsearch.search.sample import Postprocessor

from benches.kernel_retime import retime_in_processes


def _records(path: Path) -> list[list]:
    """(trace JSON, mean seconds) of the valid records of a database file, fastest first."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        _, rec = json.loads(line)
        secs = rec[1]
        if secs and max(secs) < 1e9:
            out.append([rec[0], statistics.fmean(secs)])
    return sorted(out, key=lambda r: r[1])


def variants(trace: list, locations: list[int] | None) -> list[tuple[dict[int, int], str]]:
    """Decision overrides of ``trace`` (instructions before postprocessing): every unroll depth,
    times every location in ``locations`` when the trace samples one."""
    insts, _ = trace
    unroll = [i for i, ins in enumerate(insts) if ins[0] == "SampleCategorical"]
    where = [i for i, ins in enumerate(insts) if ins[0] == "SampleComputeLocation"]
    depths = insts[unroll[0]][2][0] if unroll else [None]  # the categorical's candidates
    out = []
    for loc in locations if (locations and where) else [None]:
        for u, depth in enumerate(depths):
            change = {unroll[0]: u} if unroll else {}
            label = f"unroll {depth}"
            if loc is not None:
                change[where[0]] = loc
                label = f"location {loc:>3}, {label}"
            out.append((change, label))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a suite run JSON (benches/suite.py)")
    ap.add_argument("--tuner", choices=["fastsearch", "metaschedule"], default="metaschedule")
    ap.add_argument("--rank", type=int, default=0, help="0: the tuner's best record, 1: the next ...")
    ap.add_argument("--locations", type=int, nargs="*", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args(argv)

    run = json.loads(args.run.read_text())
    kept = args.run.parent / "metaschedule" / args.run.stem
    db_dir = kept if args.tuner == "metaschedule" and kept.exists() else Path(run["work_dir"]) / args.tuner
    func = load_workload(run["workload"]).func
    target = resolve_target(None)
    trace, secs = _records(db_dir / "database_tuning_record.json")[args.rank]
    insts, decisions = trace
    cut = next(i for i, ins in enumerate(insts) if ins[0] == "EnterPostproc")
    libs, labels = [], []
    for change, label in variants([insts[:cut], decisions], args.locations):
        decided = {i: d for i, d in decisions if i < cut}
        decided.update(change)
        sch = tvm.s_tir.Schedule(func)
        try:
            tvm.s_tir.Trace.apply_json_to_schedule([insts[:cut], [[i, d] for i, d in decided.items()]], sch)
            if not Postprocessor(func, target).apply(sch):
                print(f"{label}: refused by the postprocessors")
                continue
        except tvm.TVMError as err:
            print(f"{label}: {str(err).splitlines()[0][:120]}")
            continue
        libs.append(tvm.compile(sch.mod, target=target))
        labels.append(label)
    own = {
        insts[i][0]: d
        for i, d in decisions
        if i < cut and insts[i][0].startswith("Sample") and not isinstance(d, list)
    }
    print(f"{run['workload']} {args.tuner} record {args.rank}: tuned {secs * 1e6:.1f} us, decisions {own}")
    per_process = retime_in_processes(libs, func, args.rounds, args.processes)
    for i, label in enumerate(labels):
        times = ", ".join(f"{row[i] * 1e6:.1f}" for row in per_process)
        print(f"  {label}: {times} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
