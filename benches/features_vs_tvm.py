"""Per-store feature extraction, fastsearch vs MetaSchedule's PerStoreFeature, on the same
candidates (MetaSchedule design-space candidates, TVM-postprocessed), same values.

TVM's side: replay each full trace on a fresh schedule (as its search does before scoring),
then ``PerStoreFeature.extract_from`` on the batch. Ours: ``extract_features_json`` on the trace
JSON (the replay happens in our engine, in parallel). Trace-to-JSON conversion is done up front
and not timed. Reports candidates per second for both, and the ratio.

    python -m benches.features_vs_tvm --per-family 40 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import tvm
from fastsearch.costmodel.features import design_space_candidates, extract_features_json
from fastsearch.errors import FastsearchError
from fastsearch.ir.loop_nest import trace_json
from fastsearch.ir.tir_import import program_json
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

FAMILIES = ["C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG"]


def tvm_side(mod, traces, arg_info, ctx, extractor) -> list[np.ndarray]:
    """Replays each trace on a fresh schedule, then extracts the batch."""
    cands = []
    for t in traces:
        sch = tvm.s_tir.Schedule(mod)
        t.apply_to_schedule(sch, remove_postproc=False)
        cands.append(ms.MeasureCandidate(sch, arg_info))
    return [x.numpy() for x in extractor.extract_from(ctx, cands)]


def replays(program: str, text: str) -> bool:
    try:
        extract_features_json(program, [text])
    except FastsearchError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-family", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    target = tvm.target.Target(
        {"kind": "llvm", "num-cores": args.threads, "mcpu": tvm.target.codegen.llvm_get_system_cpu()}
    )
    extractor = ms.feature_extractor.PerStoreFeature()
    total = {"n": 0, "tvm": 0.0, "ours": 0.0, "equal": 0}
    print(f"{'family':<6} {'cands':>5} {'TVM cand/s':>11} {'ours cand/s':>12} {'speedup':>8} {'equal':>6}")
    for family in args.families.split(","):
        func = te_workload.create_te_workload(family, 0)
        mod = tvm.IRModule({"main": func})
        schs = design_space_candidates(func, target, args.per_family)
        program = program_json(func)
        # Time only candidates our engine replays (one it cannot is reported, not timed).
        supported = [s for s in schs if replays(program, trace_json(s.trace))]
        skipped = len(schs) - len(supported)
        schs = supported
        traces = [s.trace for s in schs]
        texts = [trace_json(t) for t in traces]
        ctx = ms.TuneContext(mod=mod, target=target, num_threads=args.threads)
        arg_info = ms.arg_info.ArgInfo.from_prim_func(func)

        sides = {
            "tvm": (tvm_side, (mod, traces, arg_info, ctx, extractor)),
            "ours": (extract_features_json, (program, texts)),
        }
        best = {}
        results = {}
        for name, (fn, fn_args) in sides.items():
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                results[name] = fn(*fn_args)
                times.append(time.perf_counter() - t0)
            best[name] = min(times)
        equal = sum(
            a.shape == b.shape and bool(np.all(np.abs(a - b) <= 1e-3))
            for a, b in zip(results["ours"], results["tvm"])
        )
        n = len(schs)
        total["n"] += n
        total["tvm"] += best["tvm"]
        total["ours"] += best["ours"]
        total["equal"] += equal
        print(
            f"{family:<6} {n:>5} {n / best['tvm']:>11.1f} {n / best['ours']:>12.1f} "
            f"{best['tvm'] / best['ours']:>7.1f}x {equal:>6}"
            + (f"  ({skipped} not replayed)" if skipped else "")
        )
    n = total["n"]
    print(
        f"{'all':<6} {n:>5} {n / total['tvm']:>11.1f} {n / total['ours']:>12.1f} "
        f"{total['tvm'] / total['ours']:>7.1f}x {total['equal']:>6}"
    )


if __name__ == "__main__":
    main()
