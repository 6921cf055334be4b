"""The same seeds give the same candidates: first batches recorded before a refactoring.

``tests/data/first_batches.json`` holds, for a few workloads and seeds, a digest of the keys of
the first batch a cold tuning run proposes (the model-guided sampler with no records, as
``tune`` starts every task) and of ``fastsearch.sample``'s candidates. A change meant to keep
behaviour (moving modules, reshaping the bindings) must leave every digest as it was. When a
change is meant to alter the search, record again and say so in its commit:

    python tests/test_first_batches.py --record

The target is fixed (not this host's CPU) and the parallel speedup linear, so the figures do
not depend on the machine the tests run on.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import tvm
from fastsearch import sample
from fastsearch.search.guided import ModelGuidedSampler
from workloads import small

RECORD = Path(__file__).parent / "data" / "first_batches.json"
TARGET = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 4}
CASES = [("GMM", 0), ("GMM", 1), ("C2D", 0), ("DEP", 2), ("CBR", 0)]
BATCH = 16


def _digest(keys: list[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


def first_batches(family: str, seed: int) -> dict[str, object]:
    func = small(family)
    target = tvm.target.Target(TARGET)
    sampler = ModelGuidedSampler(func, target, "evolutionary", history=list)
    batch = sampler(func, target, BATCH, seed, set())
    keys = [c.key for c in batch]
    traces = [str(t) for t in sample(func, target, n=8, seed=seed)]
    return {"tune": _digest(keys), "tune_count": len(keys), "sample": _digest(traces)}


@pytest.fixture(autouse=True)
def _linear_speedup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSEARCH_PARALLEL_SPEEDUP", "linear")


@pytest.mark.parametrize(("family", "seed"), CASES)
def test_first_batch_is_as_recorded(family: str, seed: int) -> None:
    recorded = json.loads(RECORD.read_text())[f"{family}:{seed}"]
    assert first_batches(family, seed) == recorded


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    os.environ["FASTSEARCH_PARALLEL_SPEEDUP"] = "linear"
    out = {f"{f}:{s}": first_batches(f, s) for f, s in CASES}
    RECORD.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(json.dumps(out, indent=1))
