"""How the analytical model's two vectorization paths compare with measurement.

A tiled block is vectorized by TVM (its innermost loop walks the output's contiguous axis) or,
when that axis has no innermost extent, by LLVM: TVM unrolls the small inner nest and LLVM's
loop vectorizer takes the loop above it (`model::analytical::llvm_vector_loop`). This draws
candidates from fastsearch's sketches, keeps the best-estimated of each path, builds them and
times them side by side in one fresh process, and prints measured time against the estimate:

    python -m benches.vector_paths C2D:1 DEP:1 --per-path 12
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import tvm
from fastsearch import _core
from fastsearch.cli.main import load_workload
from fastsearch.ir.machine import fma_per_cycle, vector_bytes
from fastsearch.ir.target import resolve_target
from fastsearch.ir.tir_import import program_json
from fastsearch.search.sample import Postprocessor, base_schedule, replay

from benches.kernel_retime import retime_in_processes

#: The sketches' unroll depths (`sketch::UNROLL_CANDIDATES`), which genomes index.
UNROLL_DEPTHS = (0, 16, 64, 512)


def probe(workload: str, per_path: int, draws: int, seed: int) -> None:
    func = load_workload(workload).func
    target = resolve_target(None)
    cores, vbytes, fmas = int(target.attrs["num-cores"]), vector_bytes(target), fma_per_cycle(target)
    prog = program_json(func)
    names = list(_core.SKETCH_FEATURE_NAMES)
    steps_col = names.index("log_llvm_unrolled_steps")
    pairs = _core.Program(prog).sample_genomes(
        _core.Target(cores, vector_bytes=vbytes, fma_per_cycle=fmas), draws, seed
    )
    genomes = [g for _, g in pairs]
    rows = np.asarray(
        _core.Program(prog).sketch_feature_rows(
            _core.Target(cores, vector_bytes=vbytes, fma_per_cycle=fmas), genomes
        )
    )
    scores = np.array(
        _core.Program(prog).analytical_scores(
            _core.Target(cores, vector_bytes=vbytes, fma_per_cycle=fmas), genomes
        )
    )
    by_path = {
        "LLVM": [i for i in range(len(genomes)) if rows[i, steps_col] > 0],
        "TVM": [i for i in range(len(genomes)) if rows[i, steps_col] == 0],
    }
    chosen = [i for ids in by_path.values() for i in sorted(ids, key=lambda i: -scores[i])[:per_path]]
    base, post = base_schedule(func), Postprocessor(func, target)
    libs, kept = [], []
    for i in chosen:
        sch = replay(base, pairs[i][0], post)
        if sch is not None:
            libs.append(tvm.compile(sch.mod, target=target))
            kept.append(i)
    times = retime_in_processes(libs, func, 3, 1)[0]
    print(f"\n{workload}: {len(by_path['LLVM'])} of {draws} draws on the LLVM path")
    print(
        "measured us | estimate / best estimate | path | unrolled steps | unroll | tiles of the tiled block | other rules"
    )
    for i, t in sorted(zip(kept, times, strict=True), key=lambda x: x[1]):
        g = json.loads(genomes[i])
        tiled = next(b for b, r in g["rules"].items() if isinstance(r, dict) and "Tile" in r)
        others = [r for b, r in g["rules"].items() if b != tiled]
        steps = 2 ** rows[i, steps_col] - 1
        path = "LLVM" if rows[i, steps_col] > 0 else "TVM"
        print(
            f"{t * 1e6:9.1f} | {math.exp(scores.max() - scores[i]):5.2f} | {path:4} | {steps:4.0f} | "
            f"{UNROLL_DEPTHS[g['unroll']]:3} | {g['tiles'][tiled]} | {others}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="+")
    ap.add_argument("--per-path", type=int, default=12)
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    for wl in args.workloads:
        probe(wl, args.per_path, args.draws, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
