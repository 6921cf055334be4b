"""The learned cost model: XGBoost on fastsearch's sketch features, retrained online.

Labels are relative throughput (``best latency / latency``, 0 for a failed candidate), so the
model speaks the same scale as the analytical estimate it is blended with in the Rust scorer.
The trained booster goes to Rust as JSON; the search evaluates its trees there.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fastsearch import _core

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
        self.booster = None
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
        import xgboost as xgb

        y = self.labels(latencies)
        dtrain = xgb.DMatrix(np.asarray(features, dtype=np.float32), label=y)
        self.booster = xgb.train(self.params, dtrain, num_boost_round=self.rounds)
        self.trained_on = len(y)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted relative throughput, evaluated by fastsearch's Rust forest."""
        if self.booster is None:
            raise ValueError("the cost model is not trained")
        return np.asarray(_core.forest_predict(self.to_json(), np.asarray(features, dtype=np.float32)))

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
    ranked = sorted(((names[int(k[1:])], v) for k, v in gains.items()), key=lambda kv: -kv[1])
    return json.dumps(dict(ranked[:10]))
