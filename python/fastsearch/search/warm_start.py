"""Warm starts: what earlier tuning runs measured, put to work on a new task.

``fastsearch.tune(..., warm_start=DIR)`` reads the MetaSchedule JSONDatabase in ``DIR`` (one
written by fastsearch or by MetaSchedule's ``tune_tir``/``tune_relax``; several may be given) and
uses its records in these ways:

* **The search's model.** Records whose genome fastsearch kept (next to its database) train
  the sketch-feature XGBoost model that guides the Rust search from the first batch on, each
  row computed on its own workload's program and weighted ``exp(-2 x shape distance)``; the
  task's own records join them, weighing more, and the model's say against the analytical
  estimate grows from a half to all as they accumulate (:mod:`fastsearch.search.guided`).
* **Records without genomes** (MetaSchedule's), when no record has one, train an XGBoost model
  on pooled per-store features (:class:`fastsearch.costmodel.learned.StoreFeatureModel`; labels are
  relative throughput within each workload), which describe loops, accesses and buffers rather
  than one sketch's decisions; it re-ranks the search's proposals until the task has records
  of its own.
* **Seeds.** Candidates that fastsearch found on other shapes of the same operator (their
  genomes are kept next to its database) are refitted to the new shape
  (``fastsearch._core.Program.transfer_genomes``: same structure and annotations, tile factors moved to
  the nearest that divide the new extents) and measured first, the best of each source shape in
  turn; once measured, the good ones seed the evolutionary population. Records of the very
  same workload, from either tuner, are measured again as they are.
"""

from __future__ import annotations

import glob
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tvm
from tvm.s_tir import Trace
from tvm_ffi import structural_hash

from fastsearch import _core
from fastsearch.costmodel.learned import CostModel, StoreRanker, pooled_features
from fastsearch.database import (
    RECORD_FILE,
    WORKLOAD_FILE,
    TuningDatabase,
    candidate_key,
    is_failed,
    mean_run_secs,
)
from fastsearch.errors import DatabaseError, FastsearchError
from fastsearch.ir.machine import Machine
from fastsearch.ir.tir_import import program_json

__all__ = ["TaskWarmStart", "WarmStart"]

#: Records of the very same workload measured again at most, and the share of the first batch
#: that seeds may take.
SEEDS_PER_WORKLOAD = 4
SEED_SHARE = 0.25
#: Ranks within a source that one unit of shape distance (mean |log2| ratio of the argument
#: extents) is worth when ordering seeds.
SHAPE_DISTANCE_WEIGHT = 2.0
#: How fast a source's records lose weight in the search's model with its shape distance.
SOURCE_DISTANCE_DECAY = 2.0

WarmStartLike = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


@dataclass
class _Source:
    """One workload of the warm-start databases and its records."""

    func: tvm.tirx.PrimFunc
    shash: int
    program: _core.Program | None  # None: fastsearch's program model cannot import it
    records: list[tuple[str, float]]  # (candidate key, mean seconds; inf = failed), fastest first
    genomes: dict[str, str] = field(default_factory=dict)
    traces: dict[str, Trace] = field(default_factory=dict)  # the recorded trace of each key
    pooled: np.ndarray | None = None  # pooled per-store features of each record, rows as records

    @property
    def valid(self) -> list[tuple[str, float]]:
        return [(k, s) for k, s in self.records if math.isfinite(s)]


class WarmStart:
    """The records of one or more earlier runs' databases, ready to start new tasks warm.

    Raises :class:`fastsearch.DatabaseError` when a directory holds no database or a corrupt one.
    """

    def __init__(self, paths: WarmStartLike) -> None:
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.paths = [Path(p) for p in paths]
        by_hash: dict[int, _Source] = {}
        genomes: dict[str, str] = {}
        for path in self.paths:
            if not (path / WORKLOAD_FILE).is_file() or not (path / RECORD_FILE).is_file():
                raise DatabaseError(
                    f"warm start: {path} holds no tuning database ({WORKLOAD_FILE} and {RECORD_FILE})"
                )
            db = TuningDatabase(path)
            for rec in db.ms_database.get_all_tuning_records():
                func = rec.workload.mod["main"]
                h = int(structural_hash(rec.workload.mod))
                src = by_hash.get(h)
                if src is None:
                    src = by_hash[h] = _Source(func=func, shash=h, program=_program_or_none(func), records=[])
                secs = [float(s) for s in rec.run_secs] if rec.run_secs is not None else None
                lat = math.inf if is_failed(secs) else mean_run_secs(secs)
                key = candidate_key(rec.trace)
                src.records.append((key, lat))
                src.traces[key] = rec.trace
            # Genomes of the candidates fastsearch proposed there (any task's file).
            for gpath in sorted(glob.glob(str(path / "fastsearch_search.*.genomes.jsonl"))):
                for line in Path(gpath).read_text(encoding="utf-8").splitlines():
                    try:
                        entry = json.loads(line)
                        genomes[str(entry["key"])] = str(entry["genome"])
                    except (ValueError, KeyError, TypeError):
                        continue  # a torn line of a killed run
        self.sources = list(by_hash.values())
        for src in self.sources:
            lowest: dict[str, float] = {}  # a candidate stored twice (a final round's winner): its lowest
            for key, lat in src.records:
                lowest[key] = min(lat, lowest.get(key, math.inf))
            src.records = sorted(lowest.items(), key=lambda kv: kv[1])
            src.genomes = {k: genomes[k] for k, _ in src.records if k in genomes}
        self.num_records = sum(len(s.records) for s in self.sources)

    def __repr__(self) -> str:
        return (
            f"WarmStart({[str(p) for p in self.paths]}, workloads={len(self.sources)}, "
            f"records={self.num_records})"
        )

    def training_set(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(pooled features, latencies) of each source workload with a valid record. Features
        are extracted on first use: only a warm start without genomes trains on them."""
        out = []
        for src in self.sources:
            if src.program is None:
                continue
            if src.pooled is None:
                src.pooled = pooled_features(src.program, [k for k, _ in src.records])
            lat = np.array([s for _, s in src.records])
            keep = ~np.isnan(src.pooled[:, 0])
            if np.isfinite(lat[keep]).any():
                out.append((src.pooled[keep], lat[keep]))
        return out

    def for_task(self, func: tvm.tirx.PrimFunc, program: _core.Program) -> TaskWarmStart:
        """What the records offer one task: its seeds and a model trained on them."""
        own = int(structural_hash(tvm.IRModule({"main": func})))
        same: list[Trace] = []
        ranked: list[tuple[float, list[tuple[str, str]]]] = []
        for src in self.sources:
            if src.shash == own and not src.genomes:
                # The same workload tuned by another tool: its best traces are candidates as they are.
                same.extend(src.traces[k] for k, _ in src.valid[:SEEDS_PER_WORKLOAD])
                continue
            best = [(k, src.genomes[k]) for k, _ in src.valid if k in src.genomes]
            if not best:
                continue
            moved = program.transfer_genomes([g for _, g in best])
            ranked.append((shape_distance(src.func, func), [m for m in moved if m is not None]))
        # Best first, nearest shapes first: a seed's rank within its source plus the source's
        # distance in shape, so the best of a near shape precedes the second best of a far one.
        order = sorted(
            (rank + SHAPE_DISTANCE_WEIGHT * dist, i, rank)
            for i, (dist, r) in enumerate(ranked)
            for rank in range(len(r))
        )
        seeds: list[tuple[str, str]] = []
        seen: set[str] = set()
        for _, i, rank in order:
            key, genome = ranked[i][1][rank]
            if key not in seen:
                seen.add(key)
                seeds.append((key, genome))
        return TaskWarmStart(self, func, program, seeds, same)


class TaskWarmStart:
    """One task's share of a :class:`WarmStart`: seeds and the store-feature model.

    ``seeds`` are (key, genome) pairs refitted from other shapes, best first; ``same_workload``
    are traces recorded on this very workload by a tool whose genomes are unknown.
    """

    def __init__(
        self,
        warm: WarmStart,
        func: tvm.tirx.PrimFunc,
        program: _core.Program,
        seeds: list[tuple[str, str]],
        same: list[Trace],
    ) -> None:
        self.warm = warm
        self.func = func
        self.program = program
        self.seeds = seeds
        self.same_workload = same
        self.ranker = StoreRanker(program)  # the store-feature model and this task's features
        self._sketch: dict[Machine, tuple[np.ndarray, np.ndarray, np.ndarray] | None] = {}

    def sketch_training(self, machine: Machine) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(sketch feature rows, relative-throughput labels, row weights) of the source records
        whose genome is known, each row computed on its own workload's program; a source weighs
        ``exp(-SOURCE_DISTANCE_DECAY * shape distance)``, so near shapes dominate. None without
        any such record."""
        key = machine
        if key not in self._sketch:
            rows, labels, weights = [], [], []
            for src in self.warm.sources:
                known = [(k, s) for k, s in src.records if k in src.genomes]
                if src.program is None or not known or not any(math.isfinite(s) for _, s in known):
                    continue
                x = src.program.sketch_feature_rows(machine.core_target(), [src.genomes[k] for k, _ in known])
                rows.append(np.asarray(x).reshape(len(known), -1))
                labels.append(CostModel.labels(np.array([s for _, s in known])))
                decay = math.exp(-SOURCE_DISTANCE_DECAY * min(shape_distance(src.func, self.func), 50.0))
                weights.append(np.full(len(known), decay))
            self._sketch[key] = (
                (np.concatenate(rows), np.concatenate(labels), np.concatenate(weights)) if rows else None
            )
        return self._sketch[key]

    def features(self, keys: Sequence[str]) -> np.ndarray:
        """Pooled per-store features of this task's candidates (NaN rows where they fail)."""
        return self.ranker.features(keys)

    def train(self, measured: dict[str, float]) -> bool:
        """(Re)trains on the warm records plus this task's ``measured`` (key -> seconds, inf =
        failed); False when there is nothing to learn from."""
        return self.ranker.train(measured, self.warm.training_set())

    def predict(self, keys: Sequence[str]) -> np.ndarray:
        """Predicted relative throughput of candidates; -inf where features cannot be taken."""
        return self.ranker.predict(keys)


def shape_distance(a: tvm.tirx.PrimFunc, b: tvm.tirx.PrimFunc) -> float:
    """Mean ``|log2|`` ratio of the two functions' argument extents, dimension by dimension
    (0 for the same shapes); ``inf`` when their arguments differ in number or rank."""

    def shapes(f: tvm.tirx.PrimFunc) -> list[list[int]]:
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo

        return [[int(x) for x in getattr(a, "shape", [])] for a in ArgInfo.from_prim_func(f)]

    sa, sb = shapes(a), shapes(b)
    if len(sa) != len(sb) or any(len(x) != len(y) for x, y in zip(sa, sb)):
        return math.inf
    return mean_log2_ratio([x for xs in sa for x in xs], [y for ys in sb for y in ys])


def mean_log2_ratio(a: Sequence[int], b: Sequence[int]) -> float:
    """Mean ``|log2(x / y)|`` over paired extents (each at least 1); 0 when there are none."""
    ratios = [abs(math.log2(max(x, 1) / max(y, 1))) for x, y in zip(a, b, strict=True)]
    return sum(ratios) / len(ratios) if ratios else 0.0


def _program_or_none(func: tvm.tirx.PrimFunc) -> _core.Program | None:

    try:
        return _core.Program(program_json(func))
    except FastsearchError:
        return None
