"""``fastsearch.tune``: the one call that tunes a kernel, a module of kernels or a whole model.

It resolves the arguments into a :class:`~fastsearch.tuning.options.TuningPlan`, runs a Relax
model through the inference pipeline, and hands the plan to the tuning loop
(:func:`fastsearch.tuning.loop.run`), or to the fusion search around it."""

from __future__ import annotations

import os
from pathlib import Path

import tvm
from tvm.ir import IRModule

from fastsearch.errors import UnsupportedWorkload
from fastsearch.graph.inference import optimize_for_inference, pipeline_steps
from fastsearch.graph.relax_tasks import is_relax_module
from fastsearch.ir.target import TargetLike, require_searchable, resolve_target
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
from fastsearch.tuning.result import TaskResult, TrialRecord, TuneResult
from fastsearch.tuning.scheduler import SCHEDULERS

__all__ = ["FusionSearch", "Sampler", "TaskResult", "TrialRecord", "TuneResult", "Verification", "tune"]


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
      names a block) or as imported (``"NCHW"``), and FuseOps' grouping or a
      measured search beyond it (``"search"`` or a :class:`~fastsearch.tuning.options.FusionSearch`).

    ``result.compile()`` builds the tuned module (a VM executable for a Relax model, whose
    ``main`` takes the original inputs). Raises :class:`fastsearch.InvalidTarget`,
    :class:`fastsearch.UnsupportedWorkload`, :class:`fastsearch.DatabaseError`,
    :class:`fastsearch.RemoteError`, or :class:`fastsearch.MeasurementError` when not a single
    candidate of a task could be measured. README.md describes each option at length.
    """
    if trials < 0:
        raise ValueError(f"trials must be >= 0, got {trials}")
    if not isinstance(mod, (tvm.tirx.PrimFunc, IRModule)):
        raise UnsupportedWorkload(
            f"tune() takes a tvm.tirx.PrimFunc or an IRModule of PrimFuncs, got {type(mod).__name__}"
        )
    resolved = resolve_target(target)
    require_searchable(resolved, "fastsearch.tune")
    search = check_fusion_argument(fusion, mod)
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown pipeline {pipeline!r}; available: {', '.join(PIPELINES)}")
    if task_scheduler not in SCHEDULERS:
        raise ValueError(f"unknown task_scheduler {task_scheduler!r}; available: {', '.join(SCHEDULERS)}")
    if pipeline != "none" and is_relax_module(mod):
        assert isinstance(mod, IRModule)
        mod = optimize_for_inference(mod, steps=pipeline_steps(pipeline), layout=layout, target=resolved)
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
    if search is not None:
        assert isinstance(mod, IRModule)
        return tune_searching_fusion(mod, plan, search, loop.run)
    return loop.run(mod, plan)
