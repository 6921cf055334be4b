"""The tuning loop behind ``fastsearch.tune``: search, measure, store, repeat; then check and
report the best.

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
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.ir import IRModule
from tvm.s_tir import Schedule, Trace
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from tvm_ffi import structural_hash

from fastsearch import _core
from fastsearch.database import (
    FAILED_RUN_SECS,
    TuningDatabase,
    candidate_key,
    mean_run_secs,
    superseding_run_secs,
)
from fastsearch.errors import MalformedInput, MeasurementError, UnsupportedWorkload
from fastsearch.graph.model_timing import model_inputs
from fastsearch.graph.relax_tasks import ModelTask, extract_tasks, is_relax_module
from fastsearch.ir.target import device_type, target_kind
from fastsearch.ir.tir_import import program_json
from fastsearch.ir.vector_math import TIR_PIPELINE
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
from fastsearch.search.gpu import GpuSampler
from fastsearch.search.guided import ModelGuidedSampler, SiblingRecords
from fastsearch.search.sample import Postprocessor, fresh_copy, sample_candidates
from fastsearch.search.state import SearchState
from fastsearch.search.warm_start import WarmStart
from fastsearch.tuning.model_round import ModelRound, model_round
from fastsearch.tuning.options import STRATEGIES, Sampler, TuningPlan, Verification
from fastsearch.tuning.progress import ProgressBar
from fastsearch.tuning.result import FinalRound, TaskResult, TrialRecord, TuneResult
from fastsearch.tuning.scheduler import TaskScheduler, TaskState, floor_rounds, make_scheduler

__all__ = ["default_name", "run", "task_flops"]

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
    build_secs: list[float] = field(default_factory=list)  # this run's builds, for the timeout


_MakeSampler = Callable[["_Task", TuningDatabase, tvm.target.Target], Sampler]


def _resolve_sampler(
    strategy: str | Sampler, warm: WarmStart | None = None, rerank: bool = True, build_cost: bool = True
) -> _MakeSampler:
    """Per-task sampler factory for ``strategy``, started from ``warm`` when given; ``rerank``
    keeps the model-guided search's re-ranking by per-store features on
    (:data:`fastsearch.search.guided.RERANK_AFTER`), ``build_cost`` its ranking by predicted
    build time (:data:`fastsearch.search.guided.BUILD_RANK_WEIGHT`)."""
    if warm is not None and (callable(strategy) or strategy == "random"):
        raise ValueError(
            f"warm_start needs a model-guided strategy ({', '.join(STRATEGIES[1:])}), not {strategy!r}"
        )
    if callable(strategy):
        user = strategy
        return lambda task, db, target: user
    if strategy == "random":

        def make_random(task: _Task, db: TuningDatabase, target: tvm.target.Target) -> Sampler:
            if target_kind(target) == "cuda":
                return GpuSampler(task.func, target, task.post, strategy="random")

            def draw(
                func: tvm.tirx.PrimFunc, target: tvm.target.Target, n: int, seed: int, exclude: set
            ) -> list:
                return sample_candidates(func, target, n, seed, exclude, postprocessor=task.post)

            return draw

        return make_random
    if strategy in STRATEGIES:
        siblings = SiblingRecords()  # one per run: each task's model also learns from the others'

        def make_guided(task: _Task, db: TuningDatabase, target: tvm.target.Target) -> Sampler:
            if target_kind(target) == "cuda":
                if warm is not None:
                    raise ValueError("warm_start is not available for CUDA targets yet")
                return GpuSampler(task.func, target, task.post, strategy=str(strategy))
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
                state=SearchState.of_task(db.path, task.name, task.mod),
                warm=warm.for_task(task.func, _core.Program(program_json(task.func)))
                if warm is not None
                else None,
                siblings=siblings,
                name=task.name,
                rerank=rerank,
                build_cost=build_cost,
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


@dataclass
class _Setup:
    """A run's tasks, resolved: what the loop schedules and what the result reports."""

    whole: IRModule
    model_tasks: list[ModelTask]
    tasks: list[_Task]
    db: TuningDatabase
    apply_failures: _ApplyFailures
    stored: dict[str, int]
    is_relax: bool


@dataclass
class _Budget:
    """Each task's trials still to measure, its batch size, and the task scheduler over them."""

    todo: list[int]
    batch_sizes: list[int]
    scheduler: TaskScheduler
    total: int


def run(mod: tvm.tirx.PrimFunc | IRModule, plan: TuningPlan) -> TuneResult:
    """Tune ``mod`` (a PrimFunc, an IRModule of PrimFuncs, or a Relax model as the pipeline left
    it) as ``plan`` says; :func:`fastsearch.tune` is the documented entry point."""
    t_start = time.perf_counter()
    timing = {k: 0.0 for k in ("search", "apply", "build", "run", "verify", "database", "model")}
    make_sampler = _resolve_sampler(plan.strategy, plan.warm, rerank=plan.rerank, build_cost=plan.build_cost)
    setup = _prepare(mod, plan, timing)
    budget = _budget(plan, setup)
    history: list[TrialRecord] = []
    n_failed = _loop(plan, setup, budget, make_sampler, timing, history, t_start)
    found = _model_round(plan, setup, timing) if setup.is_relax else None
    t0 = time.perf_counter()
    for task in setup.tasks:
        best = setup.db.best(task.workload)
        if best is not None:
            task.result.best_latency_us = mean_run_secs([float(s) for s in best.run_secs]) * 1e6
            task.result.best_trace = best.trace
        if plan.task_scheduler != "round-robin":  # what the gradient rule gave, stored included
            task.result.trials = task.result.trials_stored + task.result.trials_measured
    timing["database"] += time.perf_counter() - t0
    timing["total"] = time.perf_counter() - t_start
    result = _result(plan, setup, timing, history, n_failed)
    result.model_round = found
    return result


def _model_round(plan: TuningPlan, setup: _Setup, timing: dict[str, float]) -> ModelRound | None:
    """Each task's best records tried inside the model's call sequence
    (:mod:`fastsearch.tuning.model_round`): for a whole model timed on this machine, when
    ``plan.model_round`` says so."""
    cfg = plan.measure or MeasureConfig()
    if plan.model_round is False or plan.runner is not None or cfg.model_candidates < 2:
        return None
    if plan.model_round is None and not any(t.result.trials_measured for t in setup.tasks):
        return None
    functions = {mt.name: list(mt.functions) for mt in setup.model_tasks}
    tasks = {
        t.name: (t.workload, functions.get(t.name, [t.name]))
        for t in setup.tasks
        if setup.db.best(t.workload) is not None
    }
    if not tasks:
        return None
    t0 = time.perf_counter()
    check = plan.verification or Verification()
    try:
        found = model_round(
            setup.whole,
            setup.db,
            plan.target,
            tasks,
            model_inputs(setup.whole, seed=1),
            plan.work_dir,
            candidates=cfg.model_candidates,
            rounds=cfg.model_rounds,
            tolerance=(check.rtol, check.atol),
        )
    except (MeasurementError, UnsupportedWorkload, subprocess.TimeoutExpired) as exc:
        found = ModelRound(candidates=cfg.model_candidates, rounds=cfg.model_rounds, skipped=str(exc))
    timing["model_round"] = time.perf_counter() - t0
    return found


def _prepare(mod: tvm.tirx.PrimFunc | IRModule, plan: TuningPlan, timing: dict[str, float]) -> _Setup:
    """The tasks of ``mod``, checked before anything is written, and the database they go to."""
    is_relax = is_relax_module(mod)
    if is_relax:
        assert isinstance(mod, IRModule)
        whole, model_tasks = extract_tasks(mod, groups=plan.groups)
        funcs = [(t.name, t.func) for t in model_tasks if t.skip is None]
        weights = {t.name: t.weight for t in model_tasks}
    else:
        whole, funcs = _primfuncs(mod)
        model_tasks = []
        weights = {fname: 1 for fname, _ in funcs}
    normalized = [(fname, _normalize_mod(func)) for fname, func in funcs]
    described = [_args_info(fname, tmod["main"]) for fname, tmod in normalized]  # before writing
    if not callable(plan.strategy):
        for fname, tmod in normalized:  # fastsearch's sketches need the program model: fail before writing
            program_json(tmod["main"], fname)
    if plan.runner is not None:
        plan.runner.address()  # a malformed tracker address fails before anything is written

    t0 = time.perf_counter()
    db = TuningDatabase(plan.work_dir)
    apply_failures = _ApplyFailures(plan.work_dir / APPLY_FAILURES_FILE)
    tasks: list[_Task] = []
    n_tasks = max(1, len(funcs))
    # Round-robin keeps a fixed even split; the gradient rule only bounds the total.
    trials = plan.trials
    per_task = [trials // n_tasks + (1 if i < trials % n_tasks else 0) for i in range(len(funcs))]
    for (fname, tmod), args_info, share in zip(normalized, described, per_task):
        workload = db.commit_workload(tmod)
        attrs = tmod["main"].attrs
        entry = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "main"
        result = TaskResult(
            name=fname, mod=tmod, trials=share, weight=weights[fname], flops=task_flops(tmod["main"])
        )
        task = _Task(
            name=fname,
            mod=tmod,
            func=tmod["main"],
            entry=entry,
            workload=workload,
            args_info=args_info,
            post=Postprocessor(tmod, plan.target),
            pristine=fresh_copy(tmod),
            result=result,
            weight=weights[fname],
        )
        result.cold = plan.runner is None and (plan.measure or MeasureConfig()).times_cold(
            args_info, whole_model=bool(model_tasks)
        )
        best = db.best(workload)
        if best is not None:
            task.best_secs = mean_run_secs([float(s) for s in best.run_secs])
        tasks.append(task)
    timing["database"] += time.perf_counter() - t0
    stored = {
        t.name: len(db.measured_keys(t.workload)) + len(apply_failures.keys.get(_wl_id(t), ())) for t in tasks
    }
    for t in tasks:
        t.result.trials_stored = stored[t.name]
    return _Setup(whole, model_tasks, tasks, db, apply_failures, stored, is_relax)


def _budget(plan: TuningPlan, setup: _Setup) -> _Budget:
    """Trials left per task (stored records count), batch sizes, floors and the scheduler."""
    tasks, stored, trials = setup.tasks, setup.stored, plan.trials
    n_tasks = max(1, len(tasks))
    if plan.task_scheduler == "round-robin":
        todo = [max(0, t.result.trials - stored[t.name]) for t in tasks]
        bsizes = [plan.batch_size or min(16, max(4, math.ceil(t.result.trials / 4))) for t in tasks]
        total = sum(todo)
    else:
        spent = sum(stored.values())
        todo = [max(0, trials - spent)] * len(tasks)
        share = max(1, trials // n_tasks)  # small enough that the warm-up reaches every task
        bsizes = [plan.batch_size or max(1, min(16, max(4, math.ceil(share / 4)), share))] * len(tasks)
        total = todo[0] if todo else 0
    states = [
        TaskState(weight=t.weight, history=[t.best_secs] * math.ceil(stored[t.name] / bsizes[i]))
        for i, t in enumerate(tasks)
    ]
    for i in range(len(tasks)):
        states[i].active = todo[i] > 0
    if plan.task_scheduler != "round-robin" and len(tasks) > 1:
        floors = floor_rounds([t.result.flops and t.weight * t.result.flops for t in tasks], trials, bsizes)
        for state, floor in zip(states, floors):
            state.floor = floor
    return _Budget(todo, bsizes, make_scheduler(plan.task_scheduler, states), total)


def _loop(
    plan: TuningPlan,
    setup: _Setup,
    budget: _Budget,
    make_sampler: _MakeSampler,
    timing: dict[str, float],
    history: list[TrialRecord],
    t_start: float,
) -> int:
    """Batches until the budget is spent or every task is done, then the final rounds; returns
    how many candidates failed."""
    tasks, db, tgt = setup.tasks, setup.db, plan.target
    scheduler, todo = budget.scheduler, budget.todo
    n_failed = 0

    def overall_best_us() -> float | None:
        found = [t.weight * t.best_secs for t in tasks if math.isfinite(t.best_secs)]
        return sum(found) * 1e6 if found else None

    runs: dict[int, _TaskRun] = {}
    measurer: Measurer | None = None
    bar = ProgressBar(budget.total, enabled=plan.progress, label=plan.name)
    remaining = budget.total
    try:
        with bar:
            bar.update(0, best_us=overall_best_us())
            while remaining > 0:
                ti = scheduler.next()
                if ti is None:
                    break
                task = tasks[ti]
                if measurer is None:
                    measurer = Measurer(tgt, plan.measure, runner=plan.runner)
                run = runs.get(ti)
                if run is None:
                    run = runs[ti] = _start_task(task, make_sampler, setup, tgt, timing)
                n = min(budget.batch_sizes[ti], remaining, todo[ti] - task.result.trials_measured)
                if len(tasks) > 1:
                    bar.label = f"{plan.name} [{ti + 1}/{len(tasks)} {task.name}]"
                batch = _draw(task, run, setup, tgt, n, _seed_for(plan.seed, ti, run.round_index), timing)
                run.round_index += 1
                if not batch:
                    run.empty_rounds += 1
                    if run.empty_rounds >= 3:
                        task.result.exhausted = True  # the search space has nothing new
                        scheduler.deactivate(ti)
                    continue
                run.empty_rounds = 0
                outcome, builds = _run_batch(
                    task,
                    batch,
                    tgt,
                    db,
                    measurer,
                    setup.apply_failures,
                    timing,
                    history,
                    t_start,
                    plan.verification,
                    overall_best_us,
                    plan.runner,
                )
                remaining -= len(batch)
                n_failed += sum(1 for _, secs in outcome if secs is None)
                if callable(run.update):
                    t0 = time.perf_counter()
                    run.update(task.func, outcome)
                    timing["model"] += time.perf_counter() - t0
                if callable(run.record_builds) and builds:
                    run.record_builds(builds)
                scheduler.record(ti, task.best_secs)
                if task.result.trials_measured >= todo[ti]:
                    scheduler.deactivate(ti)
                bar.update(advance=len(batch), best_us=overall_best_us(), failed=n_failed)
            if measurer is not None and plan.runner is None and measurer.config.final_candidates > 1:
                _final_rounds(plan, setup, runs, measurer, timing)
            _finish_runs(setup, runs, timing, history)
    finally:
        if measurer is not None:
            timing["build"] += measurer.build_seconds
            timing["run"] += measurer.run_seconds
            measurer.close()
    return n_failed


def _start_task(
    task: _Task,
    make_sampler: _MakeSampler,
    setup: _Setup,
    target: tvm.target.Target,
    timing: dict[str, float],
) -> _TaskRun:
    """A task's first batch: its sampler, warm-started from what the database already holds."""
    run = _TaskRun(make_sampler(task, setup.db, target))
    if callable(run.update) and setup.stored[task.name]:
        t0 = time.perf_counter()
        run.update(task.func, _stored_results(setup.db, task))
        timing["model"] += time.perf_counter() - t0
    return run


def _draw(
    task: _Task,
    run: _TaskRun,
    setup: _Setup,
    target: tvm.target.Target,
    n: int,
    seed: int,
    timing: dict[str, float],
) -> list[_Cand]:
    """At most ``n`` new candidates from the task's sampler, none measured or refused before."""
    exclude = set(setup.db.measured_keys(task.workload)) | setup.apply_failures.keys.get(_wl_id(task), set())
    t0 = time.perf_counter()
    drawn = run.sampler(fresh_copy(task.func), target, n, seed, exclude)
    timing["search"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    batch: list[_Cand] = []
    for item in drawn:
        cand = _as_candidate(task, item)
        if cand.key not in exclude and len(batch) < n:
            exclude.add(cand.key)
            batch.append(cand)
    timing["apply"] += time.perf_counter() - t0
    return batch


def _final_rounds(
    plan: TuningPlan, setup: _Setup, runs: dict[int, _TaskRun], measurer: Measurer, timing: dict[str, float]
) -> None:
    """Every tuned task's best records timed side by side (:func:`_final_round`)."""
    t0 = time.perf_counter()
    built_s, run_s = measurer.build_seconds, measurer.run_seconds
    for ti in runs:
        task = setup.tasks[ti]
        task.result.final = _final_round(task, plan.target, setup.db, measurer, plan.verification)
    measurer.build_seconds, measurer.run_seconds = built_s, run_s  # counted as "final"
    timing["final"] = time.perf_counter() - t0


def _finish_runs(
    setup: _Setup, runs: dict[int, _TaskRun], timing: dict[str, float], history: list[TrialRecord]
) -> None:
    """Moves the samplers' model training time from search to model; a task without a single
    measured record is an error."""
    for ti, run in runs.items():
        inner = getattr(run.sampler, "timing", None)
        if isinstance(inner, dict) and inner.get("model"):
            timing["model"] += float(inner["model"])  # trained inside the sampler call
            timing["search"] -= float(inner["model"])
        task = setup.tasks[ti]
        if setup.db.best(task.workload) is None:
            raise MeasurementError(
                f"task {task.name!r}: none of the {task.result.trials_measured + setup.stored[task.name]} "
                f"candidates could be built and measured; see the errors in the run history "
                f"and {setup.db.record_path}"
                + (f"; last error: {history[-1].error}" if history and history[-1].error else "")
            )


def _result(
    plan: TuningPlan, setup: _Setup, timing: dict[str, float], history: list[TrialRecord], n_failed: int
) -> TuneResult:
    tasks = setup.tasks
    failures: dict[str, int] = {}
    examples: dict[str, str] = {}
    for task in tasks:
        for kind, count in task.result.failures.items():
            failures[kind] = failures.get(kind, 0) + count
        for kind, error in task.result.failure_examples.items():
            examples.setdefault(kind, f"{task.name}: {error}")
    lat = [(t.weight, t.result.best_latency_us) for t in tasks]
    best_latency = (
        sum(w * x for w, x in lat if x is not None) if lat and all(x is not None for _, x in lat) else None
    )
    results = {t.name: t.result for t in tasks}
    if setup.is_relax:  # every task in program order, the skipped ones with their reason
        tuned = results
        results = {}
        for mt in setup.model_tasks:
            results[mt.name] = tuned.get(mt.name) or TaskResult(
                name=mt.name, mod=_normalize_mod(mt.func), trials=0, weight=mt.weight, skipped=mt.skip
            )
            results[mt.name].functions = list(mt.functions)
    return TuneResult(
        best_latency_us=best_latency,
        best_trace=tasks[0].result.best_trace if len(tasks) == 1 and not setup.is_relax else None,
        database=setup.db,
        work_dir=plan.work_dir,
        timing=timing,
        trials_measured=sum(t.result.trials_measured for t in tasks),
        failed=n_failed,
        history=history,
        tasks=results,
        target=plan.target,
        mod=setup.whole,
        failures={k: failures[k] for k in sorted(failures, key=_kind_order)},
        failure_examples=examples,
        repairs=list(setup.db.repairs),
        is_relax=setup.is_relax,
        task_scheduler=plan.task_scheduler,
        warm_start=plan.warm,
    )


class _TaskRun:
    """A task's search state across the batches the scheduler gives it."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.update = getattr(sampler, "update", None)
        self.record_builds = getattr(sampler, "record_builds", None)
        self.round_index = 0
        self.empty_rounds = 0


def _trial_record(
    trial: int, task: str, res: MeasureResult, t_start: float, best_us: float | None
) -> TrialRecord:
    """The history's record of one measured candidate, its build's stage seconds included."""
    stages = res.build_stages or {}
    return TrialRecord(
        trial=trial,
        task=task,
        latency_us=res.mean_us,
        min_us=res.min_us,
        median_us=res.median_us,
        error=res.error,
        elapsed_s=time.perf_counter() - t_start,
        best_us=best_us,
        failure=None if res.ok else (res.failure or "run error"),
        build_passes_s=stages.get("passes"),
        build_codegen_s=stages.get("codegen"),
        build_export_s=stages.get("export"),
    )


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
    check: Verification | None,
    overall_best_us: Callable[[], float | None],
    remote: RPCRunner | None = None,
) -> tuple[list[tuple[str, float | None]], list[tuple[str, float]]]:
    """Build, run, check and store one batch; returns (key, mean seconds or None) per candidate,
    and (key, build seconds) per candidate whose build recorded them or was stopped (the limit it
    ran for: the build-time model learns what builds too slowly)."""
    best_before = task.best_secs
    runnable = [i for i, c in enumerate(batch) if c.error is None and c.sch is not None]
    results = [
        MeasureResult(error=c.error, failure=None if c.error is None else "apply error") for c in batch
    ]
    measured = measurer.measure(
        [batch[i].sch.mod for i in runnable],  # type: ignore[union-attr]
        task.args_info,
        cold=task.result.cold,
        build_secs=task.build_secs,
    )
    task.build_secs.extend(r.build_s for r in measured if r.build_s is not None)
    for i, res in zip(runnable, measured):
        results[i] = res

    try:
        # Confirm with more runs, then check, fastest first, each candidate that would become
        # the task's best.
        order = sorted((i for i in runnable if results[i].ok), key=lambda i: results[i].mean_us or math.inf)
        for i in order:
            if mean_run_secs(results[i].run_secs) >= task.best_secs:
                break
            # More runs (a lucky one makes no best); the measurer counts their seconds as "run".
            measurer.confirm(results[i], task.args_info, cold=task.result.cold)
            if not results[i].ok:
                continue
            secs = mean_run_secs(results[i].run_secs)
            if secs >= task.best_secs:
                continue
            if check is not None:
                t0 = time.perf_counter()
                sch = batch[i].sch
                assert sch is not None
                fault = _check_candidate(task, sch, results[i], target, check, measurer, remote)
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
            task.result.failure_examples.setdefault(kind, res.error or kind)
        if res.ok:  # every ok result faster than the old best was checked: the curve only counts those
            running = min(running, mean_run_secs(res.run_secs))
        task.best_secs = running
        history.append(_trial_record(len(history) + 1, task.name, res, t_start, overall_best_us()))
    task.best_secs = best_after
    timing["database"] += time.perf_counter() - t0
    builds: list[tuple[str, float]] = []
    for c, r in zip(batch, results):
        took = r.build_s if r.build_s is not None else r.build_killed_s
        if took is not None:
            builds.append((c.key, took))
    return outcome, builds


def _final_round(
    task: _Task,
    target: tvm.target.Target,
    db: TuningDatabase,
    measurer: Measurer,
    check: Verification | None,
) -> FinalRound | None:
    """Time the task's best records side by side; a runner-up that beats the best becomes it.

    While tuning, each candidate was timed once (a best, three times) at its own moment, on its
    own arguments: placement and the machine's state move a kernel by 10-50% between such
    measurements, so among near-equal candidates the best is partly the luckiest. Timed side by
    side, they differ mostly by what they are; in the measurer's kept worker and then in fresh
    ones (``final_processes``), since some kernels keep a time per process.
    """
    cfg = measurer.config
    top = db.top_distinct(task.workload, cfg.final_candidates)
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
        arrays = [random_arguments(info, seed=1) for info in layouts]
        processes = max(1, cfg.final_processes)
        per_round: dict[int, list[float]] = {i: [] for i in ok}
        own: dict[int, list[float]] = {i: [] for i in ok}  # seconds per call, every round
        for process in range(processes):
            try:
                times = measurer.side_by_side(
                    paths,
                    arrays,
                    cfg.final_rounds,
                    task.entry,
                    cold=task.result.cold,
                    fresh=process > 0,
                )
            except CandidateFault:
                return None
            for j, i in enumerate(ok):
                per_round[i] += [t / b for t, b in zip(times[j], times[0])]
                own[i] += [float(t) for t in times[j]]
        ratio = {i: sum(r) / len(r) for i, r in per_round.items()}
        final = FinalRound(
            rounds=cfg.final_rounds,
            ratios=[ratio.get(i, math.nan) for i in range(1, len(top))],
            processes=processes,
            times_us=[sum(own[i]) / len(own[i]) * 1e6 if i in own else math.nan for i in range(len(top))],
        )
        best_secs = mean_run_secs([float(x) for x in top[0].run_secs])
        for i in sorted(ok[1:], key=ratio.__getitem__):
            if ratio[i] >= 1.0:
                break
            sch = schs[i]
            assert sch is not None
            if check is not None and _check_candidate(
                task, sch, built[keep.index(i)], target, check, measurer
            ):
                continue  # never checked while tuning (it was never the best): wrong, so not chosen
            secs = superseding_run_secs(own[i], best_secs)
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
    check: Verification,
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
                tvm.compile(sch.mod, target=target, tir_pipeline=TIR_PIPELINE).export_library(path)
                out = measurer.run_isolated(path, task.inputs, task.entry)
    except CandidateFault as fault:
        return fault.kind, f"{fault.kind} while checking its output: {fault}"
    except Exception as exc:  # noqa: BLE001  (recorded as a failed candidate)
        return "wrong answer", f"wrong answer: cannot run the candidate for checking: {exc}"
    diff = compare_outputs(task.reference, out, rtol=check.rtol, atol=check.atol)
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
            tvm.compile(sch.mod, target=target, tir_pipeline=TIR_PIPELINE).export_library(path)
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
