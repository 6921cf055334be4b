"""Model-guided search strategies for :func:`fastsearch.tune`.

Each round, the Rust core proposes a batch of unmeasured candidates by evolutionary search or
simulated annealing over fastsearch's sketches (GIL released, all cores), scored by the hybrid
cost model: the analytical estimate at first, blended with XGBoost as measurements arrive. TVM
then replays the proposals with its postprocessors; the measured results retrain the model.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from typing import Literal, cast, get_args

import numpy as np
import tvm

from fastsearch import _core
from fastsearch.costmodel.build_time import MIN_BUILDS, BuildTimeModel
from fastsearch.costmodel.learned import CostModel, StoreRanker
from fastsearch.ir.machine import Machine, machine_of
from fastsearch.ir.target import physical_cores
from fastsearch.ir.tir_import import program_json
from fastsearch.search.sample import (
    Candidate,
    Postprocessor,
    base_schedule,
    replay,
    replay_all,
)
from fastsearch.search.state import SearchState
from fastsearch.search.warm_start import SEED_SHARE, TaskWarmStart, mean_log2_ratio

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
#: How fast a sibling task's records lose weight with the distance between the two tasks'
#: anchor blocks, and the weight below which they are left out.
SIBLING_DISTANCE_DECAY = 2.0
MIN_SIBLING_WEIGHT = 0.05
#: Best candidates of each sibling with the same anchor that are carried over and measured.
SIBLING_SEEDS = 2
#: Once the task has this many valid records, the search proposes RERANK_POOL times the batch
#: and the batch is the best of them by a blend of the search's order and a per-store-feature
#: model trained on the task's records, weighing RERANK_WEIGHT: on the next batch that model
#: ranks better than the sketch-feature one (pairwise 0.606 against 0.555 in the Zen 4 64-trial
#: runs; BENCHMARKS.md, next-batch ranking). From 16 records on, 18 runs on four workloads gave
#: 0.961 against 0.977 without it (BENCHMARKS.md, zen4_hard4). ``rerank=False`` turns it off.
RERANK_AFTER = 16
RERANK_POOL = 4
RERANK_WEIGHT = 0.5
#: Generations of evolution while only the analytical model scores (the first batch of a cold
#: run): none, the batch is the model's best of the random population. Evolving it further
#: finds the candidates the model over-rates most: on 8 workloads x 3 seeds the best of 16
#: proposals was 3.8% faster with 0 generations than with 4 (BENCHMARKS.md, first batch).
COLD_GENERATIONS = 0

#: Build cost in the ranking (issue 28): once a task has enough builds to train its
#: :class:`~fastsearch.costmodel.build_time.BuildTimeModel`, the search proposes BUILD_POOL
#: times the batch, and a proposal whose predicted build is at least BUILD_DEAD_ZONE (in log2:
#: twice) away from the task's median build moves by BUILD_RANK_WEIGHT x the batch size x the
#: log2 of the ratio, clipped to BUILD_LOG_CLIP: among near-equal proposals the cheaper build
#: goes first. Builds within a factor of two are not told apart (the model ranks them no better
#: than chance). Proposals predicted to build at least 2**BUILD_SLOW_LOG2 (4) times the median
#: take at most BUILD_SLOW_SHARE of a batch (one at least while the model learns them): on
#: TBG:0 the search converged on candidates that all built in 8 s (40x the median) and ran no
#: faster than the rest, and moving them down a batch still left half of each batch to them.
BUILD_POOL = 2
BUILD_RANK_WEIGHT = 0.25
BUILD_LOG_CLIP = (-1.0, 4.0)
BUILD_DEAD_ZONE = 1.0
BUILD_SLOW_LOG2 = 2.0
BUILD_SLOW_SHARE = 0.125
#: Seconds the slow builds of a batch may take together, in batches' worth of typical builds
#: (the first slow build whatever it costs, until BUILD_SLOW_LEARNED): on TBG:0 seed 2
#: (suite256cu) two 7.5 s builds in most batches of 16 (a typical build 0.2 s) tripled the
#: batches' time and took the run's wall to 0.77 of MetaSchedule's.
BUILD_SLOW_BUDGET = 1.0
#: Slow builds a task must have made before the budget alone admits them: until then the first
#: slow proposal of a batch is let in whatever it costs (the build-time model learns what slow
#: code takes), afterwards one that does not fit the budget waits. In suite256bb, TBG:0 seed 0
#: let one 7.5 s build into each of 10 batches, and each held its batch to 10-12 s against 3-4 s
#: on 2 build workers: its wall reached 0.64 of MetaSchedule's.
BUILD_SLOW_LEARNED = 2
#: Pool, in batches, ranked again when the first pool still leaves in the batch slow builds that
#: the slow-build rule defers (its fast proposals too few to fill it).
BUILD_WIDE_POOL = 8
#: Before a task has the builds to train its model on (its first batch), build cost is read
#: from the one count that made every slow build seen: strided vector lanes, which LLVM
#: expands lane by lane. A candidate's prior cost, against a typical 1, is 2 to the power of
#: its ``log_strided_lanes`` above PRIOR_FREE_STRIDED_LOG2, so 1024 strided lanes or more
#: count as slow. Measured on TBG:0's first batches (3 seeds), candidates with 1024 to 2048
#: strided lanes built in 0.9 to 2.3 s, 4096 in 7.4 to 7.8 s and 16384 in 38.6 s, against a
#: median of 0.1 s; one of those builds held up a batch of 16 on 2 build workers.
PRIOR_FREE_STRIDED_LOG2 = 8.0
#: The cheapest build among candidates the model cannot tell apart: a proposal with an unroll
#: depth above UNROLL_FLOOR (an index into the genome's choices 0, 16, 64, 512) is proposed with
#: the lowest depth, down to UNROLL_FLOOR, whose analytical score is within UNROLL_SCORE_TOLERANCE
#: (natural log) of its own. On C1D:2 (seed 1, 64 trials) a run's later batches all had unroll
#: 512, scored within 0.1% of 64: 4 of them re-timed in 4 fresh processes ran 0.99-1.01x as fast
#: with unroll 64, and built in 0.064 s instead of 0.45. Not below 64: one kernel ran 5% slower
#: with 16, and 3.8x slower with no unroll pragma, where the model's plain register tile sees no
#: difference.
UNROLL_FLOOR = 2
UNROLL_SCORE_TOLERANCE = 0.002

#: The Rust search's strategies.
SearchName = Literal["evolutionary", "annealing"]
STRATEGIES: tuple[SearchName, ...] = get_args(SearchName)

#: Proposals of the Rust search: (key, genome JSON, predicted score, role), best first.
Proposals = list[tuple[str, str, float, str]]
#: Roles of proposals (Rust's ``search::Role``) that keep their share of the batch when a
#: re-ranking model reorders it: the late search's exploration of coarse shapes, structures and
#: reduction splits the run has hardly measured. The re-ranking model is trained on the same
#: records and trusts what it has not seen no more than the search's model does, so it would cut
#: that share.
EXPLORING_ROLES = ("shape", "structure", "reduction")

#: ``() -> [(key, mean latency in seconds or inf when failed)]`` of the task's measured records.
History = Callable[[], Iterable[tuple[str, float]]]


class ModelGuidedSampler:
    """A :data:`fastsearch.tuning.options.Sampler` that searches with a cost model trained on ``history``."""

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
        siblings: SiblingRecords | None = None,
        name: str = "main",
        rerank: bool = True,
        build_cost: bool = True,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown search strategy {strategy!r}; available: {STRATEGIES}")
        self.strategy = cast(SearchName, strategy)
        text = program_json(func)
        self.program = _core.Program(text)
        self.base = base_schedule(func)
        self.machine = machine_of(target)
        self.core_target = self.machine.core_target()
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
        # Where the search time goes (seconds): the Rust search, the late re-ranking's features
        # and scores, and TVM's replay of the batch (benches/search_round.py reports them).
        self.search_parts = {"propose": 0.0, "rerank": 0.0, "replay": 0.0}
        self.warm = warm
        self.rounds = 0
        self.name = name
        self.siblings = siblings
        if siblings is not None:
            siblings.register(name, self.program, anchor_extents(text), history, self.genomes)
        self.store_ranker = StoreRanker(self.program) if rerank else None
        # Seconds each measured candidate took to build (``record_builds``), and the model of
        # them that ranks proposals by build cost (``build_cost=False``: none).
        self.builds: dict[str, float] = state.load_builds() if state else {}
        self.build_model = BuildTimeModel() if build_cost else None
        self.code_sizes: dict[str, np.ndarray] = {}
        # Replay runs on this machine, whatever the target: one thread per core it has.
        self.replay_threads = physical_cores()

    def record_builds(self, builds: Iterable[tuple[str, float]]) -> None:
        """Build seconds of measured candidates, by key (the tuning loop's report after each
        batch); kept beside the database so that a resumed run has them."""
        fresh = [(k, float(s)) for k, s in builds if k not in self.builds and s > 0]
        self.builds.update(fresh)
        if self.state is not None:
            self.state.add_builds(fresh)

    def _code_size_rows(self, keys: list[str]) -> np.ndarray:
        """The code-size rows (``_core.CODE_SIZE_NAMES``) of candidates by key, each computed once."""
        missing = [k for k in dict.fromkeys(keys) if k not in self.code_sizes]
        if missing:
            self.code_sizes.update(zip(missing, np.asarray(self.program.code_sizes(missing)), strict=True))
        return np.array([self.code_sizes[k] for k in keys], dtype=np.float32).reshape(len(keys), -1)

    def _train_builds(self) -> bool:
        """Retrains the build-time model on every recorded build; whether it is usable."""
        if self.build_model is None or len(self.builds) < MIN_BUILDS:
            return False
        t0 = time.perf_counter()
        keys = list(self.builds)
        trained = self.build_model.fit(self._code_size_rows(keys), np.array([self.builds[k] for k in keys]))
        self.timing["model"] += time.perf_counter() - t0
        return trained

    def _reranked(
        self, proposals: Proposals, measured: dict[str, float], want: int, warm_weight: float, late: bool
    ) -> Proposals:
        """``proposals`` re-ranked by the warm start's model (while ``warm_weight`` > 0) or, once
        ``late``, by the per-store model, the exploring roles keeping their share of ``want``."""
        reordered = None
        if warm_weight > 0 and self.warm is not None and proposals:
            t0 = time.perf_counter()
            reordered = self._rerank(proposals, measured, warm_weight)
            self.timing["model"] += time.perf_counter() - t0
        elif late and proposals:
            reordered = self._rerank_late(proposals, measured)
        return proposals if reordered is None else keep_exploring(proposals, reordered, want)

    def _predicted_builds(self, proposals: Proposals) -> tuple[np.ndarray, float]:
        """Predicted build seconds of ``proposals`` (the model's, floored for strided code by
        :func:`prior_build_cost` times the median build) and the task's median build."""
        assert self.build_model is not None
        t0 = time.perf_counter()
        rows = self._code_size_rows([key for key, _, _, _ in proposals])
        typical = float(np.median(list(self.builds.values())))
        # The prior floors the model: a model that has seen no build with thousands of strided
        # lanes predicts the slowest it has seen (on TBG:0 it let two 7.5 s builds into a batch).
        predicted = self.build_model.predict(rows)
        prior = prior_build_cost(rows)
        predicted = np.where(prior > 1.0, np.maximum(predicted, typical * prior), predicted)
        self.timing["search"] += time.perf_counter() - t0
        return predicted, typical

    def _prefer_cheap_builds(self, proposals: Proposals, want: int) -> Proposals:
        """``proposals`` re-ranked by their predicted build seconds against the task's median
        build (:func:`prefer_cheap_builds`)."""
        predicted, typical = self._predicted_builds(proposals)
        return prefer_cheap_builds(proposals, predicted, want, typical, learning=self._learning_slow_builds())

    def _deferred_builds(self, proposals: Proposals, want: int) -> int:
        """How many of the first ``want`` of ``proposals``, in their order, the slow-build rule
        of :func:`prefer_cheap_builds` would send to the back."""
        batch = proposals[:want]
        if not batch:
            return 0
        predicted, typical = self._predicted_builds(batch)
        _, deferred = admit_slow_builds(
            np.arange(len(batch)), predicted, want, typical, learning=self._learning_slow_builds()
        )
        return len(deferred)

    def _learning_slow_builds(self) -> bool:
        """Whether the task has built fewer than :data:`BUILD_SLOW_LEARNED` candidates at least
        ``2**BUILD_SLOW_LOG2`` times its median build."""
        seconds = np.array(list(self.builds.values()), dtype=np.float64)
        if seconds.size == 0:
            return True
        slow = build_log_ratio(seconds, float(np.median(seconds))) >= BUILD_SLOW_LOG2
        return int(slow.sum()) < BUILD_SLOW_LEARNED

    def _prior_costs(self, proposals: Proposals) -> np.ndarray:
        """Prior build costs of ``proposals`` (:func:`prior_build_cost`)."""
        t0 = time.perf_counter()
        cost = prior_build_cost(self._code_size_rows([key for key, _, _, _ in proposals]))
        self.timing["search"] += time.perf_counter() - t0
        return cost

    def _measured(self) -> dict[str, float]:
        return {key: float(lat) for key, lat in self.history()}

    def _train(self, measured: dict[str, float]) -> tuple[_core.Forest | None, float, list[str]]:
        """Retrains on the measured candidates we know the genome of (and a warm start's records
        of other shapes, and the run's sibling tasks' records); returns (model, weight, seeds)."""
        known = [(k, lat) for k, lat in measured.items() if k in self.genomes]
        known.sort(key=lambda kv: kv[1])
        seeds = [self.genomes[k] for k, lat in known if np.isfinite(lat)]
        t0 = time.perf_counter()
        # Records of other shapes (a warm start's databases, this run's sibling tasks): rows
        # computed on their own programs, labelled within their own task.
        others = []
        if self.warm is not None:
            others.append(self.warm.sketch_training(self.machine))
        if self.siblings is not None:
            others.append(self.siblings.training(self.name, self.machine))
        other = [o for o in others if o is not None]
        if not other and (len(known) < MIN_RECORDS or not seeds):
            if self.saved_model is not None:  # a model saved by an earlier run starts us warm
                model_json, trained_on = self.saved_model
                return _core.Forest(model_json), min(1.0, trained_on / FULL_WEIGHT_RECORDS), seeds
            return None, 0.0, seeds
        rows = self.program.sketch_feature_rows(self.core_target, [self.genomes[k] for k, _ in known])
        labels = CostModel.labels(np.array([lat for _, lat in known]))
        weights = np.ones(len(known))
        weight = min(1.0, len(labels) / FULL_WEIGHT_RECORDS)
        if other:
            # They train alongside the task's own records, which weigh more; the analytical
            # estimate keeps half the say until the task has records of its own.
            other_rows = np.concatenate([o[0] for o in other])
            if known:
                rows = np.concatenate([other_rows, np.asarray(rows).reshape(len(known), -1)])
            else:
                rows = other_rows
            labels = np.concatenate([o[1] for o in other] + [labels])
            weights = np.concatenate([o[2] for o in other] + [np.full(len(known), OWN_RECORD_WEIGHT)])
            weight = WARM_MODEL_WEIGHT + (1.0 - WARM_MODEL_WEIGHT) * min(
                1.0, len(known) / FULL_WEIGHT_RECORDS
            )
        self.model.fit_labels(rows, labels, weights)
        self.timing["model"] += time.perf_counter() - t0
        if self.state is not None:
            self.state.save_model(self.model.to_json(), len(labels))
        return self.model.forest(), weight, seeds

    def __call__(
        self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, n: int, seed: int, exclude: set
    ) -> list[Candidate | tvm.s_tir.Trace]:
        measured = self._measured()
        model, weight, seeds = self._train(measured)
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
            if self.warm.sketch_training(self.machine) is None:
                # No genomes to train the search's own model on: the per-store model re-ranks.
                valid = sum(1 for lat in measured.values() if np.isfinite(lat))
                warm_weight = max(0.0, 1.0 - valid / FULL_WEIGHT_RECORDS)
        if self.siblings is not None and len(first) < n:
            first.extend(self._sibling_seed(known, {c.key for c in first if isinstance(c, Candidate)}))
        self.rounds += 1
        want = n - len(first)
        valid = sum(1 for lat in measured.values() if np.isfinite(lat))
        late = warm_weight == 0 and self.store_ranker is not None and valid >= RERANK_AFTER
        pool = want * WARM_POOL if warm_weight > 0 else want * RERANK_POOL if late else want
        cheap_builds = self._train_builds()
        if cheap_builds:
            pool = max(pool, want * BUILD_POOL)
        generations = self.generations
        if generations is None and model is None and self.strategy == "evolutionary":
            generations = COLD_GENERATIONS

        def propose(n: int) -> Proposals:
            t0 = time.perf_counter()
            out = self.program.propose(
                self.core_target,
                strategy=self.strategy,
                n=n,
                seed=seed,
                measured=known,
                seeds=seeds,
                population=self.population,
                generations=generations,
                model=model,
                model_weight=weight,
            )
            self.timing["search"] += time.perf_counter() - t0
            self.search_parts["propose"] += time.perf_counter() - t0
            return out

        def ranked(pool: int) -> Proposals:
            proposals = propose(pool)
            # No builds of its own to learn from yet: the prior keeps slow builds out of the
            # batch, from a larger pool when the first proposals hold more than their share.
            if cold_builds and proposals and len(proposals) < want * BUILD_POOL:
                slow = build_log_ratio(self._prior_costs(proposals[:want]), 1.0) >= BUILD_SLOW_LOG2
                if int(slow.sum()) > slow_build_room(want):
                    proposals = propose(want * BUILD_POOL)
            proposals = self._reranked(proposals, measured, want, warm_weight, late)
            if cheap_builds and proposals:
                proposals = self._prefer_cheap_builds(proposals, want)
            elif cold_builds and proposals:
                proposals = prefer_cheap_builds(proposals, self._prior_costs(proposals), want, typical_s=1.0)
            return proposals

        cold_builds = self.build_model is not None and not cheap_builds
        proposals = ranked(pool)
        # A pool whose fast builds cannot fill the batch leaves it to the slow ones all the same
        # (TBG:0 seed 2 built 30 candidates of 8 s in a row once its search settled on them):
        # when the batch still holds proposals the slow-build rule defers, rank a pool
        # BUILD_WIDE_POOL times the batch once, to find the fast ones.
        if cheap_builds and self._deferred_builds(proposals, want) > 0:
            proposals = ranked(max(pool, want * BUILD_WIDE_POOL))
        seeded = {c.key for c in first if isinstance(c, Candidate)}
        proposals = [p for p in proposals if p[0] not in seeded]
        proposals = self._cheapest_equal_unroll(proposals[:want], known)
        if self.state is not None:
            self.state.add_genomes([(key, genome) for key, genome, _, _ in proposals])
        out = first
        self.genomes.update((key, genome) for key, genome, _, _ in proposals)
        t0 = time.perf_counter()
        schedules = replay_all(
            self.base, [key for key, _, _, _ in proposals], self.postprocessor, self.replay_threads
        )
        self.search_parts["replay"] += time.perf_counter() - t0
        for (key, _, _, _), sch in zip(proposals, schedules, strict=True):
            if sch is not None:
                out.append(Candidate(key, sch))
        return out

    def _cheapest_equal_unroll(self, proposals: Proposals, known: dict[str, float]) -> Proposals:
        """``proposals``, each with the lowest unroll depth (not below :data:`UNROLL_FLOOR`) the
        analytical model scores within :data:`UNROLL_SCORE_TOLERANCE` of its own, unless that
        candidate is known or already in the batch."""
        t0 = time.perf_counter()
        genomes = [json.loads(genome) for _, genome, _, _ in proposals]
        # Each proposal's shallower variants, from the lowest depth up.
        lower = [
            (i, json.dumps({**g, "unroll": u}))
            for i, g in enumerate(genomes)
            for u in range(UNROLL_FLOOR, int(g.get("unroll", 0)))
        ]
        if not lower:
            return proposals
        scores = self.program.analytical_scores(
            self.core_target, [genome for _, genome, _, _ in proposals] + [g for _, g in lower]
        )
        own, variants = scores[: len(proposals)], scores[len(proposals) :]
        chosen: dict[int, str] = {}
        for (i, genome), score in zip(lower, variants, strict=True):
            if i not in chosen and score >= own[i] - UNROLL_SCORE_TOLERANCE:
                chosen[i] = genome
        taken = {key for key, _, _, _ in proposals}
        out = list(proposals)
        transferred = self.program.transfer_genomes(list(chosen.values()))
        for i, moved in zip(chosen, transferred, strict=True):
            if moved is not None and moved[0] not in known and moved[0] not in taken:
                taken.add(moved[0])
                _, _, score, role = proposals[i]
                out[i] = (moved[0], moved[1], score, role)
        self.timing["search"] += time.perf_counter() - t0
        return out

    def _sibling_seed(self, known: dict[str, float], taken: set[str]) -> list[Candidate]:
        """At most one candidate per batch: the best of a sibling task with the same anchor (the
        same convolution with another epilogue), carried over, when not measured here yet."""
        assert self.siblings is not None
        for key, genome in self.siblings.transfers(self.name):
            if key in known or key in taken:
                continue
            sch = replay(self.base, key, self.postprocessor)
            if sch is None:
                continue
            self.genomes[key] = genome
            if self.state is not None:
                self.state.add_genomes([(key, genome)])
            return [Candidate(key, sch)]
        return []

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

    def _rerank(self, proposals: Proposals, measured: dict[str, float], warm_weight: float) -> Proposals:
        """Orders proposals by a blend of the search's rank and the warm model's, the warm one
        weighing ``warm_weight``."""
        assert self.warm is not None
        if not self.warm.train(measured):
            return proposals
        return blend_ranks(proposals, self.warm.predict([key for key, _, _, _ in proposals]), warm_weight)

    def _rerank_late(self, proposals: Proposals, measured: dict[str, float]) -> Proposals:
        """Orders proposals by a blend of the search's rank and the task's own store-feature
        model (training counts as model time, scoring the proposals as search time)."""
        assert self.store_ranker is not None
        t0 = time.perf_counter()
        trained = self.store_ranker.train(measured)
        self.timing["model"] += time.perf_counter() - t0
        if not trained:
            return proposals
        t0 = time.perf_counter()
        predicted = self.store_ranker.predict([key for key, _, _, _ in proposals])
        self.timing["search"] += time.perf_counter() - t0
        self.search_parts["rerank"] += time.perf_counter() - t0
        return blend_ranks(proposals, predicted, RERANK_WEIGHT)


def keep_exploring(proposals: Proposals, reordered: Proposals, want: int) -> Proposals:
    """``reordered`` (a re-ranking of ``proposals``) with each exploring role's share of
    ``proposals`` first: of every role in :data:`EXPLORING_ROLES`, its best-scored
    ``round(count * want / len(proposals))``, so that the first ``want`` keep the search's shares."""
    kept: Proposals = []
    for role in EXPLORING_ROLES:
        of_role = [p for p in proposals if p[3] == role]
        kept.extend(of_role[: round(len(of_role) * want / len(proposals))])
    taken = {p[0] for p in kept}
    return kept + [p for p in reordered if p[0] not in taken]


def prior_build_cost(code_sizes: np.ndarray) -> np.ndarray:
    """Prior build cost of candidates from their code-size rows (``_core.CODE_SIZE_NAMES``),
    relative to a typical candidate's 1: ``2 ** (log_strided_lanes - PRIOR_FREE_STRIDED_LOG2)``,
    at least 1. A candidate whose code could not be sized (a NaN row) counts as typical."""
    rows = np.asarray(code_sizes, dtype=np.float64).reshape(len(code_sizes), len(_core.CODE_SIZE_NAMES))
    strided = np.nan_to_num(rows[:, _core.CODE_SIZE_NAMES.index("log_strided_lanes")], nan=0.0)
    return np.exp2(np.maximum(0.0, strided - PRIOR_FREE_STRIDED_LOG2))


def build_log_ratio(predicted_s: np.ndarray, typical_s: float) -> np.ndarray:
    """``log2`` of each predicted build over the typical build: at least
    :data:`BUILD_SLOW_LOG2` is a slow build."""
    return np.log2(np.maximum(np.asarray(predicted_s, dtype=np.float64), 1e-9) / typical_s)


def slow_build_room(want: int) -> int:
    """How many proposals expected to build slowly a batch of ``want`` may hold:
    :data:`BUILD_SLOW_SHARE` of it, one at least (so the build-time model keeps learning)."""
    return max(1, int(want * BUILD_SLOW_SHARE))


def prefer_cheap_builds(
    proposals: Proposals,
    predicted_s: np.ndarray,
    want: int,
    typical_s: float | None = None,
    weight: float = BUILD_RANK_WEIGHT,
    learning: bool = True,
) -> Proposals:
    """``proposals`` (best first) with each one's rank moved by ``weight x want x log2(predicted
    build / typical_s)`` (default: the proposals' median prediction), the log clipped to
    :data:`BUILD_LOG_CLIP` and left at 0 within :data:`BUILD_DEAD_ZONE`: a much cheaper build
    moves up, a much slower one down; ties keep the given order. Slow builds are then admitted
    by :func:`admit_slow_builds` in that order; the others go last."""
    if not proposals:
        return proposals
    predicted = np.asarray(predicted_s, dtype=np.float64)
    typical = float(np.median(predicted)) if typical_s is None else float(typical_s)
    if not typical > 0:
        return proposals
    shift = np.clip(build_log_ratio(predicted, typical), *BUILD_LOG_CLIP)
    shift[np.abs(shift) < BUILD_DEAD_ZONE] = 0.0
    order = np.argsort(np.arange(len(proposals)) + weight * want * shift, kind="stable")
    kept, deferred = admit_slow_builds(order, predicted, want, typical, learning)
    return [proposals[i] for i in kept + deferred]


def admit_slow_builds(
    order: np.ndarray, predicted_s: np.ndarray, want: int, typical_s: float, learning: bool = True
) -> tuple[list[int], list[int]]:
    """The indices in ``order`` split into those a batch of ``want`` takes and those it defers.
    A proposal predicted at least ``2**BUILD_SLOW_LOG2`` times ``typical_s`` is slow; the slow
    ones are taken, in order, while they number at most ``BUILD_SLOW_SHARE x want`` (one at
    least) and their predictions fit together in ``BUILD_SLOW_BUDGET x want x typical_s``.
    While ``learning`` (the task has made fewer than :data:`BUILD_SLOW_LEARNED` slow builds),
    the first slow one is taken whatever it costs, so the build-time model sees some."""
    predicted = np.asarray(predicted_s, dtype=np.float64)
    ratio = build_log_ratio(predicted, typical_s)
    room = slow_build_room(want)
    budget = BUILD_SLOW_BUDGET * want * typical_s
    spent = 0.0
    kept: list[int] = []
    deferred: list[int] = []
    for i in order:
        slow = bool(ratio[i] >= BUILD_SLOW_LOG2)
        fits = spent + predicted[i] <= budget or (learning and spent == 0.0)
        admitted = not slow or (room > 0 and fits)
        (kept if admitted else deferred).append(int(i))
        if slow and admitted:
            room -= 1
            spent += float(predicted[i])
    return kept, deferred


def blend_ranks(proposals: Proposals, predicted: np.ndarray, weight: float) -> Proposals:
    """``proposals`` (in the search's order) ordered by ``weight`` x their rank by ``predicted``
    (higher first) plus ``1 - weight`` x their rank in the search; ties keep the search's order."""
    by_model = np.empty(len(proposals))
    by_model[np.argsort(-np.asarray(predicted), kind="stable")] = np.arange(len(proposals))
    blended = weight * by_model + (1.0 - weight) * np.arange(len(proposals))
    return [proposals[i] for i in np.argsort(blended, kind="stable")]


def anchor_extents(program: str) -> tuple[str, list[int]] | None:
    """The anchor block of fastsearch's program model (JSON): the block with a reduction and
    the largest iteration space, else the largest block. Returns its iteration kinds ("SSSSRRR")
    and extents; None for a program without blocks."""
    blocks = [b for b in json.loads(program).get("blocks", []) if b.get("iter_vars")]
    if not blocks:
        return None

    def size(b: dict) -> tuple[bool, int]:
        kinds = [iv["kind"] for iv in b["iter_vars"]]
        return ("R" in kinds, math.prod(int(iv["extent"]) for iv in b["iter_vars"]))

    anchor = max(blocks, key=size)
    return "".join(iv["kind"] for iv in anchor["iter_vars"]), [
        int(iv["extent"]) for iv in anchor["iter_vars"]
    ]


def anchor_distance(a: tuple[str, list[int]] | None, b: tuple[str, list[int]] | None) -> float:
    """Mean ``|log2|`` ratio of two anchors' extents (0: the same computation, whatever is fused
    around it); ``inf`` when their iteration kinds differ."""
    if a is None or b is None or a[0] != b[0]:
        return math.inf
    return mean_log2_ratio(a[1], b[1])


class _Sibling:
    def __init__(
        self,
        program: _core.Program,
        anchor: tuple[str, list[int]] | None,
        history: History,
        genomes: dict[str, str],
    ) -> None:
        self.program = program
        self.history = history
        self.genomes = genomes
        self.anchor = anchor
        self.rows: dict[tuple[Machine, str], np.ndarray] = {}  # sketch feature rows, by machine and key
        self.moved: dict[tuple[str, str], tuple[str, str] | None] = {}  # (to task, key) -> refit


class SiblingRecords:
    """The records of every task of one tuning run, so that each task's model also learns from
    its siblings' (as MetaSchedule's one cost model learns from all of a model's tasks), and
    a task measures the best candidates of siblings that compute the very same anchor.

    A sibling's measured candidates whose genome is known train the task's model with rows
    computed on the sibling's own program, labels relative to the sibling's best, and a weight
    ``exp(-SIBLING_DISTANCE_DECAY x anchor distance)``: the same convolution with another
    epilogue weighs 1, other shapes of it less, other operators nothing."""

    def __init__(self) -> None:
        self.tasks: dict[str, _Sibling] = {}

    def register(
        self,
        name: str,
        program: _core.Program,
        anchor: tuple[str, list[int]] | None,
        history: History,
        genomes: dict[str, str],
    ) -> None:
        """Add a task (its program and :func:`anchor_extents`); ``genomes`` is the sampler's own
        dict, which grows as it proposes."""
        self.tasks[name] = _Sibling(program, anchor, history, genomes)

    def training(self, name: str, machine: Machine) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(rows, labels, weights) of the siblings of task ``name``; None when none has a
        measured record near enough."""
        mine = self.tasks[name]
        rows, labels, weights = [], [], []
        for other_name in sorted(self.tasks):
            other = self.tasks[other_name]
            if other is mine:
                continue
            w = math.exp(-SIBLING_DISTANCE_DECAY * min(anchor_distance(mine.anchor, other.anchor), 50.0))
            if w < MIN_SIBLING_WEIGHT:
                continue
            known = [(k, lat) for k, lat in other.history() if k in other.genomes]
            if not any(math.isfinite(lat) for _, lat in known):
                continue
            todo = [k for k, _ in known if (machine, k) not in other.rows]
            if todo:
                new = other.program.sketch_feature_rows(
                    machine.core_target(), [other.genomes[k] for k in todo]
                )
                for k, row in zip(todo, np.asarray(new).reshape(len(todo), -1), strict=True):
                    other.rows[(machine, k)] = row
            rows.append(np.stack([other.rows[(machine, k)] for k, _ in known]))
            labels.append(CostModel.labels(np.array([lat for _, lat in known])))
            weights.append(np.full(len(known), w))
        if not rows:
            return None
        return np.concatenate(rows), np.concatenate(labels), np.concatenate(weights)

    def transfers(self, name: str) -> list[tuple[str, str]]:
        """(key, genome) on task ``name`` of the ``SIBLING_SEEDS`` best measured candidates of
        each sibling with the very same anchor, carried over block by block
        (``Program.transfer_sibling_genomes``): every sibling's best first, then the next."""
        mine = self.tasks[name]
        ranked: list[list[tuple[str, str]]] = []
        for other_name in sorted(self.tasks):
            other = self.tasks[other_name]
            if other is mine or anchor_distance(mine.anchor, other.anchor) != 0.0:
                continue
            best = sorted(
                ((lat, k) for k, lat in other.history() if k in other.genomes and math.isfinite(lat)),
            )[:SIBLING_SEEDS]
            todo = [k for _, k in best if (name, k) not in other.moved]
            if todo:
                moved = mine.program.transfer_sibling_genomes(other.program, [other.genomes[k] for k in todo])
                for k, m in zip(todo, moved, strict=True):
                    other.moved[(name, k)] = m
            ranked.append([m for _, k in best if (m := other.moved[(name, k)]) is not None])
        return [r[i] for i in range(SIBLING_SEEDS) for r in ranked if i < len(r)]
