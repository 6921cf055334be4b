"""``fastsearch.tune``: search, measure, store, repeat; then check and report the best.

For each PrimFunc (a task) the loop runs rounds: ask the sampler for a batch of new candidates
(traces from fastsearch's sketches, excluding every candidate already in the database), replay each
on the workload with MetaSchedule's postprocessors, build and time them through MetaSchedule's
local builder and runner, check a candidate that would become the best against a reference output
computed from the untuned function, and commit every record to the JSON database. A resumed run on
the same work directory counts what is stored toward ``trials`` and never measures a candidate
twice.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.ir import IRModule
from tvm.s_tir import Schedule, Trace
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from tvm_ffi import structural_hash

from fastsearch.database import FAILED_RUN_SECS, TuningDatabase, candidate_key, mean_run_secs
from fastsearch.errors import MalformedInput, MeasurementError, UnsupportedWorkload
from fastsearch.graph.inference import optimize_for_inference
from fastsearch.graph.relax_tasks import extract_tasks, is_relax_module
from fastsearch.ir.target import TargetLike, device_type, resolve_target
from fastsearch.ir.tir_import import program_json
from fastsearch.measure.measurer import (
    FAILURE_KINDS,
    CandidateFault,
    MeasureConfig,
    Measurer,
    MeasureResult,
    RPCRunner,
    compare_outputs,
    plain_args_info,
    random_arguments,
    run_function,
)
from fastsearch.search.guided import ModelGuidedSampler, SearchState, SiblingRecords
from fastsearch.search.sample import Postprocessor, fresh_copy, sample_candidates
from fastsearch.search.warm_start import WarmStart, WarmStartLike
from fastsearch.tuning.fusion_search import check_fusion_argument, tune_searching_fusion
from fastsearch.tuning.progress import ProgressBar
from fastsearch.tuning.result import FinalRound, TaskResult, TrialRecord, TuneResult
from fastsearch.tuning.scheduler import SCHEDULERS, TaskState, floor_rounds, make_scheduler

__all__ = ["Sampler", "TaskResult", "TrialRecord", "TuneResult", "tune"]

#: A candidate generator ``(func, target, n, seed, exclude) -> list`` of at most ``n`` distinct
#: candidates whose key (:func:`fastsearch.database.candidate_key`) is not in ``exclude``. Items are
#: ``fastsearch.search.sample.Candidate`` objects (``key`` and a postprocessed ``schedule``) or plain
#: :class:`tvm.s_tir.Trace` objects, which tune() replays and postprocesses itself. A sampler that
#: also has ``update(func, measured)`` gets, after every batch, ``measured = [(key, mean seconds or
#: None for a failure)]``, and once at the start the records already stored (warm start); the time
#: it takes is reported as ``model``.
Sampler = Callable[[tvm.tirx.PrimFunc, tvm.target.Target, int, int, set], list]

APPLY_FAILURES_FILE = "fastsearch_apply_failures.jsonl"


@dataclass
class _Task:
    name: str
    mod: IRModule
    func: tvm.tirx.PrimFunc
    entry: str
    workload: Any
    args_info: list
    post: Postprocessor
    result: TaskResult
    best_secs: float = math.inf
    weight: int = 1
    pristine: IRModule | None = None  # an untouched copy for the reference output
    reference: list[np.ndarray] | None = None
    inputs: list[np.ndarray] | None = None


#: Graph pipelines a Relax model can go through before partitioning (``tune(pipeline=...)``).
PIPELINES = ("inference", "none")

#: Built-in strategies: random sampling of fastsearch's sketches, and model-guided search
#: (evolutionary or simulated annealing in Rust, cost model retrained on every batch).
STRATEGIES = ("random", "evolutionary", "annealing")

_MakeSampler = Callable[["_Task", TuningDatabase, tvm.target.Target], Sampler]


def _resolve_sampler(
    strategy: str | Sampler, warm: WarmStart | None = None, rerank: bool = True
) -> _MakeSampler:
    """Per-task sampler factory for ``strategy``, started from ``warm`` when given; ``rerank``
    keeps the model-guided search's re-ranking by per-store features on
    (:data:`fastsearch.search.guided.RERANK_AFTER`)."""
    if warm is not None and (callable(strategy) or strategy == "random"):
        raise ValueError(
            f"warm_start needs a model-guided strategy ({', '.join(STRATEGIES[1:])}), not {strategy!r}"
        )
    if callable(strategy):
        user = strategy
        return lambda task, db, target: user
    if strategy == "random":

        def make_random(task: _Task, db: TuningDatabase, target: tvm.target.Target) -> Sampler:
            def draw(
                func: tvm.tirx.PrimFunc, target: tvm.target.Target, n: int, seed: int, exclude: set
            ) -> list:
                return sample_candidates(func, target, n, seed, exclude, postprocessor=task.post)

            return draw

        return make_random
    if strategy in STRATEGIES:
        siblings = SiblingRecords()  # one per run: each task's model also learns from the others'

        def make_guided(task: _Task, db: TuningDatabase, target: tvm.target.Target) -> Sampler:
            cache: dict[str, Any] = {}

            def history() -> list[tuple[str, float]]:
                # Read again only when the task has new records: siblings ask on every batch.
                count = len(db.measured_keys(task.workload))
                if cache.get("count") != count:
                    cache["count"] = count
                    cache["history"] = [
                        (k, math.inf if s is None else s) for k, s in _stored_results(db, task)
                    ]
                return list(cache["history"])

            return ModelGuidedSampler(
                fresh_copy(task.func),
                target,
                str(strategy),
                history,
                postprocessor=task.post,
                state=SearchState(db.path, task.name),
                warm=warm.for_task(task.func, program_json(task.func)) if warm is not None else None,
                siblings=siblings,
                name=task.name,
                rerank=rerank,
            )

        return make_guided
    raise ValueError(
        f"unknown strategy {strategy!r}; available: {', '.join(STRATEGIES)} or a sampler callable"
    )


def _primfuncs(mod: tvm.tirx.PrimFunc | IRModule) -> tuple[IRModule, list[tuple[str, tvm.tirx.PrimFunc]]]:
    if isinstance(mod, tvm.tirx.PrimFunc):
        whole = IRModule({"main": mod})
        return whole, [("main", mod)]
    if not isinstance(mod, IRModule):
        raise UnsupportedWorkload(
            f"tune() takes a tvm.tirx.PrimFunc or an IRModule of PrimFuncs, got {type(mod).__name__}"
        )
    funcs: list[tuple[str, tvm.tirx.PrimFunc]] = []
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            funcs.append((gv.name_hint, func))
        else:
            raise UnsupportedWorkload(
                f"function {gv.name_hint!r} is a {type(func).__name__}; tune() handles IRModules of "
                "PrimFuncs only"
            )
    if not funcs:
        raise UnsupportedWorkload("the IRModule has no PrimFunc to tune")
    funcs.sort(key=lambda x: x[0])
    return mod, funcs


def default_name(mod: tvm.tirx.PrimFunc | IRModule) -> str:
    """Workload name for the default work directory: the function's name, plus a structural hash
    when that name is the generic ``main``."""
    if isinstance(mod, tvm.tirx.PrimFunc):
        attrs = mod.attrs
        base = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "main"
    else:
        names = sorted(gv.name_hint for gv in mod.get_global_vars())
        base = names[0] if len(names) == 1 else "module"
    if base in ("main", "module"):
        base = f"{base}_{structural_hash(mod) & 0xFFFFFFFF:08x}"
    return base


def task_flops(func: tvm.tirx.PrimFunc) -> float | None:
    """Floating-point operations of one call of ``func``, when TVM can count them."""
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        flops = float(estimate_tir_flops(IRModule({"main": func})))
    except Exception:  # noqa: BLE001  (FLOPs only inform the schedule and the report)
        return None
    return flops if flops > 0 else None


def _needs_tensor_intrin(trace: Trace) -> bool:
    return any(str(inst.kind.name) in ("Tensorize", "Blockize") for inst in trace.insts)


def _apply(task: _Task, trace: Trace) -> tuple[Schedule | None, str | None]:
    """Replay ``trace`` on the workload and run the postprocessors, as MetaSchedule does."""
    if _needs_tensor_intrin(trace):
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics tensorize refers to)
    try:
        sch = Schedule(fresh_copy(task.mod), debug_mask="none", error_render_level="detail")
        trace.apply_to_schedule(sch, remove_postproc=True)
        if not task.post.apply(sch):
            return None, f"postprocessor {task.post.rejected_by} rejected the candidate"
    except Exception as exc:  # noqa: BLE001  (a broken candidate is recorded, the search goes on)
        return None, f"cannot apply the trace: {exc}"
    return sch, None


def _args_info(name: str, func: tvm.tirx.PrimFunc) -> list:
    """MetaSchedule's argument descriptions; a function it cannot describe is unsupported."""
    try:
        return list(ms.arg_info.ArgInfo.from_prim_func(func))
    except Exception as exc:  # TVM raises TypeError / TVMError here
        program_json(func)  # raises UnsupportedWorkload naming the construct when it can
        raise UnsupportedWorkload(f"function {name!r}: cannot describe its arguments: {exc}") from exc


def _seed_for(seed: int, task_index: int, round_index: int) -> int:
    return (seed * 1_000_003 + task_index * 7_919 + round_index * 104_729) & 0x7FFFFFFF


class _ApplyFailures:
    """Candidates whose trace TVM cannot replay or postprocess: MetaSchedule's database replays every
    trace it loads, so they are kept in a side file of the work directory (key and error) instead,
    to be skipped on resume."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys: dict[str, set[str]] = {}
        if path.exists():
            for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self.keys.setdefault(str(row["workload"]), set()).add(str(row["key"]))
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line from a killed run: nothing to skip

    def add(self, workload: str, key: str, error: str) -> None:
        self.keys.setdefault(workload, set()).add(key)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"workload": workload, "key": key, "error": error}) + "\n")


def tune(
    mod: tvm.tirx.PrimFunc | IRModule,
    target: TargetLike = None,
    *,
    trials: int = 64,
    seed: int = 0,
    work_dir: str | os.PathLike[str] | None = None,
    strategy: str | Sampler = "evolutionary",
    batch_size: int | None = None,
    measure: MeasureConfig | None = None,
    verify: bool = True,
    rtol: float = 1e-3,
    atol: float = 1e-4,
    progress: bool = True,
    name: str | None = None,
    runner: RPCRunner | None = None,
    task_scheduler: str = "gradient",
    warm_start: WarmStartLike | WarmStart | None = None,
    fusion: str = "rules",
    fusion_share: float = 0.25,
    fusion_min_gain: float = 0.01,
    fusion_rounds: int = 20,
    pipeline: str = "inference",
    layout: str = "NCHWc",
    _groups: list[list[int]] | None = None,
    _rerank: bool = True,
) -> TuneResult:
    """Tune a PrimFunc, each PrimFunc of an IRModule, or a whole Relax model.

    A Relax model (an IRModule with a Relax ``main``) is fused with fastsearch's partitioner;
    each distinct fused PrimFunc is a task weighted by its number of calls (pure reshapes,
    loop-free functions and operators fastsearch cannot import are skipped and keep TVM's
    default code). ``result.compile()`` then returns a Relax VM executable.

    With several tasks, ``task_scheduler`` decides which task gets each next batch of trials:
    ``"gradient"`` (Ansor's rule: one batch each, then the task whose weighted latency should
    drop most; :mod:`fastsearch.tuning.scheduler`) or ``"round-robin"`` (``trials`` split evenly, one
    batch per task in turn). ``TuneResult.tasks`` holds each task's weight, trials and best.

    ``trials`` is the total number of candidates per run directory: records already stored in
    ``work_dir`` (default ``./fastsearch_work/<name>``) count toward it, and no stored candidate
    is measured again. ``strategy`` is ``"evolutionary"`` (the default) or ``"annealing"``
    (model-guided search in Rust), ``"random"`` (fastsearch's sketches with random annotation), or
    a :data:`Sampler`. Candidates that would become the best are checked against the untuned
    function's output on random inputs (``verify``); a wrong answer is recorded as failed.
    ``runner`` runs the candidates on remote devices (:class:`fastsearch.RPCRunner`; builds stay
    here); by default they run on this machine. A candidate that cannot be built, crashes, hangs
    past its timeout or computes a wrong answer is stored as failed and the run goes on;
    ``TuneResult.failures`` counts them by kind.

    ``warm_start`` names the directories of earlier runs' databases (fastsearch's or
    MetaSchedule's JSONDatabase), or a loaded :class:`fastsearch.search.warm_start.WarmStart`: their
    records train a cost model on per-store features that ranks this run's proposals until each
    task has records of its own, and the best candidates found on other shapes of the same
    operator are refitted to this shape and measured first (:mod:`fastsearch.search.warm_start`).

    ``fusion`` decides a Relax model's fused functions: ``"rules"`` (FuseOps' grouping, by
    fastsearch's partitioner) or ``"search"``: the rules' grouping is tuned with ``1 -
    fusion_share`` of the trials, then changes the rules never make (prologue, epilogue and
    horizontal fusion) get the rest, and each is kept only when the model, compiled and timed
    end to end in ``fusion_rounds`` interleaved rounds, is at least ``fusion_min_gain`` faster
    with it (:mod:`fastsearch.tuning.fusion_search`; ``TuneResult.fusion`` reports every change).

    ``pipeline`` is what a Relax model goes through before it is partitioned: ``"inference"``
    (the default: batch norm decomposed and folded into the preceding convolution's weights,
    constants folded, every per-channel scale and shift after a conv or matmul moved into its
    weight and one bias; :mod:`fastsearch.graph.inference`) or ``"none"`` (the model as given).
    ``result.mod`` and ``result.compile()`` are the optimized model; its ``main`` takes the
    same inputs. ``layout`` is the activations' layout the pipeline gives convolutions:
    ``"NCHWc"`` (the default: channel-blocked, 8 channels a block, as onnxruntime's MLAS
    computes; ``"NCHW16c"`` names another block) or ``"NCHW"`` (as imported). Blocked, every
    convolution whose channels the block divides, depthwise ones included, and the elementwise
    work and global pooling between them run on ``(N, C/8, H, W, 8)`` tensors, with weights
    re-laid out at compile time (:mod:`fastsearch.graph.layout`); a model without such convolutions
    is unchanged. On ``mobilenet-v2-small`` the tuned kernels took 0.52 of the NCHW ones' time.

    Arguments whose names start with an underscore are for fastsearch's own benchmarks and
    experiments (``_rerank=False``: no re-ranking of proposals by per-store features) and may
    change.

    Raises :class:`fastsearch.InvalidTarget`, :class:`fastsearch.UnsupportedWorkload`,
    :class:`fastsearch.DatabaseError`, :class:`fastsearch.RemoteError` (no reachable device), or
    :class:`fastsearch.MeasurementError` when not a single candidate of a task could be measured.
    """
    t_start = time.perf_counter()
    if trials < 0:
        raise ValueError(f"trials must be >= 0, got {trials}")
    check_fusion_argument(fusion, mod)
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown pipeline {pipeline!r}; available: {', '.join(PIPELINES)}")
    if pipeline == "inference" and is_relax_module(mod):
        assert isinstance(mod, IRModule)
        mod = optimize_for_inference(mod, layout=layout)
    if fusion == "search":
        assert isinstance(mod, IRModule)
        return tune_searching_fusion(
            mod,
            trials=trials,
            share=fusion_share,
            min_gain=fusion_min_gain,
            rounds=fusion_rounds,
            name=name or default_name(mod),
            tune=tune,
            options={
                "target": target,
                "seed": seed,
                "work_dir": work_dir,
                "strategy": strategy,
                "batch_size": batch_size,
                "measure": measure,
                "verify": verify,
                "rtol": rtol,
                "atol": atol,
                "progress": progress,
                "runner": runner,
                "task_scheduler": task_scheduler,
                "pipeline": "none",  # already applied above
                "warm_start": warm_start
                if isinstance(warm_start, WarmStart) or warm_start is None
                else WarmStart(warm_start),
            },
        )
    if task_scheduler not in SCHEDULERS:
        raise ValueError(f"unknown task_scheduler {task_scheduler!r}; available: {', '.join(SCHEDULERS)}")
    tgt = resolve_target(target)
    warm = warm_start if isinstance(warm_start, WarmStart) or warm_start is None else WarmStart(warm_start)
    make_sampler = _resolve_sampler(strategy, warm, rerank=_rerank)
    is_relax = is_relax_module(mod)
    if is_relax:
        assert isinstance(mod, IRModule)
        whole, model_tasks = extract_tasks(mod, groups=_groups)
        funcs = [(t.name, t.func) for t in model_tasks if t.skip is None]
        weights = {t.name: t.weight for t in model_tasks}
    else:
        whole, funcs = _primfuncs(mod)
        model_tasks = []
        weights = {fname: 1 for fname, _ in funcs}
    wname = name or default_name(mod)
    wdir = Path(work_dir) if work_dir is not None else Path.cwd() / "fastsearch_work" / wname
    timing = {k: 0.0 for k in ("search", "apply", "build", "run", "verify", "database", "model")}

    normalized = [(fname, _normalize_mod(func)) for fname, func in funcs]
    described = [_args_info(fname, tmod["main"]) for fname, tmod in normalized]  # before writing
    if not callable(strategy):
        for fname, tmod in normalized:  # fastsearch's sketches need the program model: fail before writing
            program_json(tmod["main"], fname)
    if runner is not None:
        runner.address()  # a malformed tracker address fails before anything is written

    t0 = time.perf_counter()
    db = TuningDatabase(wdir)
    apply_failures = _ApplyFailures(wdir / APPLY_FAILURES_FILE)
    tasks: list[_Task] = []
    n_tasks = max(1, len(funcs))
    round_robin = task_scheduler == "round-robin"
    # Round-robin keeps a fixed even split; the gradient rule only bounds the total.
    per_task = [trials // n_tasks + (1 if i < trials % n_tasks else 0) for i in range(len(funcs))]
    for (fname, tmod), args_info, budget in zip(normalized, described, per_task):
        workload = db.commit_workload(tmod)
        attrs = tmod["main"].attrs
        entry = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "main"
        result = TaskResult(
            name=fname, mod=tmod, trials=budget, weight=weights[fname], flops=task_flops(tmod["main"])
        )
        task = _Task(
            name=fname,
            mod=tmod,
            func=tmod["main"],
            entry=entry,
            workload=workload,
            args_info=args_info,
            post=Postprocessor(tmod, tgt),
            pristine=fresh_copy(tmod),
            result=result,
            weight=weights[fname],
        )
        best = db.best(workload)
        if best is not None:
            task.best_secs = mean_run_secs([float(s) for s in best.run_secs])
        tasks.append(task)
    timing["database"] += time.perf_counter() - t0

    history: list[TrialRecord] = []
    stored = {
        t.name: len(db.measured_keys(t.workload)) + len(apply_failures.keys.get(_wl_id(t), ())) for t in tasks
    }
    for t in tasks:
        t.result.trials_stored = stored[t.name]
    if round_robin:
        todo = [max(0, t.result.trials - stored[t.name]) for t in tasks]
        bsizes = [batch_size or min(16, max(4, math.ceil(t.result.trials / 4))) for t in tasks]
    else:
        spent = sum(stored.values())
        todo = [max(0, trials - spent)] * len(tasks)
        share = max(1, trials // n_tasks)  # small enough that the warm-up reaches every task
        bsizes = [batch_size or max(1, min(16, max(4, math.ceil(share / 4)), share))] * len(tasks)
    total_todo = sum(todo) if round_robin else (todo[0] if todo else 0)
    states = [
        TaskState(weight=t.weight, history=[t.best_secs] * math.ceil(stored[t.name] / bsizes[i]))
        for i, t in enumerate(tasks)
    ]
    for i in range(len(tasks)):
        states[i].active = todo[i] > 0
    if not round_robin and len(tasks) > 1:
        floors = floor_rounds([t.result.flops and t.weight * t.result.flops for t in tasks], trials, bsizes)
        for state, floor in zip(states, floors):
            state.floor = floor
    scheduler = make_scheduler(task_scheduler, states)
    n_failed = 0

    def overall_best_us() -> float | None:
        found = [t.weight * t.best_secs for t in tasks if math.isfinite(t.best_secs)]
        return sum(found) * 1e6 if found else None

    runs: dict[int, _TaskRun] = {}
    measurer: Measurer | None = None
    bar = ProgressBar(total_todo, enabled=progress, label=wname)
    remaining = total_todo
    try:
        with bar:
            bar.update(0, best_us=overall_best_us())
            while remaining > 0:
                ti = scheduler.next()
                if ti is None:
                    break
                task = tasks[ti]
                if measurer is None:
                    measurer = Measurer(tgt, measure, runner=runner)
                run = runs.get(ti)
                if run is None:
                    run = runs[ti] = _TaskRun(make_sampler(task, db, tgt))
                    if callable(run.update) and stored[task.name]:
                        t0 = time.perf_counter()  # warm start from what the database already holds
                        run.update(task.func, _stored_results(db, task))
                        timing["model"] += time.perf_counter() - t0
                n = min(bsizes[ti], remaining, todo[ti] - task.result.trials_measured)
                if len(tasks) > 1:
                    bar.label = f"{wname} [{ti + 1}/{len(tasks)} {task.name}]"
                wl_id = _wl_id(task)
                exclude = set(db.measured_keys(task.workload)) | apply_failures.keys.get(wl_id, set())
                t0 = time.perf_counter()
                drawn = run.sampler(
                    fresh_copy(task.func), tgt, n, _seed_for(seed, ti, run.round_index), exclude
                )
                timing["search"] += time.perf_counter() - t0
                run.round_index += 1
                t0 = time.perf_counter()
                batch: list[_Cand] = []
                for item in drawn:
                    cand = _as_candidate(task, item)
                    if cand.key not in exclude and len(batch) < n:
                        exclude.add(cand.key)
                        batch.append(cand)
                timing["apply"] += time.perf_counter() - t0
                if not batch:
                    run.empty_rounds += 1
                    if run.empty_rounds >= 3:
                        task.result.exhausted = True  # the search space has nothing new
                        scheduler.deactivate(ti)
                    continue
                run.empty_rounds = 0
                outcome = _run_batch(
                    task,
                    batch,
                    tgt,
                    db,
                    measurer,
                    apply_failures,
                    timing,
                    history,
                    t_start,
                    verify,
                    rtol,
                    atol,
                    overall_best_us,
                    runner,
                )
                remaining -= len(batch)
                n_failed += sum(1 for _, secs in outcome if secs is None)
                if callable(run.update):
                    t0 = time.perf_counter()
                    run.update(task.func, outcome)
                    timing["model"] += time.perf_counter() - t0
                scheduler.record(ti, task.best_secs)
                if task.result.trials_measured >= todo[ti]:
                    scheduler.deactivate(ti)
                bar.update(advance=len(batch), best_us=overall_best_us(), failed=n_failed)
            if measurer is not None and runner is None and measurer.config.final_candidates > 1:
                t0 = time.perf_counter()
                built_s, run_s = measurer.build_seconds, measurer.run_seconds
                for ti in runs:
                    tasks[ti].result.final = _final_round(tasks[ti], tgt, db, measurer, verify, rtol, atol)
                measurer.build_seconds, measurer.run_seconds = built_s, run_s  # counted as "final"
                timing["final"] = time.perf_counter() - t0
            for ti, run in runs.items():
                inner = getattr(run.sampler, "timing", None)
                if isinstance(inner, dict) and inner.get("model"):
                    timing["model"] += float(inner["model"])  # trained inside the sampler call
                    timing["search"] -= float(inner["model"])
                task = tasks[ti]
                if db.best(task.workload) is None:
                    raise MeasurementError(
                        f"task {task.name!r}: none of the {task.result.trials_measured + stored[task.name]} "
                        f"candidates could be built and measured; see the errors in the run history "
                        f"and {db.record_path}"
                        + (f"; last error: {history[-1].error}" if history and history[-1].error else "")
                    )
    finally:
        if measurer is not None:
            timing["build"] += measurer.build_seconds
            timing["run"] += measurer.run_seconds
            measurer.close()

    t0 = time.perf_counter()
    for task in tasks:
        best = db.best(task.workload)
        if best is not None:
            task.result.best_latency_us = mean_run_secs([float(s) for s in best.run_secs]) * 1e6
            task.result.best_trace = best.trace
        if not round_robin:  # what the gradient rule gave the task, stored records included
            task.result.trials = task.result.trials_stored + task.result.trials_measured
    timing["database"] += time.perf_counter() - t0
    timing["total"] = time.perf_counter() - t_start

    failures: dict[str, int] = {}
    for task in tasks:
        for kind, count in task.result.failures.items():
            failures[kind] = failures.get(kind, 0) + count
    lat = [(t.weight, t.result.best_latency_us) for t in tasks]
    best_latency = (
        sum(w * x for w, x in lat if x is not None) if lat and all(x is not None for _, x in lat) else None
    )
    results = {t.name: t.result for t in tasks}
    if is_relax:  # every task in program order, the skipped ones with their reason
        tuned = results
        results = {}
        for mt in model_tasks:
            results[mt.name] = tuned.get(mt.name) or TaskResult(
                name=mt.name, mod=_normalize_mod(mt.func), trials=0, weight=mt.weight, skipped=mt.skip
            )
            results[mt.name].functions = list(mt.functions)
    return TuneResult(
        best_latency_us=best_latency,
        best_trace=tasks[0].result.best_trace if len(tasks) == 1 and not is_relax else None,
        database=db,
        work_dir=wdir,
        timing=timing,
        trials_measured=sum(t.result.trials_measured for t in tasks),
        failed=n_failed,
        history=history,
        tasks=results,
        target=tgt,
        mod=whole,
        failures={k: failures[k] for k in sorted(failures, key=_kind_order)},
        repairs=list(db.repairs),
        is_relax=is_relax,
        task_scheduler=task_scheduler,
        warm_start=warm,
    )


class _TaskRun:
    """A task's search state across the batches the scheduler gives it."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.update = getattr(sampler, "update", None)
        self.round_index = 0
        self.empty_rounds = 0


def _kind_order(kind: str) -> int:
    return FAILURE_KINDS.index(kind) if kind in FAILURE_KINDS else len(FAILURE_KINDS)


def _wl_id(task: _Task) -> str:
    return f"{structural_hash(task.mod) & 0xFFFFFFFFFFFFFFFF:016x}"


@dataclass
class _Cand:
    key: str
    sch: Schedule | None
    error: str | None


def _as_candidate(task: _Task, item: Any) -> _Cand:
    """A sampler's item as (key, postprocessed schedule or None, error)."""
    if isinstance(item, Trace):
        sch, error = _apply(task, item)
        return _Cand(candidate_key(item), sch, error)
    key = getattr(item, "key", None)
    sch = getattr(item, "schedule", None)
    if not isinstance(key, str) or not isinstance(sch, Schedule):
        raise MalformedInput(
            f"the sampler returned {type(item).__name__} {str(item)[:60]!r}; expected a "
            "tvm.s_tir.Trace or a Candidate (key and schedule)"
        )
    return _Cand(key, sch, None)


def _run_batch(
    task: _Task,
    batch: Sequence[_Cand],
    target: tvm.target.Target,
    db: TuningDatabase,
    measurer: Measurer,
    apply_failures: _ApplyFailures,
    timing: dict[str, float],
    history: list[TrialRecord],
    t_start: float,
    verify: bool,
    rtol: float,
    atol: float,
    overall_best_us: Callable[[], float | None],
    remote: RPCRunner | None = None,
) -> list[tuple[str, float | None]]:
    """Build, run, check and store one batch; returns (key, mean seconds or None) per candidate."""
    best_before = task.best_secs
    runnable = [i for i, c in enumerate(batch) if c.error is None and c.sch is not None]
    results = [
        MeasureResult(error=c.error, failure=None if c.error is None else "apply error") for c in batch
    ]
    measured = measurer.measure([batch[i].sch.mod for i in runnable], task.args_info)  # type: ignore[union-attr]
    for i, res in zip(runnable, measured):
        results[i] = res

    try:
        # Confirm with more runs, then check, fastest first, each candidate that would become
        # the task's best.
        order = sorted((i for i in runnable if results[i].ok), key=lambda i: results[i].mean_us or math.inf)
        for i in order:
            if mean_run_secs(results[i].run_secs) >= task.best_secs:
                break
            t0 = time.perf_counter()
            measurer.confirm(results[i], task.args_info)  # more runs: a lucky one makes no best
            timing["run"] += time.perf_counter() - t0
            if not results[i].ok:
                continue
            secs = mean_run_secs(results[i].run_secs)
            if secs >= task.best_secs:
                continue
            if verify:
                t0 = time.perf_counter()
                sch = batch[i].sch
                assert sch is not None
                fault = _check_candidate(task, sch, results[i], target, rtol, atol, measurer, remote)
                timing["verify"] += time.perf_counter() - t0
                if fault is not None:
                    results[i].fail(*fault)
                    continue
            # No break: a later candidate whose first run beats this one's confirmed mean is
            # confirmed and checked in turn.
            task.best_secs = secs
    finally:
        Measurer.release(results)

    t0 = time.perf_counter()
    wl_id = _wl_id(task)
    best_after, running = task.best_secs, best_before
    outcome: list[tuple[str, float | None]] = []
    for cand, res in zip(batch, results):
        outcome.append((cand.key, mean_run_secs(res.run_secs) if res.ok else None))
        if cand.sch is None:
            apply_failures.add(wl_id, cand.key, res.error or "cannot apply the trace")
        else:
            db.commit(
                task.workload,
                cand.sch.trace,
                res.run_secs if res.ok else None,
                target,
                task.args_info,
                cand.key,
            )
        task.result.trials_measured += 1
        if not res.ok:
            task.result.failed += 1
            kind = res.failure or "run error"
            task.result.failures[kind] = task.result.failures.get(kind, 0) + 1
        if res.ok:  # every ok result faster than the old best was checked: the curve only counts those
            running = min(running, mean_run_secs(res.run_secs))
        task.best_secs = running
        best = overall_best_us()
        history.append(
            TrialRecord(
                trial=len(history) + 1,
                task=task.name,
                latency_us=res.mean_us,
                min_us=res.min_us,
                median_us=res.median_us,
                error=res.error,
                elapsed_s=time.perf_counter() - t_start,
                best_us=best,
                failure=None if res.ok else (res.failure or "run error"),
            )
        )
    task.best_secs = best_after
    timing["database"] += time.perf_counter() - t0
    return outcome


def _final_round(
    task: _Task,
    target: tvm.target.Target,
    db: TuningDatabase,
    measurer: Measurer,
    verify: bool,
    rtol: float,
    atol: float,
) -> FinalRound | None:
    """Time the task's best records side by side; a runner-up that beats the best becomes it.

    While tuning, each candidate was timed once (a best, three times) at its own moment, on its
    own arguments: placement and the machine's state move a kernel by 10-50% between such
    measurements, so among near-equal candidates the best is partly the luckiest. Timed side by
    side in one process, they differ mostly by what they are.
    """
    cfg = measurer.config
    top: list[ms.database.TuningRecord] = []
    seen: set[str] = set()
    for rec in db.ms_database.get_top_k(task.workload, cfg.final_candidates * 2):
        key = candidate_key(rec.trace)
        if key not in seen:
            seen.add(key)
            top.append(rec)
        if len(top) == cfg.final_candidates:
            break
    if len(top) < 2:
        return None
    schs = [_apply(task, rec.trace)[0] for rec in top]
    if schs[0] is None:
        return None
    keep = [i for i, sch in enumerate(schs) if sch is not None]
    built = measurer.build([schs[i].mod for i in keep])  # type: ignore[union-attr]
    try:
        ok = [i for i, res in zip(keep, built) if res.artifact_path is not None]
        if len(ok) < 2 or ok[0] != 0:
            return None
        paths = [str(built[keep.index(i)].artifact_path) for i in ok]
        # A prepacked weight is taken in the candidate's own layout: each gets its arguments.
        layouts = [built[keep.index(i)].args_info or task.args_info for i in ok]
        try:
            times = measurer.side_by_side(
                paths, [random_arguments(info, seed=1) for info in layouts], cfg.final_rounds, task.entry
            )
        except CandidateFault:
            return None
        per_round = {i: [t / b for t, b in zip(times[j], times[0])] for j, i in enumerate(ok)}
        ratio = {i: sum(r) / len(r) for i, r in per_round.items()}
        final = FinalRound(
            rounds=cfg.final_rounds, ratios=[ratio.get(i, math.nan) for i in range(1, len(top))]
        )
        best_secs = mean_run_secs([float(x) for x in top[0].run_secs])
        for i in sorted(ok[1:], key=ratio.__getitem__):
            if ratio[i] >= 1.0:
                break
            sch = schs[i]
            assert sch is not None
            if verify and _check_candidate(task, sch, built[keep.index(i)], target, rtol, atol, measurer):
                continue  # never checked while tuning (it was never the best): wrong, so not chosen
            secs = [best_secs * r for r in per_round[i]]
            db.commit(task.workload, sch.trace, secs, target, task.args_info)
            task.best_secs = mean_run_secs(secs)
            final.chosen = i - 1
            break
        return final
    finally:
        Measurer.release(built)


def _stored_results(db: TuningDatabase, task: _Task) -> list[tuple[str, float | None]]:
    """(key, mean seconds or None) of every stored record of the task, for a strategy's warm start."""
    return [(key, None if secs >= FAILED_RUN_SECS else secs) for key, secs in db.results(task.workload)]


def _check_candidate(
    task: _Task,
    sch: Schedule,
    res: MeasureResult,
    target: tvm.target.Target,
    rtol: float,
    atol: float,
    measurer: Measurer,
    remote: RPCRunner | None = None,
) -> tuple[str, str] | None:
    """Compare the candidate's outputs with the untuned function's on random inputs; returns
    ``(failure kind, error)`` when it does not compute the same, crashes or hangs, else ``None``.

    Runs the measured artifact itself when the schedule keeps the argument layouts; a schedule
    that rewrites weight layouts is measured without the rewrite, so it is rebuilt whole here.
    Locally the candidate runs in a worker process (it must not take the tuner down with it);
    with a remote runner it runs on one of the remote devices, where it was timed.
    """
    try:
        if task.reference is None:
            task.inputs = random_arguments(task.args_info, seed=0)
            host = tvm.target.Target("llvm")
            ref_mod = tvm.compile(task.pristine, target=host)
            task.reference = run_function(ref_mod, task.inputs, tvm.cpu(0), task.entry)
    except Exception as exc:
        raise MeasurementError(f"task {task.name!r}: cannot compute the reference output: {exc}") from exc
    assert task.inputs is not None
    try:
        built = res.args_info  # set by the build when a layout rewrite changed the arguments
        rewrites_layout = built is not None and [plain_args_info(a) for a in built] != [
            plain_args_info(a) for a in task.args_info
        ]
        if remote is not None:
            out = _run_remote(remote, sch, res, target, task, rewrites_layout)
        elif res.artifact_path and not rewrites_layout:
            out = measurer.run_isolated(res.artifact_path, task.inputs, task.entry)
        else:
            with tempfile.TemporaryDirectory(prefix="fastsearch_check_") as tmp:
                path = os.path.join(tmp, "candidate.so")
                tvm.compile(sch.mod, target=target).export_library(path)
                out = measurer.run_isolated(path, task.inputs, task.entry)
    except CandidateFault as fault:
        return fault.kind, f"{fault.kind} while checking its output: {fault}"
    except Exception as exc:  # noqa: BLE001  (recorded as a failed candidate)
        return "wrong answer", f"wrong answer: cannot run the candidate for checking: {exc}"
    diff = compare_outputs(task.reference, out, rtol=rtol, atol=atol)
    return None if diff is None else ("wrong answer", f"wrong answer: {diff}")


def _run_remote(
    remote: RPCRunner,
    sch: Schedule,
    res: MeasureResult,
    target: tvm.target.Target,
    task: _Task,
    rebuild: bool,
) -> list[np.ndarray]:
    """Run the candidate on a remote device on the task's inputs; returns every argument after."""
    assert task.inputs is not None
    with tempfile.TemporaryDirectory(prefix="fastsearch_check_") as tmp:
        path = res.artifact_path
        if rebuild or not path:
            path = os.path.join(tmp, "candidate.so")
            tvm.compile(sch.mod, target=target).export_library(path)
        session = remote.connect(60.0)
        remote_name = f"fastsearch_check_{os.getpid()}_{os.path.basename(path)}"
        session.upload(path, remote_name)
        try:
            rt_mod = session.load_module(remote_name)
            dev = session.device(device_type(target), 0)
            return run_function(rt_mod, task.inputs, dev, task.entry)
        finally:
            with contextlib.suppress(Exception):  # the remote temp dir goes with the session anyway
                session.remove(remote_name)
