"""Command line: ``fastsearch tune`` on a built-in workload or a whole model, ``fastsearch
workloads`` to list the built-in workloads and models.

Built-in workloads are MetaSchedule's ``te_workload`` families (GMM, C2D, ...), each with a few
shapes: ``--workload GMM:2`` picks shape 2 of GMM, ``--small`` the one with the fewest FLOPs.
A whole model is an ONNX file (``fastsearch tune model.onnx``, needs the ``onnx`` package) or a
built-in one (``--model resnet-tiny``, :mod:`fastsearch.testing.relax_models`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastsearch.errors import FastsearchError, UnsupportedWorkload
from fastsearch.graph.model_timing import describe_end_to_end, end_to_end
from fastsearch.ir.target import require_measurable, resolve_target
from fastsearch.ir.threads import kernel_threads_env
from fastsearch.measure.measurer import BUILD_STAGES, MeasureConfig, RPCRunner
from fastsearch.testing import onnx_zoo
from fastsearch.testing.onnx_zoo import SMALL, ZOO
from fastsearch.testing.relax_models import MODELS, load_model
from fastsearch.tuning.build_only import build_gpu_space, cuda_target
from fastsearch.tuning.options import FusionSearch
from fastsearch.tuning.progress import format_latency
from fastsearch.tuning.tune import tune

__all__ = [
    "BuiltinWorkload",
    "list_workloads",
    "load_onnx",
    "load_workload",
    "main",
    "summary",
    "task_table",
    "workload_flops",
]


def _te_workload() -> Any:
    from tvm.s_tir.meta_schedule.testing import te_workload

    return te_workload


def list_workloads() -> dict[str, list[tuple]]:
    """Family name -> list of shape arguments, as in MetaSchedule's ``te_workload.CONFIGS``."""
    return {name: [tuple(args) for args in cfg[1]] for name, cfg in _te_workload().CONFIGS.items()}


def workload_flops(func: Any) -> float | None:
    """Floating-point operations of one call of a PrimFunc, when TVM can count them."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # noqa: BLE001  (FLOPs are only informative)
        return None


@dataclass(frozen=True)
class BuiltinWorkload:
    """A built-in workload: family, shape index, shape arguments and the PrimFunc."""

    family: str
    index: int
    shape: tuple
    func: Any

    @property
    def name(self) -> str:
        """``FAMILY_INDEX``, the default work-directory name."""
        return f"{self.family}_{self.index}"


def load_workload(spec: str, shape_index: int | None = None, small: bool = False) -> BuiltinWorkload:
    """Resolve ``FAMILY[:INDEX]`` to a workload; ``small`` picks the family's fewest-FLOPs shape."""
    family, _, idx_text = spec.partition(":")
    configs = list_workloads()
    match = {k.lower(): k for k in configs}.get(family.lower())
    if match is None:
        raise UnsupportedWorkload(
            f"unknown workload {family!r}; built-in workloads: {', '.join(configs)} "
            "(see `fastsearch workloads`)"
        )
    shapes = configs[match]
    if idx_text:
        if shape_index is not None or small:
            raise UnsupportedWorkload(f"{spec!r} names a shape index; drop --shape-index/--small")
        try:
            shape_index = int(idx_text)
        except ValueError:
            raise UnsupportedWorkload(f"bad shape index {idx_text!r} in {spec!r}") from None
    if small:
        flops = [workload_flops(_create(match, i)) or float("inf") for i in range(len(shapes))]
        shape_index = min(range(len(shapes)), key=lambda i: flops[i])
    if shape_index is None:
        shape_index = 0
    if not 0 <= shape_index < len(shapes):
        raise UnsupportedWorkload(
            f"workload {match} has shapes 0..{len(shapes) - 1}, not {shape_index} (see `fastsearch workloads`)"
        )
    return BuiltinWorkload(match, shape_index, shapes[shape_index], _create(match, shape_index))


def _create(family: str, index: int) -> Any:
    try:
        return _te_workload().create_te_workload(family, index)
    except Exception as exc:  # TVM raises assorted errors for workloads it no longer supports
        raise UnsupportedWorkload(f"TVM cannot create workload {family}:{index}: {exc}") from exc


def _cmd_workloads(_args: argparse.Namespace) -> int:
    print(f"{'workload':<16} {'shape arguments':<50} {'GFLOP':>10}")
    for name, shapes in list_workloads().items():
        for i, args in enumerate(shapes):
            try:
                flops = workload_flops(_create(name, i))
                gflop = f"{flops / 1e9:.3f}" if flops else "-"
            except UnsupportedWorkload:
                gflop = "unavailable in this TVM"
            print(f"{name + ':' + str(i):<16} {args!s:<50} {gflop:>10}")
    print(f"\nbuilt-in models (--model NAME): {', '.join(_model_names())}")
    return 0


def load_onnx(path: str, shapes: dict[str, list[int]] | None = None) -> Any:
    """An ONNX model file as a Relax IRModule (weights as constants), through TVM's importer."""
    try:
        import onnx
    except ImportError:
        raise UnsupportedWorkload(
            f"reading the ONNX model {path!r} needs the `onnx` Python package: pip install onnx"
        ) from None
    from tvm.relax.frontend.onnx import from_onnx

    try:
        model = onnx.load(path)
    except Exception as exc:  # a missing or corrupt file: say which
        raise UnsupportedWorkload(f"cannot read the ONNX model {path!r}: {exc}") from exc
    try:
        return from_onnx(model, shape_dict=shapes or None)
    except Exception as exc:  # an operator or construct TVM cannot import
        raise UnsupportedWorkload(f"TVM cannot import the ONNX model {path!r}: {exc}") from exc


def _input_shapes(specs: Sequence[str]) -> dict[str, list[int]]:
    """``NAME:1x3x224x224`` options as a shape dictionary."""
    shapes = {}
    for spec in specs:
        name, _, dims = spec.rpartition(":")
        try:
            shapes[name] = [int(d) for d in dims.split("x")]
        except ValueError:
            raise UnsupportedWorkload(f"bad --input-shape {spec!r}; expected NAME:1x3x224x224") from None
        if not name:
            raise UnsupportedWorkload(f"bad --input-shape {spec!r}; expected NAME:1x3x224x224")
    return shapes


def _cmd_tune(args: argparse.Namespace) -> int:

    chosen = [x for x in (args.model_file, args.model, args.workload) if x]
    if len(chosen) != 1:
        raise SystemExit("fastsearch: error: give one of MODEL.onnx, --model NAME or --workload FAMILY")
    if args.build_only:
        return _cmd_build_only(args)
    # Before a model is loaded or a file written: a target the search cannot serve is refused.
    remote = bool(args.rpc_tracker or args.rpc_key)
    require_measurable(resolve_target(args.target), "fastsearch tune", remote=remote)
    if args.model_file or args.model:
        from pathlib import Path

        if args.model and args.model.lower() not in MODELS and _is_zoo_model(args.model):
            # An ONNX zoo model: written to the work directory and read as a user's file is, so
            # that onnxruntime can run the same file beside the tuned model.
            args.model_file = _write_zoo_model(args.model.lower(), args.work_dir)
            args.model = None
        if args.model_file:
            mod = load_onnx(args.model_file, _input_shapes(args.input_shape))
            name, shape = Path(args.model_file).stem, ()
        else:
            mod = load_model(args.model)
            name, shape = args.model.lower(), ()
        func: Any = mod
        flops = None
    else:
        wl = load_workload(args.workload, args.shape_index, args.small)
        func, name, shape, flops = wl.func, wl.name, wl.shape, None
    measure = MeasureConfig(
        number=args.number,
        repeat=args.repeat,
        min_repeat_ms=args.min_repeat_ms,
        enable_cpu_cache_flush=args.cache_flush,
        cold_weights={"auto": None, "on": True, "off": False}[args.cold_weights],
        build_workers=args.build_workers,
        model_candidates=args.model_candidates,
        **({} if args.run_timeout is None else {"run_timeout_s": args.run_timeout}),
    )
    runner = None
    if args.rpc_tracker or args.rpc_key:
        if not (args.rpc_tracker and args.rpc_key):
            raise SystemExit("fastsearch: error: --rpc-tracker and --rpc-key go together")
        runner = RPCRunner(tracker=args.rpc_tracker, key=args.rpc_key, max_workers=args.rpc_workers)
    print(
        f"tuning {name} {shape or ''}: {args.trials} trials, {args.strategy} search, seed {args.seed}",
        file=sys.stderr,
    )
    result = tune(
        func,
        args.target,
        trials=args.trials,
        seed=args.seed,
        work_dir=args.work_dir,
        strategy=args.strategy,
        batch_size=args.batch_size,
        measure=measure,
        verify=not args.no_verify,
        progress=not args.no_progress,
        name=name,
        runner=runner,
        task_scheduler=args.task_scheduler,
        warm_start=args.warm_start or None,
        pipeline=args.pipeline,
        layout=args.layout,
        fusion=FusionSearch(share=args.fusion_share) if args.fusion == "search" else "rules",
    )
    if result.warm_start is not None:
        w = result.warm_start
        print(
            f"warm start   {w.num_records} records of {len(w.sources)} workloads from {', '.join(args.warm_start)}"
        )
    if not result.is_relax:
        flops = workload_flops(func)
    print(summary(name, shape, result, flops))
    if result.is_relax:
        print(task_table(result))
    if result.fusion is not None:
        print(fusion_table(result.fusion))
    if result.is_relax and not args.no_end_to_end:
        print("timing the model end to end in fresh processes ...", file=sys.stderr)
        timing = end_to_end(
            result, mod, onnx_file=args.model_file, processes=args.e2e_processes, profile=args.profile
        )
        print("\n".join(describe_end_to_end(timing)))
        if timing.profile is not None:
            print(timing.profile.table())
    if args.history:
        print(f"history      {result.write_history(args.history)}")
    return 0


def _cmd_build_only(args: argparse.Namespace) -> int:
    """``fastsearch tune --workload W --target CUDA --build-only``: the GPU search space drawn,
    verified, built to CUDA source and cubins, and reported; nothing measured, no database written."""
    if not args.workload:
        raise UnsupportedWorkload(
            "--build-only takes a built-in workload (--workload FAMILY[:INDEX]); for a PrimFunc or "
            "an IRModule of PrimFuncs call fastsearch.tuning.build_only.build_gpu_space from Python"
        )
    cuda_target(args.target)  # before the workload is built: a target that is not CUDA is refused
    wl = load_workload(args.workload, args.shape_index, args.small)
    print(
        f"building {wl.name} {wl.shape}: {args.trials} GPU sketch candidates, seed {args.seed}, no measuring",
        file=sys.stderr,
    )
    report = build_gpu_space(
        wl.func,
        args.target,
        args.trials,
        args.seed,
        name=wl.name,
        arch=args.cubin_arch,
        cubins=not args.no_cubins,
        workers=args.build_workers,
    )
    print(f"workload     {wl.name} {tuple(wl.shape)}")
    print(report.summary())
    if args.build_report:
        Path(args.build_report).write_text(json.dumps(report.to_json(), indent=1))
        print(f"report       {args.build_report}")
    return 0


def task_table(result: Any) -> str:
    """Per-task table of a model's run: weight, trials, best latency, share of the model's
    weighted total (skipped tasks with their reason)."""
    total = sum(t.weight * t.best_latency_us for t in result.tasks.values() if t.best_latency_us)
    width = max([len("task")] + [len(n) for n in result.tasks])
    lines = [f"{'task':<{width}}  {'weight':>6}  {'trials':>6}  {'best':>11}  {'share':>6}  {'GFLOP/s':>8}"]
    for task_name, t in result.tasks.items():
        if t.skipped:
            lines.append(f"{task_name:<{width}}  {t.weight:>6}  {'-':>6}  skipped: {t.skipped}")
            continue
        trials = t.trials_stored + t.trials_measured
        share = f"{100 * t.weight * t.best_latency_us / total:5.1f}%" if total and t.best_latency_us else "-"
        gflops = getattr(t, "gflops", None)
        rate = f"{gflops:8.1f}" if gflops else f"{'-':>8}"
        cold = " cold" if getattr(t, "cold", False) else ""
        lines.append(
            f"{task_name:<{width}}  {t.weight:>6}  {trials:>6}  {format_latency(t.best_latency_us):>11}  {share:>6}  {rate}{cold}"
        )
    lines.append(f"{'total (weighted)':<{width}}  {'':>6}  {'':>6}  {format_latency(total or None):>11}")
    if any(getattr(t, "cold", False) for t in result.tasks.values()):
        lines.append("(cold: timed with its weights flushed from the caches, as a model runs it)")
    return "\n".join(lines)


def fusion_table(report: Any) -> str:
    """What ``--fusion search`` tried: each change, its trials, its end-to-end ratio, the verdict."""
    lines = [
        (
            f"fusion       {len(report.kept)} of {len(report.changes)} changes kept; "
            f"{report.trials_rules} trials on the rule grouping, {report.trials_changes} on changes"
        )
    ]
    if report.base_ms is not None and report.final_ms is not None:
        lines.append(
            f"end to end   rule grouping {report.base_ms:.3f} ms, chosen {report.final_ms:.3f} ms "
            f"(median of {report.rounds} interleaved rounds)"
        )
    lines += [f"  {c.summary()}" for c in report.changes]
    return "\n".join(lines)


def summary(name: str, shape: Sequence[Any], result: Any, flops: float | None) -> str:
    """The final report of a tuning run: best latency, GFLOP/s, time breakdown, database."""
    what = (
        f"model        {name}"
        if getattr(result, "is_relax", False)
        else f"workload     {name} {tuple(shape)}"
    )
    lines = [what, f"target       {result.target}"]
    lat = result.best_latency_us
    lines.append(f"best         {format_latency(lat)}")
    if flops and lat:
        lines.append(f"GFLOP/s      {flops / (lat * 1e-6) / 1e9:.2f}")
    stored = sum(t.trials_stored for t in result.tasks.values())
    lines.append(
        f"trials       {result.trials_measured} measured this run ({result.failed} failed), "
        f"{stored} already stored"
    )
    failures = getattr(result, "failures", None) or {}
    if failures:
        lines.append("failed       " + ", ".join(f"{kind} {n}" for kind, n in failures.items()))
        # The first error of each kind, so that a failure can be looked into without a rerun.
        for kind, example in (getattr(result, "failure_examples", None) or {}).items():
            first = " ".join(example.split())
            lines.append(f"  {kind}: {first[:300]}{' ...' if len(first) > 300 else ''}")
    for repair in getattr(result, "repairs", None) or []:
        lines.append(f"repaired     {repair}")
    choice = getattr(result, "layout_choice", None)
    if choice is not None:
        sums = ", ".join(
            f"{layout} {format_latency(us) if us is not None else 'not every task measured'}"
            for layout, us in choice.estimates_us.items()
        )
        lines.append(
            f"layout       {choice.chosen} kept: tuned tasks' sums after {choice.probe_trials} trials each: {sums}"
        )
    t = result.timing
    parts = ", ".join(
        f"{k} {t[k]:.1f}" for k in ("search", "model", "apply", "build", "run", "verify", "database")
    )
    if "final" in t:  # each task's best and runners-up built again and timed side by side
        parts += f", final {t['final']:.1f}"
    if "model_round" in t:  # each task's best records built into models and timed in sequence
        parts += f", model round {t['model_round']:.1f}"
    if "layout" in t:  # layout="search": tuning each layout's probe
        parts += f", layout {t['layout']:.1f}"
    if "fusion" in t:  # compiling and timing the model with each fusion change
        parts += f", fusion {t['fusion']:.1f}"
    lines.append(f"time (s)     total {t['total']:.1f}: {parts}")
    built = [h for h in getattr(result, "history", []) if h.build_s is not None]
    if built:
        med = {
            stage: statistics.median(getattr(h, f"build_{stage}_s") for h in built) for stage in BUILD_STAGES
        }
        lines.append(
            f"build (s)    per candidate ({len(built)} recorded), medians: TVM passes {med['passes']:.3f}, "
            f"codegen {med['codegen']:.3f}, export {med['export']:.3f}; slowest {max(h.build_s for h in built):.2f}"
        )
    finals = [(n, t.final) for n, t in result.tasks.items() if getattr(t, "final", None) is not None]
    if len(finals) == 1 and not getattr(result, "is_relax", False):
        final = finals[0][1]
        runners = ", ".join(f"x{r:.3f}" for r in final.ratios)
        verdict = (
            "the best stayed" if final.chosen is None else f"runner-up {final.chosen + 1} became the best"
        )
        lines.append(f"final round  runners-up side by side with the best: {runners}; {verdict}")
    elif finals:
        changed = sum(1 for _, f in finals if f.chosen is not None)
        lines.append(f"final round  {len(finals)} tasks, a runner-up became the best in {changed}")
    if getattr(result, "model_round", None) is not None:
        lines.append(f"model round  {result.model_round.summary()}")
    lines.append(f"database     {result.database.path}")
    return "\n".join(lines)


def _model_names() -> list[str]:
    names = list(MODELS)
    # A zoo model named like a Relax one (resnet-18) is reached by saving it: see README.
    return names + [f"{n} (ONNX)" for n in [*ZOO, *SMALL] if n not in MODELS]


def _is_zoo_model(name: str) -> bool:
    return name.lower() in ZOO or name.lower() in SMALL


def _write_zoo_model(name: str, work_dir: str | None) -> str:
    """Build the zoo model ``name`` and save it as ``<work dir>/<name>.onnx``."""
    folder = Path(work_dir) if work_dir else Path.cwd() / "fastsearch_work" / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.onnx"
    data = onnx_zoo.build(name).SerializeToString()  # raises before writing when onnx is missing
    path.write_bytes(data)
    return str(path)


def _measure_arguments(p: argparse.ArgumentParser) -> None:
    """How candidates are timed, and what is tried in the model's sequence."""
    defaults = MeasureConfig()
    p.add_argument("--repeat", type=int, default=defaults.repeat, help="timed repeats per candidate")
    p.add_argument(
        "--number", type=int, default=defaults.number, help="runs per repeat (raised to --min-repeat-ms)"
    )
    p.add_argument(
        "--min-repeat-ms",
        type=int,
        default=defaults.min_repeat_ms,
        help=f"shortest timed repeat in ms (default {defaults.min_repeat_ms})",
    )
    p.add_argument(
        "--cache-flush",
        action="store_true",
        help="flush every argument but the first from the CPU caches before each repeat "
        "(with --min-repeat-ms 0, each repeat is one call)",
    )
    p.add_argument(
        "--cold-weights",
        choices=("auto", "on", "off"),
        default="auto",
        help="time tasks whose weights outgrow twice a core's L2 with them flushed from the caches, "
        "as a model streams them (auto: when tuning a model)",
    )
    p.add_argument(
        "--model-candidates",
        type=int,
        default=MeasureConfig.model_candidates,
        help="after tuning a model, each task's best this many records are tried inside the model's "
        "call sequence and the fastest there is kept (0: off)",
    )


def _build_only_arguments(p: argparse.ArgumentParser) -> None:
    """``--build-only``: a CUDA search space built and compiled, not measured."""
    p.add_argument(
        "--build-only",
        action="store_true",
        help="GPU (CUDA) targets: draw --trials of fastsearch's GPU sketch candidates, verify them, "
        "build them to CUDA source and, with nvcc (pip install 'fastsearch[cuda]'), to cubins, and "
        "report valid shares, registers, spills and failed builds; nothing is measured, no GPU needed",
    )
    p.add_argument(
        "--cubin-arch", default=None, help="with --build-only: the cubins' arch (default: the target's)"
    )
    p.add_argument("--no-cubins", action="store_true", help="with --build-only: stop at CUDA source")
    p.add_argument(
        "--build-report",
        default=None,
        metavar="FILE",
        help="with --build-only: write every candidate's JSON here",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastsearch", description="Auto-tune TVM tensor programs.")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("workloads", help="list the built-in workloads and their shapes")

    p = sub.add_parser("tune", help="tune a built-in workload or a whole model")
    p.add_argument("model_file", nargs="?", default=None, help="an ONNX model file (needs `onnx`)")
    p.add_argument("--model", default=None, help="a built-in model: " + ", ".join(_model_names()))
    p.add_argument("--input-shape", action="append", default=[], help="ONNX input shape NAME:1x3x224x224")
    p.add_argument("--workload", default=None, help="FAMILY[:SHAPE_INDEX], e.g. GMM or GMM:2")
    p.add_argument("--shape-index", type=int, default=None, help="shape index within the family")
    p.add_argument("--small", action="store_true", help="the family's shape with the fewest FLOPs")
    p.add_argument(
        "--trials",
        type=int,
        default=None,
        help="candidates to measure (default 64); with --build-only, candidates drawn per task (default 16)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None, help="database directory (default ./fastsearch_work/NAME)")
    p.add_argument("--target", default=None, help='"llvm" (this CPU, default) or a target JSON dict')
    p.add_argument(
        "--strategy",
        default="evolutionary",
        choices=["random", "evolutionary", "annealing"],
        help="random sketch sampling, or model-guided evolutionary search / simulated annealing",
    )
    p.add_argument("--batch-size", type=int, default=None, help="candidates per measured batch")
    p.add_argument(
        "--task-scheduler",
        default="gradient",
        choices=["gradient", "round-robin"],
        help="which task of a model gets the next batch (default: Ansor's gradient rule)",
    )
    _measure_arguments(p)
    p.add_argument("--build-workers", type=int, default=None, help="parallel builds (default: cores)")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds before a run is killed")
    p.add_argument("--rpc-tracker", default=None, help="HOST:PORT of a TVM RPC tracker: run remotely")
    p.add_argument("--rpc-key", default=None, help="device key registered with the RPC tracker")
    p.add_argument("--rpc-workers", type=int, default=None, help="remote runs at once (default: servers)")
    p.add_argument(
        "--warm-start",
        action="append",
        default=[],
        metavar="DIR",
        help="an earlier run's database directory (fastsearch's or MetaSchedule's) to start from; repeatable",
    )
    p.add_argument(
        "--fusion",
        choices=("rules", "search"),
        default="rules",
        help="a model's fused functions: FuseOps' rules (default), or search: also try prologue, "
        "epilogue and horizontal fusion, each kept only when the model runs faster end to end",
    )
    p.add_argument(
        "--fusion-share",
        type=float,
        default=0.25,
        help="with --fusion search, the share of trials for the changes (default 0.25)",
    )
    p.add_argument(
        "--pipeline",
        choices=("inference", "inference-direct", "none"),
        default="inference",
        help="a model's graph pipeline before partitioning: inference (default: batch norm folded, "
        "constants folded, scale and shift moved into weights, 3x3 convolutions on large images "
        "as Winograd F(4x4, 3x3)), inference-direct (the same, every convolution direct) or none",
    )
    p.add_argument(
        "--layout",
        default="NCHWc",
        help="a CNN's activation layout for its convolutions: NCHWc (channel-blocked, default: "
        "blocks of 16 channels on AVX-512, else 8; NCHW8c or NCHW16c names a block), NCHW "
        "(as imported) or search (each tuned with a fifth of the trials, the faster kept)",
    )
    p.add_argument(
        "--no-end-to-end",
        action="store_true",
        help="skip timing a model before and after tuning (and onnxruntime) in fresh processes",
    )
    p.add_argument("--e2e-processes", type=int, default=3, help="fresh processes for the end-to-end timing")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also time every VM call of the tuned model (kernels and VM builtins)",
    )
    p.add_argument("--history", default=None, help="write the per-trial tuning curve to this CSV file")
    p.add_argument("--no-verify", action="store_true", help="skip checking the best against a reference")
    _build_only_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastsearch`` command."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "workloads":
            return _cmd_workloads(args)
        if args.trials is None:
            args.trials = 16 if args.build_only else 64
        if args.trials < 1:
            raise SystemExit("fastsearch: error: --trials must be at least 1")
        # Kernels run on the target's num-cores threads (every core by default), in tuning and in
        # the timings the command reports (TVM's runtime would use half the logical CPUs: one
        # thread on a 2-vCPU machine). The user's TVM_NUM_THREADS wins; main() called in-process
        # (tests) leaves the environment as it was.
        remote = bool(args.rpc_tracker or args.rpc_key)
        with kernel_threads_env(resolve_target(args.target), remote=remote):
            return _cmd_tune(args)
    except FastsearchError as exc:
        print(f"fastsearch: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `fastsearch workloads | head`
        return 0
    except KeyboardInterrupt:
        print("fastsearch: interrupted; the database keeps every finished batch", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
