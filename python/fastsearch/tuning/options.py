"""The options of a tuning run: the modes ``tune`` takes as ``Literal`` names, the objects that
group the knobs of one feature (:class:`FusionSearch`, :class:`Verification`), and
:class:`TuningPlan`, everything the tuning loop needs once ``tune`` has resolved its arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import tvm

from fastsearch.measure.measurer import MeasureConfig, RPCRunner
from fastsearch.search.warm_start import WarmStart

__all__ = [
    "PIPELINES",
    "STRATEGIES",
    "FusionMode",
    "FusionSearch",
    "Pipeline",
    "Sampler",
    "Strategy",
    "TaskSchedulerName",
    "TuningPlan",
    "Verification",
]

#: Built-in strategies: model-guided search (evolutionary or simulated annealing in Rust, cost
#: model retrained on every batch) and random sampling of fastsearch's sketches.
Strategy = Literal["evolutionary", "annealing", "random"]
#: Which task of a model gets the next batch: Ansor's gradient rule after floors, or a fixed
#: even split served in turn (:mod:`fastsearch.tuning.scheduler`).
TaskSchedulerName = Literal["gradient", "round-robin"]
#: What a Relax model goes through before it is partitioned (:mod:`fastsearch.graph.inference`):
#: all its steps, all but ``winograd`` (every convolution computed directly), or nothing.
Pipeline = Literal["inference", "inference-direct", "none"]
#: How a Relax model's fused functions are decided: FuseOps' rules, or the rules and a measured
#: search beyond them (:mod:`fastsearch.tuning.fusion_search`).
FusionMode = Literal["rules", "search"]

STRATEGIES: tuple[str, ...] = ("random", "evolutionary", "annealing")
PIPELINES: tuple[str, ...] = get_args(Pipeline)

#: A candidate generator ``(func, target, n, seed, exclude) -> list`` of at most ``n`` distinct
#: candidates whose key (:func:`fastsearch.database.candidate_key`) is not in ``exclude``. Items
#: are ``fastsearch.search.sample.Candidate`` objects (``key`` and a postprocessed ``schedule``)
#: or plain :class:`tvm.s_tir.Trace` objects, which the loop replays and postprocesses itself. A
#: sampler that also has ``update(func, measured)`` gets, after every batch, ``measured = [(key,
#: mean seconds or None for a failure)]``, and once at the start the records already stored (warm
#: start); the time it takes is reported as ``model``.
Sampler = Callable[[tvm.tirx.PrimFunc, tvm.target.Target, int, int, set], list]


@dataclass(frozen=True)
class FusionSearch:
    """``fusion="search"`` with its knobs (``fusion="search"`` is ``FusionSearch()``).

    The rules' grouping is tuned with ``1 - share`` of the trials; changes the rules never make
    (prologue, epilogue and horizontal fusion) get the rest, and each is kept only when the
    model, compiled and timed end to end in ``rounds`` interleaved rounds, is at least
    ``min_gain`` faster with it."""

    share: float = 0.25
    min_gain: float = 0.01
    rounds: int = 20

    def __post_init__(self) -> None:
        if not 0.0 <= self.share < 1.0:
            raise ValueError(f"FusionSearch.share must be in [0, 1), got {self.share}")
        if self.rounds < 1:
            raise ValueError(f"FusionSearch.rounds must be at least 1, got {self.rounds}")


@dataclass(frozen=True)
class Verification:
    """How a candidate that would become a task's best is checked against the untuned function's
    output on random inputs (``verify=True`` is ``Verification()``): equal within ``rtol`` and
    ``atol`` scaled by the reference's largest magnitude."""

    rtol: float = 1e-3
    atol: float = 1e-4


@dataclass(frozen=True)
class TuningPlan:
    """A run's arguments, resolved: what :func:`fastsearch.tuning.loop.run` takes.

    ``groups`` (node indices of the partitioner's graph) replaces FuseOps' grouping of a Relax
    model, and ``rerank=False`` turns off the late re-ranking of proposals by per-store
    features, and ``build_cost=False`` the ranking of proposals by their predicted build time
    (:data:`fastsearch.search.guided.BUILD_RANK_WEIGHT`); these are for the fusion search and
    fastsearch's own experiments. ``model_round`` (:mod:`fastsearch.tuning.model_round`): ``None``
    runs it when the run measured candidates (a resumed run with nothing left to measure keeps
    the stored choice), ``True`` always, ``False`` never."""

    target: tvm.target.Target
    trials: int
    seed: int
    work_dir: Path
    name: str
    strategy: str | Sampler = "evolutionary"
    task_scheduler: str = "gradient"
    batch_size: int | None = None
    warm: WarmStart | None = None
    measure: MeasureConfig | None = None
    runner: RPCRunner | None = None
    verification: Verification | None = Verification()
    progress: bool = True
    groups: list[list[int]] | None = None
    rerank: bool = True
    build_cost: bool = True
    model_round: bool | None = None
