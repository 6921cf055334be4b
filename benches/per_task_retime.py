"""Each task of a model alone: two databases' best kernels re-timed side by side.

For every workload of the first database that the second also holds, each database's best
schedule is compiled (``compile_tir``) and timed standalone, interleaved, on the same random
arguments; the tuning-time figures of both records are printed next to the re-timings, and the
sums weighted by each task's calls come last (weights from ``model_e2e.py``'s result.json).
It tells kernel-level differences from what happens only inside the model (cold caches between
kernels). The databases are read from copies, so nothing is written into them.

    python -m benches.per_task_retime /tmp/e2e_r18

(the ``--out-dir`` of a ``model_e2e.py`` run; the repository keeps only runs' summaries)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import tvm
from fastsearch.database import mean_run_secs
from fastsearch.ir.target import resolve_target
from fastsearch.measure.measurer import random_arguments
from tvm.s_tir import meta_schedule as ms
from tvm_ffi import structural_equal


def _args(func: tvm.tirx.PrimFunc, dev: tvm.runtime.Device) -> list:
    return [tvm.runtime.tensor(a, dev) for a in random_arguments(ms.arg_info.ArgInfo.from_prim_func(func))]


def _mean_us(record: object) -> float:
    return mean_run_secs([float(s) for s in record.run_secs]) * 1e6  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "e2e_dir", help="a model_e2e.py --out-dir (fastsearch_work, metaschedule_work, result.json)"
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--target", default=None)
    args = parser.parse_args(argv)
    e2e = Path(args.e2e_dir)
    target = resolve_target(args.target)
    weights = {
        t["best_us"]: t["weight"]
        for t in json.loads((e2e / "result.json").read_text())["models"]["fastsearch"]["tasks"]
    }
    dev = tvm.cpu()
    with tempfile.TemporaryDirectory() as tmp:
        dbs = []
        for name in ("fastsearch_work", "metaschedule_work"):
            shutil.copytree(e2e / name, Path(tmp) / name)
            dbs.append(ms.database.JSONDatabase(work_dir=str(Path(tmp) / name)))
        mods: list[tvm.IRModule] = []
        for rec in dbs[0].get_all_tuning_records():
            if not any(structural_equal(rec.workload.mod, m) for m in mods):
                mods.append(rec.workload.mod)
        print(
            f"{'fastsearch us':>14} {'MetaSchedule us':>16} {'ratio':>6} | tuning: {'fastsearch':>10} {'MetaSchedule':>12} {'ratio':>6}"
        )
        sums = np.zeros(4)
        for mod in mods:
            bests = [db.get_top_k(db.commit_workload(mod), 1) for db in dbs]
            scheds = [ms.tir_integration.compile_tir(db, mod, target) for db in dbs]
            if not all(bests) or None in scheds:
                continue
            libs = [tvm.compile(s.mod, target=target).jit() for s in scheds]
            call = _args(mod["main"], dev)
            timers = [lib.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=100) for lib in libs]
            for timer in timers:
                timer(*call)
            times: list[list[float]] = [[], []]
            for r in range(args.rounds):
                for k in (0, 1) if r % 2 == 0 else (1, 0):
                    times[k].append(timers[k](*call).mean * 1e6)
            now = [statistics.median(t) for t in times]
            then = [_mean_us(b[0]) for b in bests]
            weight = min(weights.items(), key=lambda kv: abs((kv[0] or 0.0) - then[0]))[1]
            sums += weight * np.array(now + then)
            print(
                f"{now[0]:14.1f} {now[1]:16.1f} {now[0] / now[1]:6.2f} | tuning: {then[0]:10.1f} {then[1]:12.1f} "
                f"{then[0] / then[1]:6.2f}  x{weight}",
                flush=True,
            )
        print(
            f"weighted sums: re-timed {sums[0] / 1e3:.2f} ms vs {sums[1] / 1e3:.2f} ms ({sums[0] / sums[1]:.3f}); "
            f"during tuning {sums[2] / 1e3:.2f} ms vs {sums[3] / 1e3:.2f} ms ({sums[2] / sums[3]:.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
