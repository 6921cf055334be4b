"""How long a candidate takes to build, predicted from the size of the code LLVM is handed.

Building is the slowest step of tuning on a CPU: TVM's passes, LLVM's code generation and the
export. Most candidates build in a fraction of a second, a few take seconds: on TBG:0 every
candidate whose unrolled code held 4096 strided vector lanes (a transpose vectorized along its
non-contiguous axis, then unrolled) took 7.3 to 8.1 s, against a median of 0.2 s. The Rust
core counts, for each candidate, what TVM's vectorization and unrolling leave for LLVM
(``Program.code_sizes``: statements, strided and all vector lanes, the most copies of one
store; it agrees with TVM's lowered code on the strided lanes). The model is a small XGBoost
regression of ``log2`` build seconds on those counts, trained on the task's own builds; the
model-guided search uses it to rank proposals (:mod:`fastsearch.search.guided`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Builds a task needs before its build-time model is trained at all.
MIN_BUILDS = 16
#: A small regression: the data are a task's own builds, tens to hundreds of rows.
BUILD_XGB_PARAMS = {
    "objective": "reg:squarederror",
    "max_depth": 3,
    "eta": 0.3,
    "min_child_weight": 2,
    "subsample": 1.0,
    "nthread": 1,  # deterministic and fast on this little data
    "verbosity": 0,
}
BUILD_ROUNDS = 40


class BuildTimeModel:
    """XGBoost regression of a candidate's build seconds (in ``log2``) on its code size."""

    def __init__(self, rounds: int = BUILD_ROUNDS) -> None:
        self.rounds = rounds
        self.booster: Any = None  # an xgboost.Booster once trained
        self.trained_on = 0

    @property
    def trained(self) -> bool:
        return self.booster is not None

    def fit(self, features: np.ndarray, seconds: np.ndarray) -> bool:
        """Trains on builds that took ``seconds``; returns whether there were enough
        (:data:`MIN_BUILDS` with a positive time) to train on."""
        import xgboost as xgb

        secs = np.asarray(seconds, dtype=np.float64)
        keep = np.isfinite(secs) & (secs > 0)
        if int(keep.sum()) < MIN_BUILDS:
            return False
        rows = np.asarray(features, dtype=np.float32).reshape(len(secs), -1)[keep]
        dtrain = xgb.DMatrix(rows, label=np.log2(secs[keep]))
        self.booster = xgb.train(BUILD_XGB_PARAMS, dtrain, num_boost_round=self.rounds)
        self.trained_on = int(keep.sum())
        return True

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted build seconds of each row."""
        import xgboost as xgb

        if self.booster is None:
            raise ValueError("the build-time model is not trained")
        rows = np.asarray(features, dtype=np.float32)
        return np.exp2(np.asarray(self.booster.predict(xgb.DMatrix(rows)), dtype=np.float64))
