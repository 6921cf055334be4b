"""The public ``fastsearch.extract_features`` against TVM's replay plus ``PerStoreFeature``, on
fresh candidates of one workload, everything a user pays included.

Candidates come from MetaSchedule's own design spaces (TVM-postprocessed schedules). Each round
takes ``--candidates`` candidates not seen in an earlier round:

- TVM: replay each trace on a fresh schedule, then ``PerStoreFeature.extract_from`` the batch;
- fastsearch: ``fastsearch.extract_features(func, traces)``: the TVM traces are converted to
  JSON and the function imported inside the call, then the engine replays and extracts in Rust.

The two alternate which goes first, round by round.

The first round's times are printed apart (fastsearch imports the function then; later calls
on the same function reuse it), then the median over the other rounds, and whether the values
agree row for row::

    python -m benches.public_features_speed --workload C2D:1 --candidates 24 --rounds 16

``--target`` takes any target fastsearch resolves (this CPU by default); a CUDA one
(``--target nvidia/nvidia-h100``) times CUDA candidates (MetaSchedule's CUDA design spaces and
postprocessors, VerifyGPUCode included) and the GPU features of both sides.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import tvm
from fastsearch import extract_features
from fastsearch.costmodel.features import design_space_candidates
from fastsearch.ir.target import resolve_target
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="C2D:1", help="FAMILY:INDEX of TVM's te_workload suite")
    ap.add_argument("--candidates", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--target", default=None, help="a target or tag (default: this CPU)")
    args = ap.parse_args()
    family, index = args.workload.split(":")
    func = te_workload.create_te_workload(family, int(index))
    target = resolve_target(args.target)
    mod = tvm.IRModule({"main": func})
    schs = design_space_candidates(func, target, args.candidates * args.rounds)
    rounds = [
        schs[i : i + args.candidates] for i in range(0, len(schs) - args.candidates + 1, args.candidates)
    ]
    if not rounds:
        raise SystemExit(f"{len(schs)} candidates pass the postprocessors: fewer than one round")
    ctx = ms.TuneContext(mod=mod, target=target, num_threads=1)
    arg_info = ms.arg_info.ArgInfo.from_prim_func(func)
    extractor = ms.feature_extractor.PerStoreFeature()

    def tvm_features(traces: list) -> list[np.ndarray]:
        cands = []
        for t in traces:
            sch = tvm.s_tir.Schedule(mod)
            t.apply_to_schedule(sch, remove_postproc=False)
            cands.append(ms.MeasureCandidate(sch, arg_info))
        return [x.numpy() for x in extractor.extract_from(ctx, cands)]

    times: dict[str, list[float]] = {"tvm": [], "fastsearch": []}
    equal = total = 0
    for r, batch in enumerate(rounds):
        traces = [s.trace for s in batch]
        # Each side goes first in every other round: the one that runs second finds the other's
        # worker threads still spinning on the two cores.
        sides = ["tvm", "fastsearch"] if r % 2 == 0 else ["fastsearch", "tvm"]
        out = {}
        for side in sides:
            t0 = time.perf_counter()
            out[side] = tvm_features(traces) if side == "tvm" else extract_features(func, traces, target)
            times[side].append(time.perf_counter() - t0)
        for a, b in zip(out["fastsearch"], out["tvm"]):
            total += 1
            equal += int(a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-5))
    n = len(rounds[0])
    first = times["tvm"][0] / times["fastsearch"][0]
    rest = [t / f for t, f in zip(times["tvm"][1:], times["fastsearch"][1:])]
    print(f"workload {args.workload}, {n} candidates a round, {len(rounds)} rounds, target {target}")
    print(
        f"first round: TVM {1e3 * times['tvm'][0]:.1f} ms, fastsearch {1e3 * times['fastsearch'][0]:.1f} ms "
        f"({first:.1f}x)"
    )
    if rest:
        print(
            f"later rounds (median): TVM {1e3 * statistics.median(times['tvm'][1:]):.1f} ms, fastsearch "
            f"{1e3 * statistics.median(times['fastsearch'][1:]):.2f} ms ({statistics.median(rest):.1f}x)"
        )
        after_tvm = [x for i, x in enumerate(rest, 1) if i % 2 == 0]
        after_ours = [x for i, x in enumerate(rest, 1) if i % 2 == 1]
        if after_tvm and after_ours:
            print(
                f"  by order: {statistics.median(after_tvm):.1f}x with TVM first, "
                f"{statistics.median(after_ours):.1f}x with fastsearch first"
            )
    print(f"equal row for row: {equal} of {total} candidates")


if __name__ == "__main__":
    main()
