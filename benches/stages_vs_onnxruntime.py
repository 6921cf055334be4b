"""Where a tuned model gains or loses against onnxruntime, stage by stage.

A whole-model ratio says how far apart two runtimes are, not where. This bench cuts the ONNX
model after chosen tensors (by default :func:`fastsearch.testing.onnx_zoo.stage_cuts`: the last
residual ``Add`` at each image size, and the output), so each cut is a prefix of the model. Each
prefix is compiled with the tuning run's schedules (its work directory's database, through the
same inference pipeline ``tune`` runs) and timed beside onnxruntime running the same prefix, in fresh processes
(:func:`fastsearch.graph.model_timing.time_in_fresh_processes`). A stage's time is the
difference between consecutive prefixes; both runtimes pay for returning the cut tensor in
NCHW, so the differences compare like with like. fastsearch's prefixes are timed together, in
interleaved rounds of the same processes; onnxruntime's each in processes of their own (two
onnxruntime thread pools in one process take each other's cores). Each figure is the prefix's
fastest round: on a shared host a slow spell moves medians timed minutes apart.

    fastsearch tune --model mobilenet-v2 --trials 1000 --work-dir /tmp/mnv2
    python -m benches.stages_vs_onnxruntime --zoo mobilenet-v2 --work-dir /tmp/mnv2 --threads 2

A prefix's function the database has no record for (the cut's own layout transform, mostly)
keeps TVM's default schedule; the table counts them. Use the pipeline and layout the run used.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path


def compile_prefix(model, db, target, out: Path, pipeline: str, layout: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """Compile ``model`` with the tuned schedules of ``db`` (a
    :class:`fastsearch.database.TuningDatabase`) into ``out``; returns how many of its tasks the
    database has a record for, and how many it has. The database is only read: a task it has
    never seen (the cut's transform back to NCHW) is not added to it."""
    import tvm
    from fastsearch.graph.inference import optimize_for_inference, pipeline_steps
    from fastsearch.graph.relax_tasks import apply_database, extract_tasks
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(model, keep_params_in_input=False)
    mod = optimize_for_inference(mod, steps=pipeline_steps(pipeline), layout=layout, target=target)
    fused, tasks = extract_tasks(mod)
    tuned = [t for t in tasks if t.skip is None]
    found = sum(
        db.best(db.commit_workload(t.normalized)) is not None  # an existing workload: nothing written
        for t in tuned
        if t.normalized is not None and db.ms_database.has_workload(t.normalized)
    )
    applied = apply_database(fused, db.ms_database, target)
    tvm.compile(applied, target=target).export_library(str(out))
    return found, len(tuned)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--zoo", help="a zoo model (fastsearch.testing.onnx_zoo)")
    source.add_argument("--onnx", help="an ONNX file")
    parser.add_argument("--work-dir", required=True, help="the tuning run's work directory")
    parser.add_argument("--cuts", help="comma-separated tensor names (default: see the module docs)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pipeline", default="inference")
    parser.add_argument("--layout", default="NCHWc")
    args = parser.parse_args(argv)

    import onnx
    from fastsearch.database import TuningDatabase
    from fastsearch.graph.model_timing import time_in_fresh_processes
    from fastsearch.ir.target import resolve_target
    from fastsearch.testing import onnx_zoo

    model = onnx_zoo.build(args.zoo) if args.zoo else onnx.load(args.onnx)
    feeds = onnx_zoo.model_input(model, seed=1)
    cuts = args.cuts.split(",") if args.cuts else onnx_zoo.stage_cuts(model)
    db, target = TuningDatabase(args.work_dir), resolve_target("llvm")
    libraries, onnx_files, tuned = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="fastsearch_stages_") as tmp:
        for k, cut in enumerate(cuts):
            sub = onnx_zoo.prefix(model, cut)
            onnx_files[cut] = Path(tmp) / f"prefix{k}.onnx"
            onnx.save(sub, onnx_files[cut])
            libraries[cut] = Path(tmp) / f"prefix{k}.so"
            tuned[cut] = compile_prefix(sub, db, target, libraries[cut], args.pipeline, args.layout)
        # fastsearch's prefixes in the same processes, in interleaved rounds, so that its stages
        # subtract figures timed together; onnxruntime's each in processes of their own.
        ours = time_in_fresh_processes(
            {cut: str(path) for cut, path in libraries.items()},
            list(feeds.values()),
            args.threads,
            processes=args.processes,
            rounds=args.rounds,
        )
        rows = []
        for cut in cuts:
            theirs = time_in_fresh_processes(
                {},
                list(feeds.values()),
                args.threads,
                onnx_file=onnx_files[cut],
                processes=args.processes,
                rounds=args.rounds,
            )
            # The fastest round of each: onnxruntime's prefixes run in different processes, at
            # different times, and a shared host's slow spells move their medians.
            rows.append(
                (cut, min(ours.times[cut]) * 1e6, min(theirs.times["onnxruntime"]) * 1e6, *tuned[cut])
            )
            print(f"{cut}: fastsearch {rows[-1][1]:.1f} us, onnxruntime {rows[-1][2]:.1f} us", flush=True)
    name = args.zoo or args.onnx
    print(
        f"\n`{name}`, {args.threads} threads; fastsearch's prefixes interleaved in {args.processes} fresh "
        f"processes x {args.rounds} rounds, onnxruntime's each in {args.processes} of their own; "
        "fastest rounds (us)\n"
    )
    print(
        "| up to | fastsearch | onnxruntime | stage: fastsearch | stage: onnxruntime | stage ratio | tuned tasks |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    before = (0.0, 0.0)
    for cut, ours, ort, found, total in rows:
        stage = (ours - before[0], ort - before[1])
        ratio = f"{stage[0] / stage[1]:.2f}" if stage[1] > 0 else "-"
        print(
            f"| {cut} | {ours:.1f} | {ort:.1f} | {stage[0]:.1f} | {stage[1]:.1f} | {ratio} | {found}/{total} |"
        )
        before = (ours, ort)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
