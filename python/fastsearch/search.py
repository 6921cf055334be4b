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

#: Records needed before the learned model is used at all, and until it takes over fully.
MIN_RECORDS = 8
FULL_WEIGHT_RECORDS = 64

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

    def _measured(self) -> dict[str, float]:
        return {key: float(lat) for key, lat in self.history()}

    def _train(self, measured: dict[str, float]) -> tuple[str | None, float, list[str]]:
        """Retrains on the measured candidates we know the genome of; returns (model, weight, seeds)."""
        known = [(k, lat) for k, lat in measured.items() if k in self.genomes]
        known.sort(key=lambda kv: kv[1])
        seeds = [self.genomes[k] for k, lat in known if np.isfinite(lat)]
        if len(known) < MIN_RECORDS or not seeds:
            if self.saved_model is not None:  # a model saved by an earlier run starts us warm
                model_json, trained_on = self.saved_model
                return model_json, min(1.0, trained_on / FULL_WEIGHT_RECORDS), seeds
            return None, 0.0, seeds
        t0 = time.perf_counter()
        rows = _core.sketch_feature_rows(
            self.program, self.cores, self.vector_bytes, [self.genomes[k] for k, _ in known]
        )
        self.model.fit(rows, np.array([lat for _, lat in known]))
        self.timing["model"] += time.perf_counter() - t0
        weight = min(1.0, len(known) / FULL_WEIGHT_RECORDS)
        model_json = self.model.to_json()
        if self.state is not None:
            self.state.save_model(model_json, len(known))
        return model_json, weight, seeds

    def __call__(
        self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, n: int, seed: int, exclude: set
    ) -> list[Candidate]:
        measured = self._measured()
        model_json, weight, seeds = self._train(measured)
        # Keys TVM refused, or otherwise excluded, count as measured: never proposed again.
        known = dict(measured)
        for key in exclude:
            known.setdefault(key, float("inf"))
        t0 = time.perf_counter()
        proposals = _core.propose(
            self.program,
            self.cores,
            self.vector_bytes,
            self.strategy,
            n,
            seed,
            known,
            seeds,
            self.population,
            self.generations,
            model_json,
            weight,
        )
        self.timing["search"] += time.perf_counter() - t0
        if self.state is not None:
            self.state.add_genomes([(key, genome) for key, genome, _ in proposals])
        out: list[Candidate] = []
        for key, genome, _score in proposals:
            self.genomes[key] = genome
            sch = replay(self.base, key, self.postprocessor)
            if sch is not None:
                out.append(Candidate(key, sch))
        return out


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
