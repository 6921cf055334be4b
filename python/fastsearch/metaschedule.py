"""Drop-in classes for MetaSchedule: fastsearch's features, cost model and search inside TVM.

Each class is a MetaSchedule ``Py*`` object, accepted wherever MetaSchedule takes one::

    from fastsearch import metaschedule as fst

    ms.tune_tir(mod, target, work_dir, 64,
                cost_model=fst.CostModel(),        # or XGBModel(extractor=fst.FeatureExtractor())
                strategy=fst.SearchStrategy())

* :class:`FeatureExtractor`: MetaSchedule's ``PerStoreFeature`` (164 values per store, same row
  order), computed by fastsearch's Rust engine from each candidate's trace, in parallel.
* :class:`CostModel`: XGBoost regression of relative throughput on those features pooled per
  candidate (:class:`fastsearch.costmodel.learned.StoreFeatureModel`), retrained on every update.
* :class:`SearchStrategy`: an evolutionary search over MetaSchedule's own design spaces, whose
  candidates are all replayed by fastsearch's engine before they are proposed.

``fastsearch.tvm`` is the same module under its earlier name.
"""

from __future__ import annotations

import json
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import Schedule, Trace
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.cost_model import PyCostModel
from tvm.s_tir.meta_schedule.feature_extractor import PyFeatureExtractor
from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate, PySearchStrategy
from tvm_ffi import register_error, structural_hash

from fastsearch import _core, errors
from fastsearch.costmodel.features import N_FEATURES, extract_features_each
from fastsearch.costmodel.learned import StoreFeatureModel, pool_store_features
from fastsearch.errors import FastsearchError
from fastsearch.ir.loop_nest import trace_text, traces_text
from fastsearch.ir.target import cuda_limits, require_searchable, target_kind
from fastsearch.ir.tir_import import imported_program
from fastsearch.search.sample import fresh_copy

__all__ = [
    "CostModel",
    "FeatureExtractor",
    "SearchStats",
    "SearchStrategy",
    "store_features",
    "trace_text",
]

#: MetaSchedule's run time of a failed candidate.
_FAILED_SECS = 1e10


def _register_errors() -> None:
    """Lets fastsearch's errors keep their type through MetaSchedule's C++ layer: an error raised
    in one of our callbacks reaches the caller of ``tune_tir`` as itself, not a RuntimeError.
    Names are prefixed so they cannot replace TVM's own (it has a ``ScheduleError`` too)."""

    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, FastsearchError):
            register_error(f"fastsearch.{value.__name__}", value)


_register_errors()


def _task_gpu(context: ms.TuneContext, what: str) -> _core.GpuTarget | None:
    """The limits of a CUDA task's target (None for a CPU task); another GPU target, or a CUDA
    target without its limits, is refused with a typed error naming ``what``."""
    if context.target is None:
        return None
    if target_kind(context.target) == "cuda":
        return cuda_limits(context.target)
    require_searchable(context.target, what)
    return None


def store_features(
    context: ms.TuneContext, candidates: Sequence[MeasureCandidate], fallback: bool = True
) -> tuple[list[np.ndarray], int]:
    """``(n_stores, 164)`` features of each candidate (float32 from the engine, float64 from the
    fallback) and how many came from TVM's fallback.

    A candidate the engine cannot replay is extracted by MetaSchedule's ``PerStoreFeature``
    when ``fallback`` (same layout), else its engine error is raised. A CUDA task gets
    ``PerStoreFeature``'s GPU features; other GPU targets are refused
    (:class:`fastsearch.UnsupportedTarget`)."""
    gpu = _task_gpu(context, "fastsearch's per-store features")
    texts = traces_text([c.sch.trace for c in candidates])
    rows = extract_features_each(imported_program(context.mod), texts, gpu)
    bad = [i for i, r in enumerate(rows) if isinstance(r, FastsearchError)]
    if bad and not fallback:
        raise rows[bad[0]]  # type: ignore[misc]
    if bad:
        theirs = ms.feature_extractor.PerStoreFeature().extract_from(context, [candidates[i] for i in bad])
        for i, t in zip(bad, theirs):
            rows[i] = t.numpy()
    return rows, len(bad)  # type: ignore[return-value]


@derived_object
class FeatureExtractor(PyFeatureExtractor):
    """MetaSchedule's ``PerStoreFeature`` computed by fastsearch's engine.

    Drop it into MetaSchedule's cost model: ``ms.cost_model.XGBModel(extractor=FeatureExtractor())``.
    With ``fallback`` (the default), a candidate the engine cannot replay is handed to
    ``PerStoreFeature``, so tuning never stops on it; ``fallbacks`` counts them.
    """

    def __init__(self, fallback: bool = True) -> None:
        self.fallback = fallback
        self.fallbacks = 0

    def extract_from(self, context: ms.TuneContext, candidates: list[MeasureCandidate]) -> list[Any]:
        rows, fell_back = store_features(context, candidates, self.fallback)
        self.fallbacks += fell_back
        # float64, as PerStoreFeature's tensors are: same dtype as well as layout
        return [tvm.runtime.tensor(r.astype(np.float64)) for r in rows]


def _latency(result: ms.runner.RunnerResult) -> float:
    """Mean run time in seconds; inf for a failed candidate."""
    if result.error_msg is not None or not result.run_secs:
        return math.inf
    secs = [float(s) for s in result.run_secs]
    mean = sum(secs) / len(secs)
    return math.inf if mean >= _FAILED_SECS or mean <= 0 else mean


def _task_key(mod: tvm.IRModule) -> str:
    return f"{int(structural_hash(mod)) & 0xFFFFFFFFFFFFFFFF:016x}"


@dataclass
class _Records:
    """One task's measured candidates: pooled features and latencies (inf = failed)."""

    features: np.ndarray
    latencies: np.ndarray

    def add(self, features: np.ndarray, latencies: np.ndarray) -> None:
        self.features = np.concatenate([self.features, features])
        self.latencies = np.concatenate([self.latencies, latencies])


# Live CostModel instances: MetaSchedule hands the strategy only the TVM object, and the strategy
# that finds ours behind it scores with the pooled features it already has.
_cost_models: weakref.WeakSet[Any] = weakref.WeakSet()


def _our_cost_model(obj: Any) -> Any:
    """The :class:`CostModel` instance behind a TVM cost model object, or None."""
    for inst in list(_cost_models):
        outer = getattr(inst, "_outer", None)
        if outer is not None and outer() is not None and outer().same_as(obj):
            return inst
    return None


@derived_object
class CostModel(PyCostModel):
    """XGBoost on fastsearch's per-store features pooled per candidate (sum and max over stores).

    Labels are relative throughput within each task (best latency / latency, failed = 0); the
    model is retrained on all records of all tasks at every ``update``. ``save`` writes one JSON
    file with the booster and every record's pooled features and latency, so a run that
    ``load``\\ s it predicts the same and keeps training on the old records. Before any
    measurement, predictions are uniform random (seeded), as MetaSchedule's XGBModel's are.
    """

    def __init__(
        self, params: dict | None = None, rounds: int | None = None, seed: int = 0, fallback: bool = True
    ) -> None:
        _cost_models.add(self)
        self.model = StoreFeatureModel(params) if rounds is None else StoreFeatureModel(params, rounds)
        self.records: dict[str, _Records] = {}
        self.rng = np.random.default_rng(seed)
        self.fallback = fallback

    def pooled(self, context: ms.TuneContext, candidates: Sequence[MeasureCandidate]) -> np.ndarray:
        return pool_store_features(store_features(context, candidates, self.fallback)[0])

    def update(
        self,
        context: ms.TuneContext,
        candidates: list[MeasureCandidate],
        results: list[ms.runner.RunnerResult],
    ) -> None:
        if not candidates:
            return
        self.add_records(
            _task_key(context.mod), self.pooled(context, candidates), [_latency(r) for r in results]
        )

    def add_records(self, task: str, pooled: np.ndarray, latencies: Sequence[float]) -> None:
        """Adds measured candidates of ``task`` (any stable name) and retrains."""
        lat = np.asarray(latencies, dtype=np.float64)
        if task in self.records:
            self.records[task].add(pooled, lat)
        else:
            self.records[task] = _Records(np.asarray(pooled, dtype=np.float32), lat)
        self._retrain()

    def _retrain(self) -> None:
        # a task with no valid candidate labels everything 0: it still teaches what fails
        tasks = [(r.features, r.latencies) for r in self.records.values() if len(r.latencies)]
        if tasks:
            self.model.fit(tasks)

    def predict(self, context: ms.TuneContext, candidates: list[MeasureCandidate]) -> np.ndarray:
        if not candidates:
            return np.zeros(0, dtype=np.float64)
        return self.predict_pooled(self.pooled(context, candidates))

    def predict_pooled(self, pooled: np.ndarray) -> np.ndarray:
        """Predicted relative throughput of candidates given their pooled features."""
        if not self.model.trained:
            return self.rng.uniform(size=len(pooled))
        return self.model.predict(pooled)

    def save(self, path: str) -> None:
        doc = {
            "format": "fastsearch.metaschedule.CostModel/1",
            "params": self.model.params,
            "rounds": self.model.rounds,
            "booster": None if self.model.booster_json is None else json.loads(self.model.booster_json),
            "tasks": {
                task: {
                    "features": r.features.tolist(),
                    "latencies": [None if not math.isfinite(x) else float(x) for x in r.latencies],
                }
                for task, r in self.records.items()
            },
        }
        Path(path).write_text(json.dumps(doc))

    def load(self, path: str) -> None:
        doc = json.loads(Path(path).read_text())
        if doc.get("format") != "fastsearch.metaschedule.CostModel/1":
            raise ValueError(f"{path}: not a fastsearch.metaschedule.CostModel file")
        self.model = StoreFeatureModel(doc["params"], int(doc["rounds"]))
        self.model.booster_json = None if doc["booster"] is None else json.dumps(doc["booster"])
        self.records = {
            task: _Records(
                np.asarray(r["features"], dtype=np.float32).reshape(-1, 2 * N_FEATURES),
                np.array([math.inf if x is None else x for x in r["latencies"]], dtype=np.float64),
            )
            for task, r in doc["tasks"].items()
        }


@dataclass
class _Individual:
    """A candidate of the search: its trace before postprocessing (what mutation edits), the
    key it is deduplicated on, the postprocessed schedule TVM measures, and its features."""

    key: str
    trace: Trace
    schedule: Schedule
    pooled: np.ndarray | None = None
    score: float = 0.0


@dataclass
class SearchStats:
    """What :class:`SearchStrategy` did, per task name."""

    #: latencies (s) of each measured batch, in proposal order; inf for a failed candidate
    batches: dict[str, list[list[float]]] = field(default_factory=dict)
    #: candidates dropped because fastsearch's engine could not replay them
    unreplayable: dict[str, int] = field(default_factory=dict)
    #: results for candidates the strategy did not propose (their key matched none it did)
    unmatched: dict[str, int] = field(default_factory=dict)


#: Draws per population member before the strategy gives up filling it, on a GPU: of 303
#: re-samples of MetaSchedule's CUDA spaces over the 13 te_workload families, 67 passed
#: VerifyGPUCode (4 of 42 for a 16x16x16 matmul).
GPU_DRAWS = 30

#: Sampling instructions whose decision a mutation redraws.
MUTABLE = ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation")


def _prime_factors(n: int) -> list[int]:
    """Prime factors of ``n`` > 1, with multiplicity."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


@derived_object
class SearchStrategy(PySearchStrategy):
    """Evolutionary search over the design spaces MetaSchedule hands over, checked by fastsearch.

    Each round: a population of ``population_size`` from the best measured candidates
    (``init_measured_ratio`` of it) and the design spaces' traces replayed with new random
    decisions; ``generations`` rounds of mutation (one sampling decision redrawn, with
    probability ``mutate_prob`` per child; a tile decision instead has one prime factor moved
    between two of its levels with probability ``local_tile_prob``) and selection by the cost
    model; then the best unmeasured candidates are proposed, ``eps_greedy`` of them random
    ones instead.

    Every candidate is replayed by fastsearch's engine (its per-store features are computed
    there) before it is proposed; a design space the engine cannot replay is reported at
    ``pre_tuning`` as the engine's typed error (``UnsupportedWorkload``, ``ScheduleError``, ...).
    A candidate is never proposed twice, nor one already in the database: they are
    deduplicated on their trace JSON (simplified, postprocessing removed).

    The cost model is the one MetaSchedule passes (``tune_tir(cost_model=...)``); with none,
    an internal :class:`fastsearch.costmodel.learned.StoreFeatureModel` learns from the results.
    """

    def __init__(
        self,
        population_size: int = 128,
        generations: int = 3,
        mutate_prob: float = 0.85,
        init_measured_ratio: float = 0.2,
        eps_greedy: float = 0.05,
        local_tile_prob: float = 0.5,
        seed: int | None = None,
    ) -> None:
        self.config: dict[str, Any] = {
            "population_size": population_size,
            "generations": generations,
            "mutate_prob": mutate_prob,
            "init_measured_ratio": init_measured_ratio,
            "eps_greedy": eps_greedy,
            "local_tile_prob": local_tile_prob,
            "seed": seed,
        }
        self.population_size = population_size
        self.generations = generations
        self.mutate_prob = mutate_prob
        self.init_measured_ratio = init_measured_ratio
        self.eps_greedy = eps_greedy
        self.local_tile_prob = local_tile_prob
        self.seed = seed
        self.context: ms.TuneContext | None = None
        # MetaSchedule tunes clones of the object it is given: they share these statistics,
        # so the caller's object reports on every task
        self.stats = SearchStats()

    def _initialize_with_tune_context(self, context: ms.TuneContext) -> None:
        self.gpu = _task_gpu(context, "fastsearch.metaschedule.SearchStrategy")
        self.context = context
        self.task = str(context.task_name or "main")
        self.mod = context.mod
        self.program = imported_program(context.mod)
        self.postprocs = list(context.space_generator.postprocs) if context.space_generator else []
        seed = self.seed if self.seed is not None else int(context.rand_state)
        self.rng = np.random.default_rng(seed if seed >= 0 else None)
        self.base = Schedule(fresh_copy(context.mod))
        self.args_info = ms.arg_info.ArgInfo.from_entry_func(context.mod, remove_preproc=True)

    def pre_tuning(
        self,
        max_trials: int,
        num_trials_per_iter: int,
        design_spaces: list[Schedule],
        database: ms.database.Database | None = None,
        cost_model: ms.cost_model.CostModel | None = None,
    ) -> None:
        if self.context is None:
            raise ValueError("SearchStrategy.pre_tuning before it was initialized with a TuneContext")
        for i, space in enumerate(design_spaces):
            try:
                self.program.apply_trace(trace_text(space.trace))
            except FastsearchError as exc:
                raise type(exc)(
                    f"design space {i} of {len(design_spaces)} cannot be replayed by fastsearch's "
                    f"engine: {exc}"
                ) from exc
        self.spaces = [Trace(list(s.trace.insts), {}) for s in design_spaces]
        self.max_trials = max_trials
        self.per_iter = num_trials_per_iter
        self.cost_model = cost_model
        self.ours = None if cost_model is None else _our_cost_model(cost_model)
        self.internal = None if cost_model is not None else StoreFeatureModel()
        self.proposed = 0
        self.engine_error: FastsearchError | None = None
        self.pending: dict[str, _Individual] = {}
        # key -> (latency, trace before postprocessing): what seeds the population
        self.measured: dict[str, tuple[float, Trace]] = {}
        self.measured_pooled: dict[str, np.ndarray] = {}
        if database is not None and database.has_workload(self.mod):
            self._load_database(database)

    def _load_database(self, database: ms.database.Database) -> None:
        """Records of this task already in the database: never proposed again, and the best
        seed the population, so a resumed run continues where it stopped."""
        workload = database.commit_workload(self.mod)
        wanted = int(structural_hash(workload.mod))
        for record in database.get_all_tuning_records():
            if int(structural_hash(record.workload.mod)) != wanted:
                continue
            trace = record.trace.simplified(remove_postproc=True)
            secs = [float(s) for s in record.run_secs] if record.run_secs else []
            lat = sum(secs) / len(secs) if secs else math.inf
            self.measured[trace_text(trace)] = (lat if 0 < lat < _FAILED_SECS else math.inf, trace)

    def post_tuning(self) -> None:
        # drop the references that tie this object to the task (C++ holds us, we held it)
        self.context = None
        self.cost_model = None
        self.ours = None
        self.pending = {}

    def _materialize(self, trace: Trace) -> _Individual | None:
        """Replays ``trace`` (decisions it lacks are drawn anew) and postprocesses; None when
        TVM refuses the result."""
        sch = self.base.copy()
        sch.seed(int(self.rng.integers(1, 2**31 - 1)))
        try:
            trace.apply_to_schedule(sch, remove_postproc=True)
            pre = sch.trace.simplified(remove_postproc=True)
            # On a GPU most draws of MetaSchedule's spaces break a limit: the engine's
            # VerifyGPUCode turns them away before TVM lowers each one to check it.
            if self.gpu is not None and self.program.verify_gpu([trace_text(pre)], gpu=self.gpu)[0]:
                return None
            sch.enter_postproc()
            if not all(p.apply(sch) for p in self.postprocs):
                return None
        except Exception:  # noqa: BLE001  (TVM raises ValueError, RuntimeError, tvm.error.* here)
            return None
        return _Individual(trace_text(pre), pre, sch)

    def _sample(self) -> _Individual | None:
        return self._materialize(self.spaces[int(self.rng.integers(len(self.spaces)))])

    def _mutate(self, parent: _Individual) -> _Individual | None:
        """The parent with one of its tile, categorical or compute-location decisions redrawn."""
        decisions = dict(parent.trace.decisions.items())
        choices = [inst for inst in decisions if str(inst.kind.name) in MUTABLE]
        if not choices:
            return None
        chosen = choices[int(self.rng.integers(len(choices)))]
        kept = {inst: d for inst, d in decisions.items() if not inst.same_as(chosen)}
        if str(chosen.kind.name) == "SamplePerfectTile" and self.rng.random() < self.local_tile_prob:
            moved = self._move_tile_factor(chosen, [int(x) for x in decisions[chosen]])
            if moved is not None:
                kept[chosen] = moved
        return self._materialize(Trace(list(parent.trace.insts), kept))

    def _move_tile_factor(self, inst: Any, tile: list[int]) -> list[int] | None:
        """``tile`` with one prime factor moved from one level to another: a step to a
        neighbouring tiling, where a redrawn decision jumps anywhere in the space. None when
        the tile has no factor to move or the move breaks the innermost limit."""
        sources = [i for i, t in enumerate(tile) if t > 1]
        if not sources or len(tile) < 2:
            return None
        src = sources[int(self.rng.integers(len(sources)))]
        dst = int(self.rng.integers(len(tile) - 1))
        dst += dst >= src
        primes = _prime_factors(tile[src])
        p = primes[int(self.rng.integers(len(primes)))]
        moved = list(tile)
        moved[src] //= p
        moved[dst] *= p
        limit = int(inst.attrs[1]) if len(inst.attrs) > 1 else -1
        if limit > 0 and moved[-1] > limit:
            return None
        return moved

    def _score(self, individuals: list[_Individual]) -> list[_Individual]:
        """Replays each candidate in fastsearch's engine (its features), drops those it cannot
        replay, and scores the rest with the cost model."""
        todo = [i for i in individuals if i.pooled is None]
        if todo:
            rows = extract_features_each(
                self.program, traces_text([i.schedule.trace for i in todo]), self.gpu
            )
            errors = [r for r in rows if isinstance(r, FastsearchError)]
            self.stats.unreplayable[self.task] = self.stats.unreplayable.get(self.task, 0) + len(errors)
            if errors:
                self.engine_error = errors[0]
            kept = [(i, r) for i, r in zip(todo, rows) if not isinstance(r, FastsearchError)]
            pooled = pool_store_features([r for _, r in kept])
            for (ind, _), p in zip(kept, pooled):
                ind.pooled = p
            if kept:
                scores = self._predict([i for i, _ in kept], pooled)
                for (ind, _), s in zip(kept, scores):
                    ind.score = float(s)
        return [i for i in individuals if i.pooled is not None]

    def _predict(self, individuals: list[_Individual], pooled: np.ndarray) -> np.ndarray:
        if self.ours is not None:  # our CostModel: no second trip through TVM for the features
            return self.ours.predict_pooled(pooled)
        if self.cost_model is not None:
            cands = [MeasureCandidate(i.schedule, self.args_info) for i in individuals]
            return np.asarray(self.cost_model.predict(self.context, cands), dtype=np.float64)
        if self.internal is not None and self.internal.trained:
            return self.internal.predict(pooled)
        return self.rng.uniform(size=len(individuals))

    def _unique(self, pool: dict[str, _Individual], new: list[_Individual | None]) -> None:
        for ind in new:
            if ind is not None and ind.key not in pool:
                pool[ind.key] = ind

    def _evolve(self) -> tuple[list[_Individual], list[_Individual]]:
        """(population sorted best first, the random samples it started from)."""
        n_measured = int(self.population_size * self.init_measured_ratio)
        best = sorted((v for v in self.measured.values() if math.isfinite(v[0])), key=lambda v: v[0])
        pool: dict[str, _Individual] = {}
        self._unique(pool, [self._materialize(t) for _, t in best[:n_measured]])
        randoms: dict[str, _Individual] = {}
        # TVM refuses some draws (on a GPU, most): bounded retries.
        for _ in range((GPU_DRAWS if self.gpu is not None else 3) * self.population_size):
            if len(pool) + len(randoms) >= self.population_size:
                break
            self._unique(randoms, [self._sample()])
        self._unique(pool, list(randoms.values()))
        population = self._score(list(pool.values()))
        if pool and not population and self.engine_error is not None:
            raise self.engine_error  # a whole population fails: a gap in the engine, not bad luck
        for _ in range(self.generations):
            if not population:
                break
            # parents drawn in proportion to their score's rank: the model's favourites breed most
            ranked = sorted(population, key=lambda i: -i.score)
            weights = 1.0 / (1.0 + np.arange(len(ranked)))
            weights /= weights.sum()
            children: dict[str, _Individual] = {}
            for _ in range(self.population_size):
                parent = ranked[int(self.rng.choice(len(ranked), p=weights))]
                if self.rng.random() < self.mutate_prob:
                    self._unique(children, [self._mutate(parent)])
            known = {i.key for i in population}
            fresh = self._score([c for k, c in children.items() if k not in known])
            population = sorted(population + fresh, key=lambda i: -i.score)[: self.population_size]
        return sorted(population, key=lambda i: -i.score), list(randoms.values())

    def generate_measure_candidates(self) -> list[MeasureCandidate] | None:
        if self.proposed >= self.max_trials or not self.spaces:
            return None
        n = min(self.per_iter, self.max_trials - self.proposed)
        population, randoms = self._evolve()
        unmeasured = [i for i in population if i.key not in self.measured and i.key not in self.pending]
        n_random = int(n * self.eps_greedy)
        picks = unmeasured[: n - n_random]
        chosen = {i.key for i in picks}
        spare = [i for i in self._score(randoms) if i.key not in chosen and i.key not in self.measured]
        spare = [i for i in spare if i.key not in self.pending]
        for j in self.rng.permutation(len(spare))[: n - len(picks)]:
            picks.append(spare[int(j)])
        if not picks:
            return None  # the space is exhausted: MetaSchedule ends this task
        self.proposed += len(picks)
        for ind in picks:
            self.pending[ind.key] = ind
        return [MeasureCandidate(i.schedule, self.args_info) for i in picks]

    def notify_runner_results(
        self, measure_candidates: list[MeasureCandidate], results: list[ms.runner.RunnerResult]
    ) -> None:
        lats = []
        for cand, result in zip(measure_candidates, results):
            key = trace_text(cand.sch.trace.simplified(remove_postproc=True))
            ind = self.pending.pop(key, None)
            if ind is None:
                self.stats.unmatched[self.task] = self.stats.unmatched.get(self.task, 0) + 1
            lat = _latency(result)
            lats.append(lat)
            trace = ind.trace if ind is not None else cand.sch.trace.simplified(remove_postproc=True)
            self.measured[key] = (lat, trace)
            if ind is not None and ind.pooled is not None:
                self.measured_pooled[key] = ind.pooled
        self.stats.batches.setdefault(self.task, []).append(lats)
        if self.internal is not None and self.measured_pooled:
            keys = list(self.measured_pooled)
            self.internal.fit(
                [
                    (
                        np.stack([self.measured_pooled[k] for k in keys]),
                        np.array([self.measured[k][0] for k in keys]),
                    )
                ]
            )

    def clone(self) -> ms.search_strategy.SearchStrategy:
        twin = SearchStrategy(**self.config)
        twin.stats = self.stats
        return twin
