"""The tuning loop's sampler for CUDA targets (:class:`fastsearch.search.gpu.GpuSampler`),
driven as the loop drives it, with stand-in measurements (no GPU here): every candidate is a
postprocessed TVM schedule with GPU thread bindings, TVM's VerifyGPUCode accepts it, no key is
proposed twice, measured genomes seed the next batches, and the same seeds give the same keys."""

from __future__ import annotations

import json

import pytest
import tvm
from fastsearch.search.gpu import GpuSampler
from tvm.s_tir.meta_schedule.testing import te_workload

H100 = tvm.target.Target("nvidia/nvidia-h100")


def _stand_in_seconds(key: str) -> float:
    """A deterministic stand-in for a measurement, from the trace's length."""
    return 1e-3 * (1.0 + len(json.loads(key)[0]) / 100.0)


def _drive(sampler: GpuSampler, func: tvm.tirx.PrimFunc, batches: int, n: int) -> list[str]:
    keys: list[str] = []
    for round_index in range(batches):
        batch = sampler(func, H100, n, round_index, set(keys))
        for c in batch:
            text = c.schedule.mod["main"].script()
            assert 'thread="threadIdx.x"' in text and 'thread="blockIdx.x"' in text
        keys.extend(c.key for c in batch)
        sampler.update(func, [(c.key, _stand_in_seconds(c.key)) for c in batch])
    return keys


@pytest.mark.parametrize(("family", "index"), [("GMM", 0), ("C2D", 2), ("SFM", 0)])
def test_batches_are_valid_distinct_and_deterministic(family: str, index: int) -> None:
    func = te_workload.create_te_workload(family, index)
    keys = _drive(GpuSampler(func, H100), func, 3, 8)
    assert len(keys) >= 16
    assert len(set(keys)) == len(keys)
    again = _drive(GpuSampler(func, H100), func, 3, 8)
    assert again == keys


def test_measured_genomes_seed_the_next_batch() -> None:
    func = te_workload.create_te_workload("GMM", 0)
    sampler = GpuSampler(func, H100)
    first = sampler(func, H100, 8, 0, set())
    assert sampler._seeds() == []
    sampler.update(func, [(c.key, 1e-3) for c in first[:4]] + [(first[4].key, None)])
    seeds = sampler._seeds()
    assert len(seeds) == 4 and all(secs == 1e-3 for _, secs in seeds)


def test_random_strategy_samples_sketches() -> None:
    func = te_workload.create_te_workload("GMM", 0)
    batch = GpuSampler(func, H100, strategy="random")(func, H100, 6, 3, set())
    assert len(batch) == 6
