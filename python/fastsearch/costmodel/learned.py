"""The learned cost models: XGBoost on fastsearch's sketch features, retrained online
(:class:`CostModel`), and on MetaSchedule's per-store features pooled per candidate
(:class:`StoreFeatureModel`, used by ``fastsearch.metaschedule.CostModel``).

Labels are relative throughput (``best latency / latency``, 0 for a failed candidate), so the
model speaks the same scale as the analytical estimate it is blended with in the Rust scorer.
The trained booster goes to Rust as JSON; the search evaluates its trees there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fastsearch import _core
from fastsearch.costmodel.features import N_FEATURES as N_STORE_FEATURES

if TYPE_CHECKING:
    import xgboost as xgb  # imported where a model is trained: it takes a second to load

#: XGBoost parameters: small trees, as the records of one run are few (tens to hundreds).
XGB_PARAMS = {
    "objective": "reg:squarederror",
    "max_depth": 6,
    "eta": 0.2,
    "min_child_weight": 1,
    "subsample": 1.0,
    "nthread": 1,
    "seed": 0,
}
ROUNDS = 60


class CostModel:
    """XGBoost regression of relative throughput on sketch features."""

    def __init__(self, params: dict | None = None, rounds: int = ROUNDS) -> None:
        self.params = dict(XGB_PARAMS, **(params or {}))
        self.rounds = rounds
        self.booster: xgb.Booster | None = None
        self._forest: tuple[Any, _core.Forest] | None = None  # (the booster it was read from, it)
        self.trained_on = 0

    @staticmethod
    def labels(latencies: np.ndarray) -> np.ndarray:
        """Relative throughput: ``best / latency``; failed (inf) -> 0."""
        lat = np.asarray(latencies, dtype=np.float64)
        valid = np.isfinite(lat) & (lat > 0)
        out = np.zeros_like(lat)
        if valid.any():
            out[valid] = lat[valid].min() / lat[valid]
        return out

    def fit(self, features: np.ndarray, latencies: np.ndarray) -> None:
        self.fit_labels(features, self.labels(latencies))

    def fit_labels(self, features: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Trains on relative-throughput ``labels`` (of several tasks, each labelled within
        itself), rows weighted by ``weights``."""
        import xgboost as xgb

        dtrain = xgb.DMatrix(np.asarray(features, dtype=np.float32), label=labels, weight=weights)
        self.booster = xgb.train(self.params, dtrain, num_boost_round=self.rounds)
        self.trained_on = len(labels)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted relative throughput, evaluated by fastsearch's Rust forest."""
        if self.booster is None:
            raise ValueError("the cost model is not trained")
        return np.asarray(self.forest().predict(np.asarray(features, dtype=np.float32)))

    def forest(self) -> _core.Forest:
        """The trained trees as fastsearch's Rust forest (read once per training)."""
        if self.booster is None:
            raise ValueError("the cost model is not trained")
        if self._forest is None or self._forest[0] is not self.booster:
            self._forest = (self.booster, _core.Forest(self.to_json()))
        return self._forest[1]

    def to_json(self) -> str:
        if self.booster is None:
            raise ValueError("the cost model is not trained")
        return bytes(self.booster.save_raw("json")).decode()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        import xgboost as xgb

        model = cls()
        model.booster = xgb.Booster()
        model.booster.load_model(bytearray(Path(path).read_bytes()))
        return model


def pairwise_accuracy(predicted: np.ndarray, latencies: np.ndarray) -> float:
    """Share of pairs of valid candidates ordered the same way by prediction and measurement."""
    p = np.asarray(predicted, dtype=np.float64)
    lat = np.asarray(latencies, dtype=np.float64)
    valid = np.isfinite(lat)
    p, lat = p[valid], lat[valid]
    if len(p) < 2:
        return float("nan")
    i, j = np.triu_indices(len(p), k=1)
    differ = lat[i] != lat[j]
    agree = (p[i] > p[j]) == (lat[i] < lat[j])
    return float(agree[differ].mean()) if differ.any() else float("nan")


def describe(model: CostModel) -> str:
    """Feature importances by gain, for reports."""
    if model.booster is None:
        return "untrained"
    names = list(_core.SKETCH_FEATURE_NAMES)
    gains = model.booster.get_score(importance_type="gain")
    # gain importances are one number per feature
    ranked = sorted(((names[int(k[1:])], float(v)) for k, v in gains.items()), key=lambda kv: -kv[1])  # type: ignore[arg-type]
    return json.dumps(dict(ranked[:10]))


#: Parameters of :class:`StoreFeatureModel`: those of ``benches/rank_vs_xgbmodel.py``, where this
#: model ranked held-out workloads better than MetaSchedule's XGBModel.
STORE_XGB_PARAMS = {
    "objective": "reg:squarederror",
    "max_depth": 6,
    "eta": 0.2,
    "min_child_weight": 1,
    "nthread": 2,
    "seed": 0,
}
STORE_ROUNDS = 100


def pool_store_features(rows: Sequence[np.ndarray]) -> np.ndarray:
    """One vector per candidate from its ``(n_stores, 164)`` per-store features: the sum over
    stores (as MetaSchedule's pack-sum adds per-store scores) and the maximum (the dominant
    store). A candidate without stores pools to zeros."""
    out = np.zeros((len(rows), 2 * N_STORE_FEATURES), dtype=np.float32)
    for i, r in enumerate(rows):
        if len(r):
            out[i, :N_STORE_FEATURES] = r.sum(axis=0)
            out[i, N_STORE_FEATURES:] = r.max(axis=0)
    return out


class StoreFeatureModel:
    """XGBoost regression of relative throughput on pooled per-store features.

    Trained on several tasks at once: labels are relative throughput within each task (its best
    latency / latency, failed = 0), so tasks of very different cost share one scale.
    """

    def __init__(self, params: dict | None = None, rounds: int = STORE_ROUNDS) -> None:
        self.params = dict(STORE_XGB_PARAMS, **(params or {}))
        self.rounds = rounds
        self.booster_json: str | None = None
        self._forest: tuple[str, _core.Forest] | None = None  # (the JSON it was read from, it)

    @property
    def trained(self) -> bool:
        return self.booster_json is not None

    def fit(self, tasks: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Trains on ``(pooled features, latencies)`` of each task (inf = failed)."""
        import xgboost as xgb

        x = np.concatenate([np.asarray(f, dtype=np.float32) for f, _ in tasks])
        y = np.concatenate([CostModel.labels(lat) for _, lat in tasks])
        booster = xgb.train(self.params, xgb.DMatrix(x, label=y), num_boost_round=self.rounds)
        self.booster_json = bytes(booster.save_raw("json")).decode()

    def predict(self, pooled: np.ndarray) -> np.ndarray:
        """Predicted relative throughput, evaluated by fastsearch's Rust forest."""
        if self.booster_json is None:
            raise ValueError("the store-feature model is not trained")
        x = np.asarray(pooled, dtype=np.float32).reshape(-1, 2 * N_STORE_FEATURES)
        if self._forest is None or self._forest[0] is not self.booster_json:
            self._forest = (self.booster_json, _core.Forest(self.booster_json))
        return np.asarray(self._forest[1].predict(x), dtype=np.float64)


def pooled_features(program: _core.Program, keys: Sequence[str]) -> np.ndarray:
    """Pooled per-store features of candidates (trace JSON keys) of ``program``, after
    postprocessing; a row of NaN for a candidate the engine cannot replay."""
    rows = program.extract_features_each(list(keys), postprocess=True)
    pooled = pool_store_features([r if r is not None else np.zeros((0, 0), np.float32) for r in rows])
    for i, r in enumerate(rows):
        if r is None:
            pooled[i] = np.nan
    return pooled


class StoreRanker:
    """A :class:`StoreFeatureModel` for one task: trained on its measured candidates (and other
    tasks' records, given as ``(pooled features, latencies)``), it scores candidates by key.
    Features are computed once per key."""

    def __init__(self, program: _core.Program) -> None:
        self.program = program
        self.model = StoreFeatureModel()
        self._features: dict[str, np.ndarray] = {}
        self._trained_on = -1

    def features(self, keys: Sequence[str]) -> np.ndarray:
        """Pooled features of ``keys`` (NaN rows where they fail)."""
        todo = [k for k in dict.fromkeys(keys) if k not in self._features]
        if todo:
            for k, row in zip(todo, pooled_features(self.program, todo)):
                self._features[k] = row
        return np.stack([self._features[k] for k in keys]) if keys else pool_store_features([])

    def train(self, measured: dict[str, float], others: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> bool:
        """(Re)trains on ``measured`` (key -> seconds, inf = failed) and ``others``; False when
        there is nothing to learn from. Skipped when the measured set has not grown."""
        if len(measured) == self._trained_on and self.model.trained:
            return True
        tasks = list(others)
        if measured:
            keys = list(measured)
            x = self.features(keys)
            lat = np.array([measured[k] for k in keys])
            keep = ~np.isnan(x[:, 0])
            if np.isfinite(lat[keep]).any():
                tasks.append((x[keep], lat[keep]))
        if not tasks:
            return False
        self.model.fit(tasks)
        self._trained_on = len(measured)
        return True

    def predict(self, keys: Sequence[str]) -> np.ndarray:
        """Predicted relative throughput of candidates; -inf where features cannot be taken."""
        x = self.features(keys)
        bad = np.isnan(x[:, 0])
        out = np.full(len(keys), -np.inf)
        if (~bad).any():
            out[~bad] = self.model.predict(x[~bad])
        return out
