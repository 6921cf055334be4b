"""``fastsearch.tune``: the one call that tunes a kernel, a module of kernels or a whole model.

It resolves the arguments into a :class:`~fastsearch.tuning.options.TuningPlan`, runs a Relax
model through the inference pipeline, and hands the plan to the tuning loop
(:func:`fastsearch.tuning.loop.run`), or to the fusion search around it."""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path

import tvm
from tvm.ir import IRModule
from tvm_ffi import structural_equal

from fastsearch.errors import UnsupportedWorkload
from fastsearch.graph.inference import optimize_for_inference, pipeline_steps
from fastsearch.graph.relax_tasks import extract_tasks, is_relax_module
from fastsearch.ir.target import TargetLike, require_measurable, resolve_target
from fastsearch.ir.threads import kernel_threads_env
from fastsearch.measure.measurer import MeasureConfig, RPCRunner
from fastsearch.search.warm_start import WarmStart, WarmStartLike
from fastsearch.tuning import loop
from fastsearch.tuning.fusion_search import check_fusion_argument, tune_searching_fusion
from fastsearch.tuning.options import (
    PIPELINES,
    FusionMode,
    FusionSearch,
    Pipeline,
    Sampler,
    Strategy,
    TaskSchedulerName,
    TuningPlan,
    Verification,
)
from fastsearch.tuning.result import LayoutChoice, TaskResult, TrialRecord, TuneResult
from fastsearch.tuning.scheduler import SCHEDULERS

__all__ = ["FusionSearch", "Sampler", "TaskResult", "TrialRecord", "TuneResult", "Verification", "tune"]

#: The layouts ``layout="search"`` tries, the default first (it is kept on a tie).
SEARCHED_LAYOUTS = ("NCHWc", "NCHW")
#: The share of the trials each searched layout gets before the choice.
LAYOUT_PROBE_SHARE = 0.2


def tune(
    mod: tvm.tirx.PrimFunc | IRModule,
    target: TargetLike = None,
    *,
    trials: int = 64,
    seed: int = 0,
    work_dir: str | os.PathLike[str] | None = None,
    name: str | None = None,
    strategy: Strategy | Sampler = "evolutionary",
    task_scheduler: TaskSchedulerName = "gradient",
    batch_size: int | None = None,
    warm_start: WarmStartLike | WarmStart | None = None,
    measure: MeasureConfig | None = None,
    runner: RPCRunner | None = None,
    verify: bool | Verification = True,
    pipeline: Pipeline = "inference",
    layout: str = "NCHWc",
    fusion: FusionMode | FusionSearch = "rules",
    progress: bool = True,
) -> TuneResult:
    """Tune a PrimFunc, each PrimFunc of an IRModule, or a whole Relax model; ``trials`` is the
    total number of candidates measured, and records already in ``work_dir`` (default
    ``./fastsearch_work/<name>``) count toward it and are never measured again.

    - ``strategy``: model-guided search (``"evolutionary"``, ``"annealing"``), ``"random"``
      sketches, or a :data:`~fastsearch.tuning.options.Sampler`.
    - ``task_scheduler``: which task of a model gets the next batch (``"gradient"``: floors for
      every task with real work, then Ansor's rule; ``"round-robin"``: an even split).
    - ``warm_start``: databases of earlier runs (or a :class:`fastsearch.WarmStart`) whose
      records rank this run's first proposals and seed it with refitted bests.
    - ``measure`` and ``runner``: how candidates are built and timed, here or on RPC devices.
      A candidate that fails is stored as failed and the run goes on.
    - ``verify``: a candidate that would become a task's best is checked against the untuned
      function's output (a :class:`~fastsearch.tuning.options.Verification` sets tolerances).
    - ``pipeline``, ``layout``, ``fusion``: what a Relax model becomes before its tasks are
      tuned: the inference pipeline (batch norm folded, epilogues fused, blocked 3x3
      convolutions on images of 14x14 and more as Winograd's F(4x4, 3x3); ``"inference-direct"``
      keeps every convolution direct, ``"none"`` skips it), convolutions in
      channel-blocked ``"NCHWc"`` (blocks of 16 channels on AVX-512, else 8; ``"NCHW{b}c"``
      names a block) or as imported (``"NCHW"``), or ``"search"``: each of the two tuned with
      a fifth of the trials, the faster kept for the rest (:class:`LayoutChoice`), and FuseOps' grouping or a
      measured search beyond it (``"search"`` or a :class:`~fastsearch.tuning.options.FusionSearch`).

    For a CPU target measured here, candidates run on the target's ``num-cores`` threads (for
    ``target=None``, every physical core): ``TVM_NUM_THREADS`` is set to it for the run and
    restored afterwards, unless it is set already (then it wins). ``result.compile()`` builds
    the tuned module (a VM executable for a Relax model, whose ``main`` takes the original
    inputs); :func:`fastsearch.set_kernel_threads` runs it on the same threads in this process. A CUDA target is tuned with fastsearch's GPU sketches where a
    local GPU or ``runner`` measures the candidates. Raises :class:`fastsearch.UnsupportedTarget`
    for a GPU target nothing can measure (the message names the ways to measure and
    ``--build-only``) and for other GPU kinds, :class:`fastsearch.InvalidTarget`,
    :class:`fastsearch.UnsupportedWorkload`, :class:`fastsearch.DatabaseError`,
    :class:`fastsearch.RemoteError`, or :class:`fastsearch.MeasurementError` when not a single
    candidate of a task could be measured. README.md describes each option at length.
    """
    _check_arguments(mod, trials, pipeline, task_scheduler)
    resolved = resolve_target(target)
    require_measurable(resolved, "fastsearch.tune", remote=runner is not None)
    search = check_fusion_argument(fusion, mod)
    variants = _pipeline_variants(mod, pipeline, layout, resolved)
    if variants:
        mod = variants[SEARCHED_LAYOUTS[0] if layout == "search" else layout]
    wname = name or loop.default_name(mod)
    warm = warm_start if isinstance(warm_start, WarmStart) or warm_start is None else WarmStart(warm_start)
    plan = TuningPlan(
        target=resolved,
        trials=trials,
        seed=seed,
        work_dir=Path(work_dir) if work_dir is not None else Path.cwd() / "fastsearch_work" / wname,
        name=wname,
        strategy=strategy,
        task_scheduler=task_scheduler,
        batch_size=batch_size,
        warm=warm,
        measure=measure,
        runner=runner,
        verification=(verify if isinstance(verify, Verification) else Verification()) if verify else None,
        progress=progress,
    )
    # Kernels are measured on the target's num-cores threads unless the user set TVM_NUM_THREADS,
    # and the cost model assumes the threads they run on, for the whole run (restored after it).
    with kernel_threads_env(resolved, remote=runner is not None):
        if len(variants) > 1 and not structural_equal(*variants.values()):
            return _tune_choosing_layout(variants, plan, search)
        if search is not None:
            assert isinstance(mod, IRModule)
            return tune_searching_fusion(mod, plan, search, loop.run)
        return loop.run(mod, plan)


def _check_arguments(mod: object, trials: int, pipeline: str, task_scheduler: str) -> None:
    """Refuses what no tuning run could use, before anything is written."""
    if trials < 0:
        raise ValueError(f"trials must be >= 0, got {trials}")
    if not isinstance(mod, (tvm.tirx.PrimFunc, IRModule)):
        raise UnsupportedWorkload(
            f"tune() takes a tvm.tirx.PrimFunc or an IRModule of PrimFuncs, got {type(mod).__name__}"
        )
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown pipeline {pipeline!r}; available: {', '.join(PIPELINES)}")
    if task_scheduler not in SCHEDULERS:
        raise ValueError(f"unknown task_scheduler {task_scheduler!r}; available: {', '.join(SCHEDULERS)}")


def _pipeline_variants(
    mod: tvm.tirx.PrimFunc | IRModule, pipeline: str, layout: str, target: tvm.target.Target
) -> dict[str, IRModule]:
    """A Relax model through the inference pipeline, once per layout to tune (both searched
    layouts under ``layout="search"``); empty for TIR or when the pipeline is ``"none"``."""
    if pipeline == "none" or not is_relax_module(mod):
        return {}
    assert isinstance(mod, IRModule)
    steps = pipeline_steps(pipeline)
    layouts = SEARCHED_LAYOUTS if layout == "search" else (layout,)
    return {each: optimize_for_inference(mod, steps=steps, layout=each, target=target) for each in layouts}


def _tune_choosing_layout(
    variants: dict[str, IRModule], plan: TuningPlan, search: FusionSearch | None
) -> TuneResult:
    """``layout="search"``: each layout's model tuned with :data:`LAYOUT_PROBE_SHARE` of the
    trials, or enough for a batch of each task (no final or model round), then the layout
    whose tuned tasks add up to less (the default, ``"NCHWc"``, when a probe left a task
    unmeasured) tuned with what is left, resuming from its probe in its own directory
    (``layout-<layout>`` under ``work_dir``, the result's ``work_dir``)."""
    start = time.perf_counter()
    # Enough for a first batch of every task (the scheduler's warm-up), so that each layout's
    # tuned tasks add up; at most half the trials each.
    tasks = max(sum(t.skip is None for t in extract_tasks(mod)[1]) for mod in variants.values())
    probe_trials = max(1, int(plan.trials * LAYOUT_PROBE_SHARE), tasks * (plan.batch_size or 1))
    probe_trials = min(probe_trials, max(1, plan.trials // len(variants)))
    probe_measure = replace(plan.measure or MeasureConfig(), final_candidates=0)
    # Each layout tunes in a directory of its own: the two models' tasks share names, and the
    # search keeps per-task state (genomes, cost model) under a task's name.
    plans = {
        layout: replace(
            plan,
            trials=probe_trials,
            measure=probe_measure,
            model_round=False,
            work_dir=plan.work_dir / f"layout-{layout}",
        )
        for layout in variants
    }
    probes = {layout: loop.run(mod, plans[layout]) for layout, mod in variants.items()}
    estimates = {layout: r.best_latency_us for layout, r in probes.items()}
    ranked = {layout: math.inf if us is None else us for layout, us in estimates.items()}
    chosen = min(variants, key=ranked.__getitem__)
    spent = sum(r.trials_measured for layout, r in probes.items() if layout != chosen)
    rest = replace(
        plan,
        trials=max(plan.trials - spent, probes[chosen].trials_measured),
        work_dir=plans[chosen].work_dir,
    )
    mod = variants[chosen]
    result = tune_searching_fusion(mod, rest, search, loop.run) if search is not None else loop.run(mod, rest)
    result.layout_choice = LayoutChoice(chosen=chosen, estimates_us=estimates, probe_trials=probe_trials)
    # The kept layout's probe records count as stored in the run that resumed from them.
    result.trials_measured += spent
    elapsed = time.perf_counter() - start
    result.timing["layout"] = elapsed - result.timing.get("total", 0.0)
    result.timing["total"] = elapsed
    return result
