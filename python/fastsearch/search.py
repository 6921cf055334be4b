"""Model-guided search strategies for :func:`fastsearch.tune`.

Each round, the Rust core proposes a batch of unmeasured candidates by evolutionary search or
simulated annealing over fastsearch's sketches (GIL released, all cores), scored by the hybrid
cost model: the analytical estimate at first, blended with XGBoost as measurements arrive. TVM
then replays the proposals with its postprocessors; the measured results retrain the model.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import tvm

from fastsearch import _core
from fastsearch.cost_model import CostModel
from fastsearch.sample import Candidate, Postprocessor, base_schedule, num_cores, replay, vector_bytes
from fastsearch.tir_import import program_json
from fastsearch.warm_start import SEED_SHARE, TaskWarmStart

#: Records needed before the learned model is used at all, and until it takes over fully.
MIN_RECORDS = 8
FULL_WEIGHT_RECORDS = 64
#: With a warm start from records without genomes (MetaSchedule's), proposals per candidate
#: wanted, for the per-store-feature model to choose from.
WARM_POOL = 8
#: Weight of a task's own records against a warm start's records of other shapes, and the
#: say of a model trained on the latter before the task has records of its own.
OWN_RECORD_WEIGHT = 3.0
WARM_MODEL_WEIGHT = 0.5

STRATEGIES = ("evolutionary", "annealing")

#: ``() -> [(key, mean latency in seconds or inf when failed)]`` of the task's measured records.
History = Callable[[], Iterable[tuple[str, float]]]


class ModelGuidedSampler:
    """A :data:`fastsearch.tune.Sampler` that searches with a cost model trained on ``history``."""

    def __init__(
        self,
        func: tvm.tirx.PrimFunc,
        target: tvm.target.Target,
        strategy: str,
        history: History,
        postprocessor: Postprocessor | None = None,
        population: int | None = None,
        generations: int | None = None,
        state: SearchState | None = None,
        warm: TaskWarmStart | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown search strategy {strategy!r}; available: {STRATEGIES}")
        self.strategy = strategy
        self.program = program_json(func)
        self.base = base_schedule(func)
        self.cores = num_cores(target)
        self.vector_bytes = vector_bytes(target)
        self.history = history
        self.postprocessor = postprocessor or Postprocessor(func, target)
        self.population = population
        self.generations = generations
        self.model = CostModel()
        self.state = state
        # Genomes of candidates proposed by earlier runs on this database: their records train
        # the model and seed the population from the first round of a resumed run.
        self.genomes: dict[str, str] = state.load_genomes() if state else {}
        self.saved_model = state.load_model() if state else None
        self.timing = {"model": 0.0, "search": 0.0}
        self.warm = warm
        self.rounds = 0

    def _measured(self) -> dict[str, float]:
        return {key: float(lat) for key, lat in self.history()}

    def _train(self, measured: dict[str, float]) -> tuple[str | None, float, list[str]]:
        """Retrains on the measured candidates we know the genome of (and a warm start's records
        of other shapes); returns (model, weight, seeds)."""
        known = [(k, lat) for k, lat in measured.items() if k in self.genomes]
        known.sort(key=lambda kv: kv[1])
        seeds = [self.genomes[k] for k, lat in known if np.isfinite(lat)]
        warm = self.warm.sketch_training(self.cores, self.vector_bytes) if self.warm is not None else None
        if warm is None and (len(known) < MIN_RECORDS or not seeds):
            if self.saved_model is not None:  # a model saved by an earlier run starts us warm
                model_json, trained_on = self.saved_model
                return model_json, min(1.0, trained_on / FULL_WEIGHT_RECORDS), seeds
            return None, 0.0, seeds
        t0 = time.perf_counter()
        rows = _core.sketch_feature_rows(
            self.program, self.cores, self.vector_bytes, [self.genomes[k] for k, _ in known]
        )
        labels = CostModel.labels(np.array([lat for _, lat in known]))
        weights = np.ones(len(known))
        weight = min(1.0, len(labels) / FULL_WEIGHT_RECORDS)
        if warm is not None:
            # Records of other shapes train alongside the task's own, which weigh more; the
            # analytical estimate keeps half the say until the task has records of its own.
            warm_rows, warm_labels, warm_weights = warm
            if known:
                rows = np.concatenate([warm_rows, np.asarray(rows).reshape(len(known), -1)])
            else:
                rows = warm_rows
            labels = np.concatenate([warm_labels, labels])
            weights = np.concatenate([warm_weights, np.full(len(known), OWN_RECORD_WEIGHT)])
            weight = WARM_MODEL_WEIGHT + (1.0 - WARM_MODEL_WEIGHT) * min(
                1.0, len(known) / FULL_WEIGHT_RECORDS
            )
        self.model.fit_labels(rows, labels, weights)
        self.timing["model"] += time.perf_counter() - t0
        model_json = self.model.to_json()
        if self.state is not None:
            self.state.save_model(model_json, len(labels))
        return model_json, weight, seeds

    def __call__(
        self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, n: int, seed: int, exclude: set
    ) -> list[Candidate | tvm.s_tir.Trace]:
        measured = self._measured()
        model_json, weight, seeds = self._train(measured)
        # Keys TVM refused, or otherwise excluded, count as measured: never proposed again.
        known = dict(measured)
        for key in exclude:
            known.setdefault(key, float("inf"))
        first: list[Candidate | tvm.s_tir.Trace] = []
        warm_weight = 0.0
        if self.warm is not None:
            # Refitted seeds are measured in the first batch, and join the population only
            # through their measurements: a refit can be far from what it was on its own shape
            # (C2D 7x7x512's best is 1.7x slower refitted to 14x14x256), and hundreds of
            # unmeasured ones would crowd the population with one structure.
            pending = [(k, g) for k, g in self.warm.seeds if k not in known]
            if self.rounds == 0:
                first = self._warm_seeds(pending, n)
            if self.warm.sketch_training(self.cores, self.vector_bytes) is None:
                # No genomes to train the search's own model on: the per-store model re-ranks.
                valid = sum(1 for lat in measured.values() if np.isfinite(lat))
                warm_weight = max(0.0, 1.0 - valid / FULL_WEIGHT_RECORDS)
        self.rounds += 1
        want = n - len(first)
        pool = want * WARM_POOL if warm_weight > 0 else want
        t0 = time.perf_counter()
        proposals = _core.propose(
            self.program,
            self.cores,
            self.vector_bytes,
            self.strategy,
            pool,
            seed,
            known,
            seeds,
            self.population,
            self.generations,
            model_json,
            weight,
        )
        self.timing["search"] += time.perf_counter() - t0
        if warm_weight > 0 and self.warm is not None and proposals:
            t0 = time.perf_counter()
            proposals = self._rerank(proposals, measured, warm_weight)
            self.timing["model"] += time.perf_counter() - t0
        seeded = {c.key for c in first if isinstance(c, Candidate)}
        proposals = [p for p in proposals if p[0] not in seeded]
        proposals = proposals[:want]
        if self.state is not None:
            self.state.add_genomes([(key, genome) for key, genome, _ in proposals])
        out = first
        for key, genome, _score in proposals:
            self.genomes[key] = genome
            sch = replay(self.base, key, self.postprocessor)
            if sch is not None:
                out.append(Candidate(key, sch))
        return out

    def _warm_seeds(self, pending: list[tuple[str, str]], n: int) -> list[Candidate | tvm.s_tir.Trace]:
        """The first batch's share of warm-start seeds: same-workload traces, then refitted ones."""
        assert self.warm is not None
        room = max(1, int(n * SEED_SHARE))
        out: list[Candidate | tvm.s_tir.Trace] = list(self.warm.same_workload[:room])
        for key, genome in pending:
            if len(out) >= room:
                break
            sch = replay(self.base, key, self.postprocessor)
            if sch is not None:
                self.genomes[key] = genome
                out.append(Candidate(key, sch))
        if self.state is not None:
            self.state.add_genomes([(c.key, self.genomes[c.key]) for c in out if isinstance(c, Candidate)])
        return out

    def _rerank(
        self, proposals: list[tuple[str, str, float]], measured: dict[str, float], warm_weight: float
    ) -> list[tuple[str, str, float]]:
        """Orders proposals by a blend of the search's rank and the warm model's, the warm one
        weighing ``warm_weight``."""
        assert self.warm is not None
        if not self.warm.train(measured):
            return proposals
        predicted = self.warm.predict([key for key, _, _ in proposals])
        by_model = np.empty(len(proposals))
        by_model[np.argsort(-predicted, kind="stable")] = np.arange(len(proposals))
        blended = warm_weight * by_model + (1.0 - warm_weight) * np.arange(len(proposals))
        return [proposals[i] for i in np.argsort(blended, kind="stable")]


class SearchState:
    """What a model-guided search keeps next to the database, so a later run starts warm.

    ``<prefix>.genomes.jsonl`` maps each proposed candidate's key (its trace JSON, the database's
    key) to its genome, one JSON line each, appended as proposals are made; a torn last line
    (a killed run) is skipped. ``<prefix>.model.json`` holds the last trained booster and how many
    records trained it, replaced atomically.
    """

    def __init__(self, directory: str | os.PathLike[str], task: str) -> None:
        self.directory = Path(directory)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in task)
        self.genomes_path = self.directory / f"fastsearch_search.{safe}.genomes.jsonl"
        self.model_path = self.directory / f"fastsearch_search.{safe}.model.json"

    def load_genomes(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if not self.genomes_path.exists():
            return out
        for line in self.genomes_path.read_text().splitlines():
            try:
                entry = json.loads(line)
                out[str(entry["key"])] = str(entry["genome"])
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a kill: its candidate is simply proposed again
        return out

    def add_genomes(self, pairs: list[tuple[str, str]]) -> None:
        if not pairs:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.genomes_path.open("a") as f:
            for key, genome in pairs:
                f.write(json.dumps({"key": key, "genome": genome}) + "\n")

    def load_model(self) -> tuple[str, int] | None:
        """(booster JSON, records it was trained on), or None if absent or unreadable."""
        try:
            saved = json.loads(self.model_path.read_text())
            return json.dumps(saved["booster"]), int(saved["trained_on"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save_model(self, booster_json: str, trained_on: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.model_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"trained_on": trained_on, "booster": json.loads(booster_json)}))
        os.replace(tmp, self.model_path)
