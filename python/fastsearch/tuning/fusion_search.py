"""Fusion beyond FuseOps' rules: ``fastsearch.tune(model, fusion="search")``.

The rule-based grouping is tuned first, with most of the trials. fastsearch's partitioner then
proposes changes the rules never make (``fastsearch_core::partition::proposals``):

* ``prologue``: a copy kernel (a transpose, a reshape that moves data) joins the reduction
  that reads it, which then reads through the index map;
* ``epilogue``: such a kernel joins the reduction it alone reads from, which then writes the
  transformed layout directly;
* ``horizontal``: two reductions reading the same tensor (a ResNet downsampling block's 3x3
  convolution and its 1x1 projection) become one function with two outputs.

Each change makes new fused functions. A change can save at most the time of the kernels it
removes (as the rule-based run measured them); one that cannot save ``min_gain`` of the model
gets no trials. The others, slowest removed kernels first, each get as many trials as the
functions they replace got (at least 16), from the reserved share, to tune their new functions
into the same database; what is left of the share goes back to the rule grouping. The model is then compiled with and without each change and
timed end to end in interleaved rounds; a change is kept only when the model with it is faster
in the median round by at least ``min_gain`` and in three rounds of four. Kept changes that do
not touch the same groups are combined, and the combination is kept only if it beats the best
single change. ``TuneResult.fusion`` reports every change, its trials and its measured ratio.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.ir import IRModule
from tvm_ffi import structural_equal

from fastsearch import _core
from fastsearch.database import TuningDatabase
from fastsearch.errors import FastsearchError, UnsupportedWorkload
from fastsearch.graph.model_timing import model_inputs, paired_ratios, time_interleaved
from fastsearch.graph.partition import (
    DEFAULT_MAX_FUSE_DEPTH,
    OpGraph,
    extract_graph,
    partition_groups,
    prepare,
)
from fastsearch.graph.relax_tasks import ModelTask, apply_database, extract_tasks, is_relax_module
from fastsearch.ir.vector_math import TIR_PIPELINE
from fastsearch.tuning.options import FusionSearch, TuningPlan
from fastsearch.tuning.result import FusionChange, FusionReport, TrialRecord, TuneResult

__all__ = ["check_fusion_argument", "tune_searching_fusion"]

#: Fewest trials a change's new functions get; fewer changes are tried when the budget is short.
MIN_TRIALS_PER_CHANGE = 16


def tune_searching_fusion(
    mod: IRModule,
    plan: TuningPlan,
    search: FusionSearch,
    run: Callable[[IRModule, TuningPlan], TuneResult],
) -> TuneResult:
    """``tune(mod, fusion="search", ...)``: see the module's documentation. ``run`` is the tuning
    loop (:func:`fastsearch.tuning.loop.run`, passed in so that this module does not import the
    loop that calls it); ``plan`` is the run's, each tuning here runs a variant of it."""
    trials, name, wdir, progress = plan.trials, plan.name, plan.work_dir, plan.progress
    min_gain, rounds = search.min_gain, search.rounds
    t_start = time.perf_counter()

    def tune(target_mod: IRModule, **changes: Any) -> TuneResult:
        # the model round runs once, on the final grouping
        return run(target_mod, replace(plan, **{"model_round": False, **changes}))

    graph = extract_graph(prepare(mod))
    graph_json = graph.to_json()
    rule_groups = partition_groups(graph, DEFAULT_MAX_FUSE_DEPTH)
    _, rule_tasks = extract_tasks(mod)
    changes, variants = _proposed_changes(mod, graph, graph_json, rule_groups, rule_tasks)

    reserve = int(trials * search.share) if variants else 0
    base = tune(mod, trials=trials - reserve)
    report = FusionReport(changes=changes, groups=rule_groups, rule_groups=rule_groups)
    report.trials_rules = base.trials_measured
    histories = [base]

    budgets, left = _change_budgets(changes, variants, rule_tasks, base, min_gain, reserve)
    if left:
        more = tune(mod, trials=trials - reserve + left)
        report.trials_rules += more.trials_measured
        histories.append(more)
    tried: list[int] = []
    for index, budget in budgets.items():
        change = changes[index]
        _, _, new = variants[index]
        if new:
            funcs = IRModule({t.name: t.func for t in new})
            try:
                result = tune(
                    funcs, trials=budget, name=f"{name} [{change.kind} {'+'.join(new[0].functions)}]"
                )
            except FastsearchError as exc:
                change.reason = f"not kept: tuning its new function failed ({str(exc).splitlines()[0]})"
                continue
            change.trials = result.trials_measured
            report.trials_changes += result.trials_measured
            histories.append(result)
        tried.append(index)

    final_groups = rule_groups
    if tried:
        final_groups = _choose(
            mod, graph_json, rule_groups, changes, variants, tried, wdir, base, rounds, min_gain, report
        )
        if progress:
            _print_changes(report)
    report.groups = final_groups
    final = tune(
        mod, trials=0, groups=final_groups, progress=False, model_round=plan.model_round is not False
    )
    _merge_runs(final, histories, t_start)
    final.fusion = report
    return final


_Variants = dict[int, tuple[list[list[int]], list[ModelTask], list[ModelTask]]]


def _proposed_changes(
    mod: IRModule,
    graph: OpGraph,
    graph_json: str,
    rule_groups: list[list[int]],
    rule_tasks: list[ModelTask],
) -> tuple[list[FusionChange], _Variants]:
    """The partitioner's changes to the rule grouping, each with its grouping, the model's tasks
    under it and the new ones among them (``variants``, by change index); a change made at
    several sites is one change. Changes that cannot be tried say why."""
    changes: list[FusionChange] = []
    variants: _Variants = {}
    for kind, groups in _core.fusion_proposals(graph_json, rule_groups, DEFAULT_MAX_FUSE_DEPTH):
        functions = [graph.callees(rule_groups[g]) for g in groups]
        change = FusionChange(kind=kind, groups=list(groups), functions=functions, sites=[list(groups)])
        if len({graph.block_of[rule_groups[g][0]] for g in groups}) > 1:
            change.reason = "not tried: the groups are in different dataflow blocks"
            changes.append(change)
            continue
        merged = _core.merge_fusion_groups(graph_json, rule_groups, change.sites)
        _, tasks = extract_tasks(mod, groups=merged)
        new = [t for t in tasks if not any(_same(t, r) for r in rule_tasks)]
        change.tasks = [t.name for t in new]
        skipped = [t for t in new if t.skip is not None]
        if skipped:
            change.reason = f"not tried: fastsearch cannot tune {skipped[0].name} ({skipped[0].skip})"
            changes.append(change)
            continue
        # The same change at another site (a repeated layer) makes the same new functions: one
        # change made at every such site, tuned once.
        twin = next(
            (
                i
                for i, (_, _, other) in variants.items()
                if changes[i].kind == kind
                and len(other) == len(new)
                and all(_same(a, b) for a, b in zip(other, new, strict=True))
                and set(changes[i].groups).isdisjoint(groups)
            ),
            None,
        )
        if twin is not None:
            first = changes[twin]
            first.sites.append(list(groups))
            first.groups = sorted(first.groups + list(groups))
            merged = _core.merge_fusion_groups(graph_json, rule_groups, first.sites)
            _, tasks = extract_tasks(mod, groups=merged)
            variants[twin] = (merged, tasks, variants[twin][2])
            continue
        changes.append(change)
        variants[len(changes) - 1] = (merged, tasks, new)

    return changes, variants


def _change_budgets(
    changes: list[FusionChange],
    variants: _Variants,
    rule_tasks: list[ModelTask],
    base: TuneResult,
    min_gain: float,
    reserve: int,
) -> tuple[dict[int, int], int]:
    """Trials for each change worth trying (by change index), and what is left of ``reserve``."""
    # Rank by what a change can save at most: the fastest kernel it removes, as the rule-based
    # run timed it. One that cannot save min_gain of the model can never be kept: no trials.
    wanted: dict[int, int] = {}
    for index, (_, tasks, _) in variants.items():
        changes[index].removed_us, wanted[index] = _removed(rule_tasks, tasks, base)
    bar_us = min_gain * (base.best_latency_us or 0.0)
    ranked = []
    for index in sorted(variants, key=lambda i: -(changes[i].removed_us or 0.0)):
        removed = changes[index].removed_us or 0.0
        if removed < bar_us:
            changes[index].reason = (
                f"not tried: the kernels it removes take {removed:.1f} us, less than the "
                f"{100 * min_gain:g}% of the model ({bar_us:.1f} us) a change must save"
            )
        else:
            ranked.append(index)
    # Each change gets as many trials as the functions it replaces got (at least
    # MIN_TRIALS_PER_CHANGE), slowest removed kernels first, while the reserve lasts; what is
    # left of it goes back to the rule grouping.
    budgets: dict[int, int] = {}
    left = reserve
    for index in ranked:
        budget = min(left, max(MIN_TRIALS_PER_CHANGE, wanted[index]))
        if budget < MIN_TRIALS_PER_CHANGE and budgets:
            changes[index].reason = (
                f"not tried: the {reserve} trials for changes went to the {len(budgets)} that remove "
                "the slowest kernels"
            )
            continue
        budgets[index] = budget
        left -= budget
    return budgets, left


def _same(task: ModelTask, other: ModelTask) -> bool:
    return bool(structural_equal(task.normalized, other.normalized))


def _removed(
    rule_tasks: list[ModelTask], tasks: list[ModelTask], base: TuneResult
) -> tuple[float | None, int]:
    """What the change removes: the time per inference of the fastest rule-based kernel that
    runs fewer times with it (at the places it is removed from), and the mean number of trials
    the rule-based run gave the tasks it removes."""
    removed = []
    trials = []
    for rule in rule_tasks:
        remaining = sum(t.weight for t in tasks if _same(t, rule))
        result = base.tasks.get(rule.name)
        if remaining < rule.weight and result is not None:
            trials.append(result.trials)
            if result.best_latency_us is not None:
                removed.append(result.best_latency_us * (rule.weight - remaining))
    return (min(removed) if removed else None), (round(sum(trials) / len(trials)) if trials else 0)


def _compile(mod: IRModule, groups: list[list[int]], db: TuningDatabase, target: tvm.target.Target) -> Any:
    fused, _ = extract_tasks(mod, groups=groups)
    return tvm.compile(
        apply_database(fused, db.ms_database, target), target=target, tir_pipeline=TIR_PIPELINE
    )


def _close(out: np.ndarray, ref: np.ndarray) -> bool:
    scale = float(np.max(np.abs(ref))) or 1.0
    return out.shape == ref.shape and bool(np.allclose(out, ref, rtol=1e-3, atol=1e-4 * scale))


def _verdict(ratios: list[float], min_gain: float) -> tuple[float, bool]:
    """The median of sorted paired ratios, and whether it wins: at least ``min_gain`` faster in
    the median round and faster in three rounds of four."""
    median = float(np.median(ratios))
    upper = ratios[min(len(ratios) - 1, math.ceil(0.75 * len(ratios)) - 1)]
    return median, median <= 1.0 - min_gain and upper < 1.0


def _choose(
    mod: IRModule,
    graph_json: str,
    rule_groups: list[list[int]],
    changes: list[FusionChange],
    variants: dict[int, tuple[list[list[int]], list[ModelTask], list[ModelTask]]],
    tried: list[int],
    wdir: Path,
    base: TuneResult,
    rounds: int,
    min_gain: float,
    report: FusionReport,
) -> list[list[int]]:
    """Times the model with each tried change against the rule-based grouping and returns the
    grouping to keep."""

    db = TuningDatabase(wdir)  # the records of every run so far
    target = base.target
    inputs = model_inputs(mod)
    exes = [_compile(mod, rule_groups, db, target)] + [
        _compile(mod, variants[i][0], db, target) for i in tried
    ]
    times, outputs = time_interleaved(exes, inputs, rounds)
    report.rounds = rounds
    report.base_ms = float(np.median(times[0])) * 1e3
    winners = []
    for k, index in enumerate(tried, start=1):
        change = changes[index]
        change.ratio, wins = _verdict(paired_ratios(times[k], times[0]), min_gain)
        if not _close(outputs[k], outputs[0]):
            change.reason = "not kept: the model's output differs from the rule-based grouping's"
        elif wins:
            winners.append(index)
        else:
            change.reason = f"not kept: end to end x{change.ratio:.3f} (needs at most x{1 - min_gain:.3f} in the median round and a win in 3 rounds of 4)"
    if not winners:
        report.final_ms = report.base_ms
        return rule_groups
    winners.sort(key=lambda i: changes[i].ratio or 1.0)
    chosen: list[int] = []
    used: set[int] = set()
    for index in winners:
        change = changes[index]
        if used.isdisjoint(change.groups):
            chosen.append(index)
            used.update(change.groups)
        else:
            change.reason = (
                f"not kept: x{change.ratio:.3f}, but it merges a group a faster change already takes"
            )
    best = chosen[0]
    final_groups = variants[best][0]
    if len(chosen) > 1:
        combined = _core.merge_fusion_groups(
            graph_json, rule_groups, [site for i in chosen for site in changes[i].sites]
        )
        exes = [exes[0], exes[1 + tried.index(best)], _compile(mod, combined, db, target)]
        times, outputs = time_interleaved(exes, inputs, rounds)
        single, _ = _verdict(paired_ratios(times[1], times[0]), 0.0)
        together, _ = _verdict(paired_ratios(times[2], times[0]), 0.0)
        report.base_ms = float(np.median(times[0])) * 1e3
        if together < single and _close(outputs[2], outputs[0]):
            final_groups = combined
            report.final_ms = float(np.median(times[2])) * 1e3
        else:
            report.final_ms = float(np.median(times[1])) * 1e3
            for index in chosen[1:]:
                changes[index].reason = (
                    f"not kept: x{changes[index].ratio:.3f} alone, but with the best change the model "
                    f"was x{together:.3f} against x{single:.3f} for the best alone"
                )
            chosen = [best]
    else:
        report.final_ms = report.base_ms * (changes[best].ratio or 1.0)
    for index in chosen:
        changes[index].kept = True
        changes[index].reason = f"kept: end to end x{changes[index].ratio:.3f}"
    return final_groups


def _merge_runs(final: TuneResult, runs: list[TuneResult], t_start: float) -> None:
    """The final result with the history, timing and failures of every run it took."""
    history: list[TrialRecord] = []
    offset = 0.0
    for run in runs:
        for rec in run.history:
            rec.trial = len(history) + 1
            rec.elapsed_s += offset
            history.append(rec)
        offset += run.timing.get("total", 0.0)
    final.history = history
    for key in ("search", "apply", "build", "run", "verify", "database", "model"):
        final.timing[key] = sum(r.timing.get(key, 0.0) for r in runs) + final.timing.get(key, 0.0)
    final.trials_measured = sum(r.trials_measured for r in runs)
    final.failed = sum(r.failed for r in runs)
    failures: dict[str, int] = {}
    for run in runs:
        for kind, count in run.failures.items():
            failures[kind] = failures.get(kind, 0) + count
    final.failures = failures
    final.timing["fusion"] = (
        time.perf_counter() - t_start - sum(final.timing[k] for k in final.timing if k != "total")
    )
    final.timing["total"] = time.perf_counter() - t_start


def _print_changes(report: FusionReport) -> None:
    import sys

    for c in report.changes:
        print(f"fusion {c.summary()}", file=sys.stderr)


def check_fusion_argument(fusion: str | FusionSearch, mod: object) -> FusionSearch | None:
    """The fusion search ``fusion`` asks for (``None`` for FuseOps' rules): ``fusion`` must be
    ``"rules"``, ``"search"`` or a :class:`FusionSearch`, and a search needs a Relax model."""
    if isinstance(fusion, FusionSearch):
        search = fusion
    elif fusion == "search":
        search = FusionSearch()
    elif fusion == "rules":
        return None
    else:
        raise ValueError(f"unknown fusion {fusion!r}; available: rules, search, or a FusionSearch")
    if not is_relax_module(mod):
        raise UnsupportedWorkload("fusion='search' needs a Relax model (an IRModule with a Relax `main`)")
    return search
