"""Time TVM's build of each candidate fastsearch measured in one suite run, in the order measured.

A run's build time is the sum over its candidates; this says which candidates it went to, with
each one's genome (rules, tiles, unroll index) and the latency it measured:

    python -m benches.build_times --out-dir ~/fastsearch-runs/suite256 \
        --run run_TBG_0_s2_t256 --first 64 --last 96

Each candidate is replayed from the run's database and compiled with ``tvm.compile`` in this
process, one at a time, so the machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import tvm
from fastsearch.cli.main import load_workload
from fastsearch.database import candidate_key
from fastsearch.ir.vector_math import TIR_PIPELINE
from fastsearch.search.state import state_file

from benches.runs import compile_record, fastsearch_dir, mean_us, records_in_order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True, type=Path, help="a suite's output folder")
    parser.add_argument("--run", required=True, help="run name, e.g. run_TBG_0_s2_t256")
    parser.add_argument("--first", type=int, default=0, help="first candidate (0-based)")
    parser.add_argument("--last", type=int, default=None, help="one past the last candidate")
    args = parser.parse_args(argv)

    run = json.loads((args.out_dir / f"{args.run}.json").read_text())
    work = fastsearch_dir(run, args.out_dir, args.run)
    if work is None:
        parser.error(f"no fastsearch database kept for {args.run} in {args.out_dir}")
    workload = load_workload(run["workload"])
    records = records_in_order(work, workload.func)
    genomes: dict[str, str] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in state_file(work, "main", "genomes.jsonl").read_text().splitlines():
            entry = json.loads(line)
            genomes[entry["key"]] = entry["genome"]
    target = tvm.target.Target(json.loads(run["target"]))
    last = len(records) if args.last is None else min(args.last, len(records))
    took = []
    print("candidate\tbuild_s\tlatency_us\tgenome")
    for i in range(args.first, last):
        rec = records[i]
        start = time.perf_counter()
        compile_record(rec, target, TIR_PIPELINE)
        secs = time.perf_counter() - start
        took.append(secs)
        print(
            f"{i}\t{secs:.2f}\t{mean_us(rec):.1f}\t{genomes.get(candidate_key(rec.trace), '-')}", flush=True
        )
    if took:
        print(f"# {len(took)} candidates: {sum(took):.1f} s, median {statistics.median(took):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
