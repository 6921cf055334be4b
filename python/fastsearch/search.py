"""Model-guided search strategies for :func:`fastsearch.tune`.

Each round, the Rust core proposes a batch of unmeasured candidates by evolutionary search or
simulated annealing over fastsearch's sketches (GIL released, all cores), scored by the hybrid
cost model: the analytical estimate at first, blended with XGBoost as measurements arrive. TVM
then replays the proposals with its postprocessors; the measured results retrain the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

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
        self.genomes: dict[str, str] = {}
        self.timing = {"model": 0.0, "search": 0.0}

    def _measured(self) -> dict[str, float]:
        return {key: float(lat) for key, lat in self.history()}

    def _train(self, measured: dict[str, float]) -> tuple[str | None, float, list[str]]:
        """Retrains on the measured candidates we know the genome of; returns (model, weight, seeds)."""
        known = [(k, lat) for k, lat in measured.items() if k in self.genomes]
        known.sort(key=lambda kv: kv[1])
        seeds = [self.genomes[k] for k, lat in known if np.isfinite(lat)]
        if len(known) < MIN_RECORDS or not seeds:
            return None, 0.0, seeds
        t0 = time.perf_counter()
        rows = _core.sketch_feature_rows(
            self.program, self.cores, self.vector_bytes, [self.genomes[k] for k, _ in known]
        )
        self.model.fit(rows, np.array([lat for _, lat in known]))
        self.timing["model"] += time.perf_counter() - t0
        weight = min(1.0, len(known) / FULL_WEIGHT_RECORDS)
        return self.model.to_json(), weight, seeds

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
        out: list[Candidate] = []
        for key, genome, _score in proposals:
            self.genomes[key] = genome
            sch = replay(self.base, key, self.postprocessor)
            if sch is not None:
                out.append(Candidate(key, sch))
        return out
