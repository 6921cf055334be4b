"""A whole model end to end: ``fastsearch.tune`` vs MetaSchedule's ``tune_relax``, same trials.

Both tuners get the same Relax model (built in code, random weights), target (host CPU with
``mcpu`` and ``num-cores``), total number of measured trials and seed. fastsearch fuses the
model with its own partitioner; MetaSchedule gets the model fused by TVM's pipeline
(LegalizeOps, AnnotateTIROpPattern, FuseOps, FuseTIR), which yields the same groups. Each
tuned model is compiled from its tuner's database, checked against the untuned model's output
on random inputs, and re-timed here in interleaved rounds with one ``time_evaluator`` setting.

    python benches/model_e2e.py --model resnet-18 --trials 500 --out-dir benches/results/resnet18
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from fastsearch.measure import build_module
from fastsearch.model_timing import paired_ratios, time_interleaved
from fastsearch.models import load_model, model_inputs
from fastsearch.partition import prepare
from fastsearch.target import resolve_target
from fastsearch.tune import tune
from run_meta import run_metadata
from tvm import relax
from tvm.s_tir import meta_schedule as ms


def fuse_like_tvm(mod: tvm.IRModule) -> tvm.IRModule:
    """The model as ``tune_relax`` expects it: legalized, fused by FuseOps, FuseTIR applied."""
    return relax.transform.FuseTIR()(relax.transform.FuseOps()(prepare(mod)))


def run_fastsearch(mod: tvm.IRModule, target: tvm.target.Target, trials: int, seed: int, work: Path) -> dict:
    t0 = time.perf_counter()
    result = tune(mod, target, trials=trials, seed=seed, work_dir=work)
    wall = time.perf_counter() - t0
    tasks = [
        {
            "task": name,
            "weight": t.weight,
            "trials": t.trials,
            "best_us": t.best_latency_us,
            "skipped": t.skipped,
        }
        for name, t in result.tasks.items()
    ]
    return {"wall_s": wall, "tasks": tasks, "exe": result.compile(), "estimate_us": result.best_latency_us}


def run_metaschedule(
    mod: tvm.IRModule, target: tvm.target.Target, trials: int, seed: int, work: Path, per_iter: int
) -> dict:
    fused = fuse_like_tvm(mod)
    t0 = time.perf_counter()
    db = ms.relax_integration.tune_relax(
        mod=fused,
        params={},
        target=target,
        work_dir=str(work),
        max_trials_global=trials,
        num_trials_per_iter=per_iter,
        builder=ms.builder.LocalBuilder(f_build=build_module),
        seed=seed,
    )
    wall = time.perf_counter() - t0
    tasks = []
    estimate = 0.0
    for task in ms.relax_integration.extract_tasks(fused, target):
        records = db.get_top_k(db.commit_workload(task.dispatched[0]), 10**6)
        best = min((statistics.fmean(float(s) for s in r.run_secs) for r in records), default=None)
        tasks.append(
            {
                "task": task.task_name,
                "weight": int(task.weight),
                "trials": len(records),
                "best_us": best * 1e6 if best is not None else None,
            }
        )
        estimate += int(task.weight) * (best or 0.0) * 1e6
    # compile_relax runs TVM's whole pipeline (legalize, fuse, apply the database) itself: it
    # takes the model before fusion.
    exe = ms.relax_integration.compile_relax(db, mod, target, None)
    return {"wall_s": wall, "tasks": tasks, "exe": exe, "estimate_us": estimate}


def recompile(mod: tvm.IRModule, target: tvm.target.Target, work: Path, earlier: dict) -> dict:
    """A tuner's model compiled again from its database (``--compile-only``): TVM's pipeline
    with MetaScheduleApplyDatabase, which reads fastsearch's database as it reads its own."""
    db = ms.database.JSONDatabase(work_dir=str(work))
    exe = ms.relax_integration.compile_relax(db, mod, target, None)
    keep = {k: earlier[k] for k in ("wall_s", "tasks", "estimate_us") if k in earlier}
    return {**keep, "exe": exe}


def report(res: dict) -> str:
    fs, ms_ = res["fastsearch"], res["metaschedule"]
    paired = paired_ratios(fs["times_s"], ms_["times_s"])  # rounds share the machine's state
    reused = res.get("metaschedule_reused_from")
    lines = [
        (
            f"Model `{res['model']}`, {res['trials']} trials each, seed {res['seed']}; target "
            f"`{res['target']}`; host {res['host']}; {res['date']}."
            + (f" MetaSchedule's database and tuning figures are those of `{reused}`." if reused else "")
        ),
        "",
        (
            "| | end-to-end latency (ms, median of re-timings) | vs untuned | tuning wall time (s) | "
            "sum of weighted task bests during tuning (ms) | output matches untuned |"
        ),
        "|---|---:|---:|---:|---:|---|",
    ]
    base = res["untuned"]["median_ms"]
    for name, r in (
        ("untuned (TVM's default schedules)", res["untuned"]),
        ("fastsearch", fs),
        ("MetaSchedule", ms_),
    ):
        est = f"{r['estimate_us'] / 1e3:.2f}" if r.get("estimate_us") else "-"
        wall = f"{r['wall_s']:.0f}" if r.get("wall_s") else "-"
        match = {True: "yes", False: "NO", None: "-"}[r.get("matches")]
        lines.append(
            f"| {name} | {r['median_ms']:.3f} | {base / r['median_ms']:.2f}x | {wall} | {est} | {match} |"
        )
    lines += [
        "",
        (
            f"**End-to-end latency ratio fastsearch / MetaSchedule: {fs['median_ms'] / ms_['median_ms']:.3f}** "
            f"(ratio of the medians; the median of the {len(paired)} per-round ratios is {statistics.median(paired):.3f}, "
            f"quartiles {paired[len(paired) // 4]:.3f}-{paired[(3 * len(paired)) // 4]:.3f}); "
            f"tuning wall-time ratio {fs['wall_s'] / ms_['wall_s']:.2f}."
        ),
        "",
        "| task | weight | fastsearch trials | fastsearch best (us) | MetaSchedule trials | MetaSchedule best (us) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ms_tasks = {t["task"]: t for t in ms_["tasks"]}
    for t in fs["tasks"]:
        m = ms_tasks.get(t["task"], {})
        fb = f"{t['best_us']:.1f}" if t.get("best_us") is not None and np.isfinite(t["best_us"]) else "-"
        mb = f"{m['best_us']:.1f}" if m.get("best_us") is not None else "-"
        lines.append(
            f"| {t['task']} | {t['weight']} | {t['trials']} | {fb} | {m.get('trials', '-')} | {mb} |"
        )
    unmatched = [t["task"] for t in ms_["tasks"] if t["task"] not in {f["task"] for f in fs["tasks"]}]
    if unmatched:
        lines.append("")
        lines.append(f"MetaSchedule tasks without a fastsearch task of the same name: {', '.join(unmatched)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet-18")
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default=None, help="default: this CPU, with mcpu and num-cores")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved re-timing rounds")
    parser.add_argument(
        "--ms-trials-per-iter", type=int, default=16, help="MetaSchedule's batch (fastsearch's is at most 16)"
    )
    parser.add_argument("--out-dir", required=True)
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="no tuning: compile both tuners' databases in --out-dir again (TVM's pipeline and "
        "MetaScheduleApplyDatabase for both) and re-time; tuning figures kept from result.json",
    )
    parser.add_argument(
        "--reuse-metaschedule",
        default=None,
        metavar="DIR",
        help="tune fastsearch only; MetaSchedule's database and tuning figures are copied from this "
        "earlier model_e2e.py --out-dir (same model, trials and seed)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = resolve_target(args.target)
    mod = load_model(args.model)
    inputs = model_inputs(mod, seed=1)

    if args.compile_only:
        earlier = json.loads((out / "result.json").read_text())
        fs = recompile(mod, target, out / "fastsearch_work", earlier["fastsearch"])
        mst = recompile(mod, target, out / "metaschedule_work", earlier["metaschedule"])
    else:
        print(f"fastsearch: {args.model}, {args.trials} trials ...", file=sys.stderr, flush=True)
        fs = run_fastsearch(mod, target, args.trials, args.seed, out / "fastsearch_work")
        if args.reuse_metaschedule:
            src = Path(args.reuse_metaschedule)
            shutil.copytree(src / "metaschedule_work", out / "metaschedule_work", dirs_exist_ok=True)
            earlier = json.loads((src / "result.json").read_text())
            mst = recompile(mod, target, out / "metaschedule_work", earlier["metaschedule"])
        else:
            print(f"MetaSchedule: {args.model}, {args.trials} trials ...", file=sys.stderr, flush=True)
            mst = run_metaschedule(
                mod, target, args.trials, args.seed, out / "metaschedule_work", args.ms_trials_per_iter
            )
    untuned = tvm.compile(mod, target=target)

    times, outputs = time_interleaved([untuned, fs["exe"], mst["exe"]], inputs, args.repeat)
    ref = outputs[0]
    scale = float(np.abs(ref).max()) or 1.0
    res: dict[str, Any] = {
        "model": args.model,
        "trials": args.trials,
        "seed": args.seed,
        **run_metadata("model_e2e.py", target, argv),
    }
    if args.reuse_metaschedule:
        res["metaschedule_reused_from"] = str(args.reuse_metaschedule)
    for name, r, t, o in zip(("untuned", "fastsearch", "metaschedule"), ({}, fs, mst), times, outputs):
        entry = {k: v for k, v in r.items() if k != "exe"}
        entry["times_s"] = t
        entry["median_ms"] = statistics.median(t) * 1e3
        entry["matches"] = (
            None if name == "untuned" else bool(np.allclose(o, ref, rtol=1e-3, atol=1e-3 * scale))
        )
        entry["max_abs_diff"] = float(np.abs(o - ref).max())
        res[name] = entry
    (out / "result.json").write_text(json.dumps(res, indent=1, default=float))
    text = report(res)
    (out / "e2e.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
