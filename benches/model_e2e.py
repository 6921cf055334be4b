"""A whole model end to end: fastsearch against TVM's recommended tuning path and onnxruntime.

Both tuners get the same model, target (this CPU, ``mcpu`` and ``num-cores``), total number of
trials and seed, with kernels on every core (``TVM_NUM_THREADS`` is set to the core count before
anything runs, for tuning and timing alike):

- **fastsearch**: ``fastsearch.tune(mod, target, trials=N)`` with its defaults (the inference
  pipeline, its partitioner, the gradient scheduler with floors), then ``result.compile()``;
- **MetaSchedule**: ``relax.pipeline.static_shape_tuning_pipeline(N, target,
  max_trials_per_task=ceil(N / tasks))`` (TVM's recommended path for static shapes:
  DecomposeOpsForInference, CanonicalizeBindings, the zero pipeline's legalization, constant
  folding and FuseOps, ``MetaScheduleTuneIRMod``), then ``tvm.compile``. The per-task cap is
  its docstring's advice: without it, 64 trials go to each task in turn and a few hundred
  trials tune only the first few tasks. Its LocalBuilder builds with fastsearch's build function,
  as in every kernel bench (``--ms-default-builder`` for its own): MetaSchedule's default build
  imports ``tvm.s_tir.tensor_intrin`` in each fresh worker (35 s on a 2-vCPU Zen 3), and the
  pipeline's builder has a 30 s timeout that counts that import, so with it most batches fail
  to build at all;
- **onnxruntime** (``--zoo`` models, when installed), all graph optimizations, same threads;
- TVM's untuned build of the imported model.

Every compiled model is exported and timed by :func:`fastsearch.graph.model_timing.time_in_fresh_processes`:
``--processes`` fresh processes of ``--rounds`` interleaved rounds, never the process that
tuned. Outputs are checked against ONNX's reference evaluator (``--zoo``) or the untuned model.

    python benches/model_e2e.py --zoo mobilenet-v2-small --trials 300 --out-dir /tmp/e2e_mnv2s

Writes ``result.json`` and ``e2e.md`` into ``--out-dir`` (raw databases stay there: keep them
out of git); ``--report`` writes ``e2e.md`` again from ``result.json``. Per-round ratios are
the figure to read: on this shared 2-vCPU machine a model's rounds spread over 2x with both
cores busy, and rounds timed together share that state.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def _set_threads() -> int:
    from fastsearch.ir.target import physical_cores

    cores = physical_cores()
    os.environ.setdefault("TVM_NUM_THREADS", str(cores))  # before TVM's thread pool starts
    return int(os.environ["TVM_NUM_THREADS"])


def _records(work: Path) -> int:
    path = work / "database_tuning_record.json"
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.exists() else 0


def run_fastsearch(mod: Any, target: Any, trials: int, seed: int, work: Path, measure: Any = None) -> dict:
    from fastsearch.tuning.tune import tune

    t0 = time.perf_counter()
    result = tune(mod, target, trials=trials, seed=seed, work_dir=work, measure=measure)
    wall = time.perf_counter() - t0
    tasks = [
        {
            "task": n,
            "weight": t.weight,
            "trials": t.trials,
            "best_us": t.best_latency_us,
            "skipped": t.skipped,
        }
        for n, t in result.tasks.items()
    ]
    return {"wall_s": wall, "tasks": tasks, "exe": result.compile(), "records": _records(work)}


@contextlib.contextmanager
def _pipeline_builder(default_builder: bool) -> Iterator[None]:
    """Within the block, the LocalBuilder that TVM's pipeline creates by name (``"local"``) builds
    with fastsearch's build function: MetaSchedule's own minus the tensor-intrinsic import that
    every fresh build worker repeats. The pipeline takes no builder argument."""
    from fastsearch.measure.measurer import build_module_tvm_lowering
    from tvm.s_tir.meta_schedule import builder as ms_builder

    if default_builder:
        yield
        return
    original = ms_builder.LocalBuilder

    class _Builder(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("f_build", build_module_tvm_lowering)
            super().__init__(*args, **kwargs)

    ms_builder.LocalBuilder = _Builder
    try:
        yield
    finally:
        ms_builder.LocalBuilder = original


def run_metaschedule(
    mod: Any, target: Any, trials: int, seed: int, work: Path, default_builder: bool = False
) -> dict:
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    del seed  # static_shape_tuning_pipeline takes no seed: MetaSchedule seeds itself
    # Its docstring's advice: without max_trials_per_task, 64 trials go to each task in turn and
    # a budget of a few hundred never reaches most tasks. Split the budget over the tasks TVM's
    # pipeline extracts (the same passes it runs before tuning).
    with target:
        fused = tvm.transform.Sequential(
            [
                relax.transform.DecomposeOpsForInference(),
                relax.transform.CanonicalizeBindings(),
                relax.pipeline.zero_pipeline(),
            ]
        )(mod)
    n_tasks = len(ms.relax_integration.extract_tasks(fused, target))
    per_task = max(1, -(-trials // n_tasks))
    t0 = time.perf_counter()
    with _pipeline_builder(default_builder):
        tuned = relax.pipeline.static_shape_tuning_pipeline(
            total_trials=trials, target=target, work_dir=str(work), max_trials_per_task=per_task
        )(mod)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "builder": "MetaSchedule's default_build"
        if default_builder
        else "fastsearch's build_module_tvm_lowering",
        "exe": tvm.compile(tuned, target=target),
        "records": _records(work),
        "tasks": n_tasks,
        "max_trials_per_task": per_task,
    }


def report(res: dict) -> str:
    rows = res["models"]
    base = "onnxruntime" if "onnxruntime" in rows else "untuned"
    from benches.runs import busy_warning

    warning = busy_warning(res.get("other_cpu_load", math.nan))
    lines = ([warning, ""] if warning else []) + [
        (
            f"`{res['model']}`, {res['trials']} trials each, seed {res['seed']}, {res['threads']} threads; "
            f"target `{res['target']}`; {res['host']}; {res['date']}. Medians of {res['processes']} fresh "
            f"processes x {res['rounds']} interleaved rounds."
        ),
        "",
        (
            f"| | latency (us), median | fastest round | vs {base} | vs TVM's pipeline | tuning wall (s) | "
            "records | output |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, label in (
        ("onnxruntime", "onnxruntime"),
        ("metaschedule", "MetaSchedule (`static_shape_tuning_pipeline`)"),
        ("fastsearch", "**fastsearch `tune`**"),
        ("untuned", "TVM, untuned"),
    ):
        if name not in rows:
            continue
        r = rows[name]
        wall = f"{r['wall_s']:.0f}" if r.get("wall_s") else "-"
        recs = str(r["records"]) if r.get("records") is not None else "-"
        lines.append(
            f"| {label} | {r['median_us']:.1f} | {min(r['times_s']) * 1e6:.1f} | {r['vs_' + base]:.2f} | "
            f"{r['vs_metaschedule']:.2f} | {wall} | "
            f"{recs} | {'ok' if r['matches'] else 'DIFFERS'} ({r['max_abs_diff']:.1e}) |"
        )
    fs = rows["fastsearch"]
    lines += [
        "",
        f"fastsearch / TVM's pipeline: **{fs['vs_metaschedule']:.3f}** (median of per-round ratios)"
        + (f"; fastsearch / onnxruntime: **{fs['vs_onnxruntime']:.3f}**" if "onnxruntime" in rows else "")
        + ".",
        "",
        "| fastsearch task | weight | trials | best (us) |",
        "|---|---:|---:|---:|",
    ]
    for t in fs["tasks"]:
        best = f"{t['best_us']:.1f}" if t.get("best_us") else (t.get("skipped") or "-")
        lines.append(f"| {t['task']} | {t['weight']} | {t['trials']} | {best} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--zoo", help="an ONNX zoo model (fastsearch.testing.onnx_zoo: ZOO or SMALL)")
    which.add_argument("--model", help="a built-in Relax model (fastsearch.testing.relax_models)")
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default=None, help="default: this CPU, with mcpu and num-cores")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument(
        "--reuse-metaschedule",
        default=None,
        metavar="DIR",
        help="copy MetaSchedule's tuned run from this --out-dir",
    )
    parser.add_argument(
        "--ms-default-builder",
        action="store_true",
        help="MetaSchedule's own build function (imports all tensor intrinsics in every build worker)",
    )
    parser.add_argument(
        "--cache",
        choices=["warm", "flush"],
        default=None,
        help="fastsearch's measurements: kernels timed in a warm loop, or each call after flushing "
        "all arguments but the first (enable_cpu_cache_flush); default: fastsearch's own",
    )
    parser.add_argument("--report", action="store_true", help="only write e2e.md again from result.json")
    args = parser.parse_args(argv)
    if args.report:
        text = report(json.loads((Path(args.out_dir) / "result.json").read_text()))
        (Path(args.out_dir) / "e2e.md").write_text(text + "\n")
        print(text)
        return 0
    if not (args.zoo or args.model):
        parser.error("give --zoo NAME or --model NAME")
    threads = _set_threads()

    import tvm
    from fastsearch.graph.model_timing import model_inputs, paired_ratios, time_in_fresh_processes
    from fastsearch.ir.target import resolve_target
    from fastsearch.testing.relax_models import load_model

    from benches.run_meta import run_metadata
    from benches.runs import other_cpu_load

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = resolve_target(args.target)
    onnx_file = None
    reference = None
    if args.zoo:
        import onnx
        from fastsearch.testing import onnx_zoo

        model = onnx_zoo.build(args.zoo)
        onnx_file = out / "model.onnx"
        onnx.save(model, str(onnx_file))
        mod = onnx_zoo.load(model)
    else:
        mod = load_model(args.model)
    inputs = model_inputs(mod, seed=1)
    if args.zoo:
        feeds = {v.name: a for v, a in zip(model.graph.input, inputs)}
        reference = onnx_zoo.reference_outputs(model, feeds)[0]

    print(f"fastsearch: {args.zoo or args.model}, {args.trials} trials ...", file=sys.stderr, flush=True)
    from fastsearch.measure.measurer import MeasureConfig

    measure = {
        None: None,
        "warm": MeasureConfig(),
        "flush": MeasureConfig(number=1, repeat=10, min_repeat_ms=0, enable_cpu_cache_flush=True),
    }[args.cache]
    fs = run_fastsearch(mod, target, args.trials, args.seed, out / "fastsearch_work", measure)
    if args.reuse_metaschedule:
        src = Path(args.reuse_metaschedule)
        shutil.copytree(src / "metaschedule_work", out / "metaschedule_work", dirs_exist_ok=True)
        earlier = json.loads((src / "result.json").read_text())["models"]["metaschedule"]
        shutil.copy(src / "metaschedule.so", out / "metaschedule.so")
        mst = {"wall_s": earlier["wall_s"], "records": earlier["records"], "exe": None}
    else:
        print(f"MetaSchedule: {args.trials} trials ...", file=sys.stderr, flush=True)
        mst = run_metaschedule(
            mod, target, args.trials, args.seed, out / "metaschedule_work", args.ms_default_builder
        )
    libs = {
        "untuned": out / "untuned.so",
        "fastsearch": out / "fastsearch.so",
        "metaschedule": out / "metaschedule.so",
    }
    tvm.compile(mod, target=target).export_library(str(libs["untuned"]))
    fs["exe"].export_library(str(libs["fastsearch"]))
    if mst["exe"] is not None:
        mst["exe"].export_library(str(libs["metaschedule"]))

    other_load = other_cpu_load()
    timing = time_in_fresh_processes(
        {n: str(p) for n, p in libs.items()},
        inputs,
        threads,
        onnx_file=onnx_file,
        processes=args.processes,
        rounds=args.rounds,
    )
    ref = reference if reference is not None else timing.outputs["untuned"]
    scale = float(np.abs(ref).max()) or 1.0
    res: dict[str, Any] = {
        "model": args.zoo or args.model,
        "trials": args.trials,
        "seed": args.seed,
        "threads": threads,
        "processes": args.processes,
        "rounds": args.rounds,
        **run_metadata("model_e2e.py", target, argv),
        "other_cpu_load": other_load,
        "models": {},
    }
    extra = {"fastsearch": fs, "metaschedule": mst}
    for name, times in timing.times.items():
        o = timing.outputs[name]
        entry = {k: v for k, v in extra.get(name, {}).items() if k != "exe"}
        entry["times_s"] = times
        entry["median_us"] = statistics.median(times) * 1e6
        for base in ("onnxruntime", "metaschedule", "untuned"):
            if base in timing.times:
                entry[f"vs_{base}"] = statistics.median(paired_ratios(times, timing.times[base]))
        entry["max_abs_diff"] = float(np.abs(o.astype("float64") - ref).max())
        entry["matches"] = bool(np.allclose(o, ref, rtol=1e-3, atol=1e-4 * scale))
        res["models"][name] = entry
    (out / "result.json").write_text(json.dumps(res, indent=1, default=float))
    text = report(res)
    (out / "e2e.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
