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

import json
import math
import os
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

from fastsearch.database import TuningDatabase, candidate_key, mean_run_secs
from fastsearch.errors import FastsearchError, MeasurementError, UnsupportedWorkload
from fastsearch.measure import (
    MeasureConfig,
    Measurer,
    MeasureResult,
    compare_outputs,
    random_arguments,
    run_function,
)
from fastsearch.progress import ProgressBar
from fastsearch.target import TargetLike, device, resolve_target, target_kind

__all__ = ["Sampler", "TaskResult", "TrialRecord", "TuneResult", "tune"]

#: A candidate generator: ``(func, target, n, seed, exclude) -> list[Trace]`` of at most ``n``
#: distinct candidates whose :func:`fastsearch.database.candidate_key` is not in ``exclude``.
Sampler = Callable[[tvm.tirx.PrimFunc, tvm.target.Target, int, int, set], list]

APPLY_FAILURES_FILE = "fastsearch_apply_failures.jsonl"


@dataclass
class TrialRecord:
    """One measured candidate, in measurement order (for tuning curves)."""

    trial: int
    task: str
    latency_us: float | None
    min_us: float | None
    median_us: float | None
    error: str | None
    elapsed_s: float
    best_us: float | None

    @property
    def ok(self) -> bool:
        """Whether the candidate built, ran and (when checked) computed the right answer."""
        return self.error is None


@dataclass
class TaskResult:
    """Outcome of one PrimFunc of the tuned module."""

    name: str
    mod: IRModule
    trials: int
    trials_measured: int = 0
    trials_stored: int = 0
    failed: int = 0
    best_latency_us: float | None = None
    best_trace: Trace | None = None
    exhausted: bool = False


@dataclass
class TuneResult:
    """What a tuning run found, where it is stored, and where the time went.

    ``best_latency_us`` is the mean run time of the best valid record (how MetaSchedule ranks
    records); for a module of several PrimFuncs it is the sum over them. ``timing`` holds seconds
    spent in ``search`` (candidate sampling), ``apply`` (trace replay and postprocessing in TVM),
    ``build``, ``run``, ``verify``, ``database``, ``model`` and ``total``.
    """

    best_latency_us: float | None
    best_trace: Trace | None
    database: TuningDatabase
    work_dir: Path
    timing: dict[str, float]
    trials_measured: int
    failed: int
    history: list[TrialRecord]
    tasks: dict[str, TaskResult]
    target: tvm.target.Target
    mod: IRModule = field(repr=False)

    @property
    def best_traces(self) -> dict[str, Trace]:
        """Best trace of every task that has a valid record."""
        return {name: t.best_trace for name, t in self.tasks.items() if t.best_trace is not None}

    def best_module(self) -> IRModule:
        """The tuned IRModule: each PrimFunc replaced by its best schedule from the database."""
        funcs = {}
        for gv, func in self.mod.functions_items():
            name = gv.name_hint
            task = self.tasks.get(name)
            if task is not None:
                sch = ms.tir_integration.compile_tir(self.database.ms_database, task.mod, self.target)
                if sch is not None:
                    func = sch.mod["main"]
                    if self.mod[gv].attrs is not None and "global_symbol" in self.mod[gv].attrs:
                        func = func.with_attr("global_symbol", self.mod[gv].attrs["global_symbol"])
            funcs[name] = func
        return IRModule(funcs, attrs=self.mod.attrs)

    def compile(self) -> tvm.runtime.Module:
        """Build the tuned module for the target; call its functions by their names."""
        return tvm.compile(self.best_module(), target=self.target)


@dataclass
class _Task:
    name: str
    mod: IRModule
    func: tvm.tirx.PrimFunc
    entry: str
    workload: Any
    args_info: list
    postprocs: list
    result: TaskResult
    best_secs: float = math.inf
    reference: list[np.ndarray] | None = None
    inputs: list[np.ndarray] | None = None


def _resolve_sampler(strategy: str | Sampler) -> Sampler:
    if callable(strategy):
        return strategy
    if strategy == "random":
        try:
            from fastsearch.sample import sample_candidates
        except ImportError as exc:
            raise FastsearchError(
                f"strategy 'random' needs fastsearch.sample.sample_candidates, which is unavailable: {exc}"
            ) from exc
        return sample_candidates
    raise ValueError(f"unknown strategy {strategy!r}; available: 'random' or a sampler callable")


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


def _postprocs(mod: IRModule, target: tvm.target.Target) -> list:
    """MetaSchedule's default postprocessors for the target, initialized for this workload.

    Built through the FFI constructor of TuneContext: the Python constructor imports every tensor
    intrinsic (tens of seconds), which replaying fastsearch's traces does not need.
    """
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.logging import get_logger, get_logging_func

    kind = target_kind(target)
    kind = kind if kind in ("cuda", "hexagon") else "llvm"
    space = ms.space_generator.PostOrderApply(
        sch_rules=[], postprocs=ms.postproc.Postproc.create(kind), mutator_probs={}
    )
    ctx = ms.TuneContext.__new__(ms.TuneContext)
    ctx.__init_handle_by_constructor__(
        _ffi_api.TuneContext,
        mod,
        target,
        space,
        None,
        "main",
        1,
        0,
        get_logging_func(get_logger(__name__)),
    )
    _ffi_api.TuneContextInitialize(ctx)
    return list(ctx.space_generator.postprocs)


def _needs_tensor_intrin(trace: Trace) -> bool:
    return any(str(inst.kind.name) in ("Tensorize", "Blockize") for inst in trace.insts)


def _apply(task: _Task, trace: Trace) -> tuple[Schedule | None, str | None]:
    """Replay ``trace`` on the workload and run the postprocessors, as MetaSchedule does."""
    if _needs_tensor_intrin(trace):
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics tensorize refers to)
    try:
        sch = Schedule(task.mod, debug_mask="none", error_render_level="detail")
        trace.apply_to_schedule(sch, remove_postproc=True)
        sch.enter_postproc()
        for post in task.postprocs:
            if not post.apply(sch):
                return sch, f"postprocessor {type(post).__name__} rejected the candidate"
    except Exception as exc:  # noqa: BLE001  (a broken candidate is recorded, the search goes on)
        return None, f"cannot apply the trace: {exc}"
    return sch, None


def _seed_for(seed: int, task_index: int, round_index: int) -> int:
    return (seed * 1_000_003 + task_index * 7_919 + round_index * 104_729) & 0x7FFFFFFF


class _ApplyFailures:
    """Candidates whose trace cannot be replayed: MetaSchedule's database could not load them, so
    they are kept in a side file of the work directory (key and error) to be skipped on resume."""

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
    strategy: str | Sampler = "random",
    batch_size: int | None = None,
    measure: MeasureConfig | None = None,
    verify: bool = True,
    rtol: float = 1e-3,
    atol: float = 1e-4,
    progress: bool = True,
    name: str | None = None,
) -> TuneResult:
    """Tune a PrimFunc, or each PrimFunc of an IRModule (``trials`` split evenly between them).

    ``trials`` is the total number of candidates per run directory: records already stored in
    ``work_dir`` (default ``./fastsearch_work/<name>``) count toward it, and no stored candidate
    is measured again. ``strategy`` is ``"random"`` (fastsearch's sketches with random annotation)
    or a :data:`Sampler`. Candidates that would become the best are checked against the untuned
    function's output on random inputs (``verify``); a wrong answer is recorded as failed.

    Raises :class:`fastsearch.InvalidTarget`, :class:`fastsearch.UnsupportedWorkload`,
    :class:`fastsearch.DatabaseError`, or :class:`fastsearch.MeasurementError` when not a single
    candidate of a task could be measured.
    """
    t_start = time.perf_counter()
    if trials < 0:
        raise ValueError(f"trials must be >= 0, got {trials}")
    tgt = resolve_target(target)
    sampler = _resolve_sampler(strategy)
    whole, funcs = _primfuncs(mod)
    wname = name or default_name(mod)
    wdir = Path(work_dir) if work_dir is not None else Path.cwd() / "fastsearch_work" / wname
    timing = {k: 0.0 for k in ("search", "apply", "build", "run", "verify", "database", "model")}

    t0 = time.perf_counter()
    db = TuningDatabase(wdir)
    apply_failures = _ApplyFailures(wdir / APPLY_FAILURES_FILE)
    tasks: list[_Task] = []
    per_task = [trials // len(funcs) + (1 if i < trials % len(funcs) else 0) for i in range(len(funcs))]
    for (fname, func), budget in zip(funcs, per_task):
        tmod = _normalize_mod(func)
        workload = db.commit_workload(tmod)
        attrs = tmod["main"].attrs
        entry = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "main"
        result = TaskResult(name=fname, mod=tmod, trials=budget)
        task = _Task(
            name=fname,
            mod=tmod,
            func=tmod["main"],
            entry=entry,
            workload=workload,
            args_info=list(ms.arg_info.ArgInfo.from_prim_func(tmod["main"])),
            postprocs=_postprocs(tmod, tgt),
            result=result,
        )
        best = db.best(workload)
        if best is not None:
            task.best_secs = mean_run_secs([float(s) for s in best.run_secs])
        tasks.append(task)
    timing["database"] += time.perf_counter() - t0

    history: list[TrialRecord] = []
    stored = {
        t.name: len(db.records(t.workload)) + len(apply_failures.keys.get(_wl_id(t), ())) for t in tasks
    }
    for t in tasks:
        t.result.trials_stored = stored[t.name]
    total_todo = sum(max(0, t.result.trials - stored[t.name]) for t in tasks)
    n_failed = 0

    def overall_best_us() -> float | None:
        if any(not math.isfinite(t.best_secs) for t in tasks):
            return (
                None
                if all(not math.isfinite(t.best_secs) for t in tasks)
                else sum(t.best_secs for t in tasks if math.isfinite(t.best_secs)) * 1e6
            )
        return sum(t.best_secs for t in tasks) * 1e6

    label = f"{wname}"
    measurer: Measurer | None = None
    bar = ProgressBar(total_todo, enabled=progress, label=label)
    try:
        with bar:
            bar.update(0, best_us=overall_best_us())
            for ti, task in enumerate(tasks):
                todo = task.result.trials - stored[task.name]
                if todo <= 0:
                    continue
                if measurer is None:
                    measurer = Measurer(tgt, measure)
                bsize = batch_size or min(16, max(4, math.ceil(task.result.trials / 4)))
                round_index = 0
                empty_rounds = 0
                wl_id = _wl_id(task)
                while task.result.trials_measured < todo:
                    n = min(bsize, todo - task.result.trials_measured)
                    exclude = set(db.measured_keys(task.workload)) | apply_failures.keys.get(wl_id, set())
                    t0 = time.perf_counter()
                    traces = sampler(task.func, tgt, n, _seed_for(seed, ti, round_index), exclude)
                    timing["search"] += time.perf_counter() - t0
                    round_index += 1
                    batch: list[tuple[Trace, str]] = []
                    for trace in traces:
                        key = candidate_key(trace)
                        if key not in exclude:
                            exclude.add(key)
                            batch.append((trace, key))
                    batch = batch[:n]
                    if not batch:
                        empty_rounds += 1
                        if empty_rounds >= 3:
                            task.result.exhausted = True  # the search space has nothing new
                            break
                        continue
                    empty_rounds = 0
                    n_failed += _run_batch(
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
                    )
                    bar.update(advance=len(batch), best_us=overall_best_us(), failed=n_failed)
                measured_ok = db.best(task.workload) is not None
                if not measured_ok:
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
    timing["database"] += time.perf_counter() - t0
    timing["total"] = time.perf_counter() - t_start

    lat = [t.result.best_latency_us for t in tasks]
    best_latency = sum(x for x in lat if x is not None) if all(x is not None for x in lat) else None
    return TuneResult(
        best_latency_us=best_latency,
        best_trace=tasks[0].result.best_trace if len(tasks) == 1 else None,
        database=db,
        work_dir=wdir,
        timing=timing,
        trials_measured=sum(t.result.trials_measured for t in tasks),
        failed=n_failed,
        history=history,
        tasks={t.name: t.result for t in tasks},
        target=tgt,
        mod=whole,
    )


def _wl_id(task: _Task) -> str:
    return f"{structural_hash(task.mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def _run_batch(
    task: _Task,
    batch: Sequence[tuple[Trace, str]],
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
) -> int:
    """Apply, build, run, check and store one batch; returns the number of failed candidates."""
    t0 = time.perf_counter()
    applied: list[tuple[Trace, str, Schedule | None, str | None]] = []
    for trace, key in batch:
        sch, error = _apply(task, trace)
        applied.append((trace, key, sch, error))
    timing["apply"] += time.perf_counter() - t0

    runnable = [i for i, (_, _, sch, err) in enumerate(applied) if err is None and sch is not None]
    results: list[MeasureResult] = [MeasureResult(error=applied[i][3]) for i in range(len(applied))]
    measured = measurer.measure([applied[i][2].mod for i in runnable], task.args_info)  # type: ignore[union-attr]
    for i, res in zip(runnable, measured):
        results[i] = res

    try:
        # Check, fastest first, each candidate that would become the task's best.
        order = sorted((i for i in runnable if results[i].ok), key=lambda i: results[i].mean_us or math.inf)
        for i in order:
            secs = mean_run_secs(results[i].run_secs)
            if secs >= task.best_secs:
                break
            if verify:
                t0 = time.perf_counter()
                error = _check_candidate(task, applied[i][2], results[i], target, rtol, atol)  # type: ignore[arg-type]
                timing["verify"] += time.perf_counter() - t0
                if error is not None:
                    results[i].error = f"wrong answer: {error}"
                    results[i].run_secs = None
                    continue
            task.best_secs = secs
            break
    finally:
        Measurer.release(results)

    t0 = time.perf_counter()
    failed = 0
    wl_id = _wl_id(task)
    for (trace, key, sch, error), res in zip(applied, results):
        if sch is None:
            apply_failures.add(wl_id, key, res.error or "cannot apply the trace")
        else:
            db.commit(task.workload, sch.trace, res.run_secs if res.ok else None, target, task.args_info)
            db.measured_keys(task.workload).add(key)
        failed += 0 if res.ok else 1
        task.result.trials_measured += 1
        task.result.failed += 0 if res.ok else 1
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
            )
        )
    timing["database"] += time.perf_counter() - t0
    return failed


def _check_candidate(
    task: _Task, sch: Schedule, res: MeasureResult, target: tvm.target.Target, rtol: float, atol: float
) -> str | None:
    """Compare the candidate's outputs with the untuned function's on random inputs.

    Runs the measured artifact itself when the schedule keeps the argument layouts; a schedule
    that rewrites weight layouts is measured without the rewrite, so it is rebuilt whole here.
    """
    try:
        if task.reference is None:
            task.inputs = random_arguments(task.args_info, seed=0)
            host = tvm.target.Target("llvm")
            ref_mod = tvm.compile(task.mod, target=host)
            task.reference = run_function(ref_mod, task.inputs, tvm.cpu(0), task.entry)
    except Exception as exc:
        raise MeasurementError(f"task {task.name!r}: cannot compute the reference output: {exc}") from exc
    assert task.inputs is not None
    try:
        attrs = sch.mod["main"].attrs
        rewrites_layout = attrs is not None and "layout_free_buffers" in attrs
        if res.artifact_path and not rewrites_layout:
            rt_mod = tvm.runtime.load_module(res.artifact_path)
        else:
            rt_mod = tvm.compile(sch.mod, target=target)
        out = run_function(rt_mod, task.inputs, device(target), task.entry)
    except Exception as exc:  # noqa: BLE001  (recorded as a failed candidate)
        return f"cannot run the candidate for checking: {exc}"
    return compare_outputs(task.reference, out, rtol=rtol, atol=atol)
