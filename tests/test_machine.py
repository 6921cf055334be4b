"""What the analytical model is told of the machine: the speedup on all cores is TVM's runtime
thread count when the runtime runs fewer threads than the target has cores."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import tvm
from fastsearch import _core
from fastsearch.ir.machine import SPEEDUP_ENV, machine_of, parallel_speedup
from fastsearch.ir.target import host_cpu
from fastsearch.ir.tir_import import program_json
from workloads import matmul

PROBE = (
    "import tvm; from fastsearch.ir.machine import machine_of, runtime_threads; "
    "t = tvm.target.Target({'kind': 'llvm', 'mcpu': tvm.target.codegen.llvm_get_system_cpu(), 'num-cores': 4}); "
    "print(runtime_threads(), machine_of(t).parallel_speedup)"
)


def _probe(**env: str) -> list[str]:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", SPEEDUP_ENV)
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


@pytest.mark.slow
def test_speedup_is_the_runtime_thread_count_below_the_core_count():
    # A process whose runtime runs one thread, for a 4-core target: the model expects no speedup.
    assert _probe(TVM_NUM_THREADS="1") == ["1", "1.0"]
    # TVM caps the threads at the logical CPUs: whatever it runs, below 4 it is the speedup.
    threads, speedup = _probe(TVM_NUM_THREADS="4")
    assert speedup == (f"{float(threads)}" if int(threads) < 4 else "None")
    assert _probe(TVM_NUM_THREADS="1", **{SPEEDUP_ENV: "linear"}) == ["1", "None"]
    assert _probe(TVM_NUM_THREADS="1", **{SPEEDUP_ENV: "2.5"}) == ["1", "2.5"]


def test_asking_leaves_this_process_free_to_run_on_every_cpu():
    """TVM's thread pool pins the thread that starts it to one CPU, and processes started later
    (the builders) inherit that: the thread count is asked of a child process instead."""
    code = (
        "import os; from fastsearch.ir.machine import machine_of; from fastsearch.ir.target import resolve_target; "
        "before = os.sched_getaffinity(0); machine_of(resolve_target(None)); "
        "print(before == os.sched_getaffinity(0))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "True"


def test_other_machines_and_single_cores_are_linear(monkeypatch):
    monkeypatch.delenv(SPEEDUP_ENV, raising=False)
    remote = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": 4})
    assert parallel_speedup(remote) is None
    assert parallel_speedup(tvm.target.Target({"kind": "llvm", "num-cores": 4})) is None  # no mcpu
    one = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 1})
    assert parallel_speedup(one) is None
    monkeypatch.setenv(SPEEDUP_ENV, "fast")
    with pytest.raises(ValueError, match=SPEEDUP_ENV):
        parallel_speedup(one)


def _serial(genome_json: str) -> str:
    """The genome with the two outer tile levels of every loop at 1: one parallel job."""
    genome = json.loads(genome_json)
    for loops in genome["tiles"].values():
        for factors in loops:
            if len(factors) == 4:
                factors[:] = [1, 1, factors[0] * factors[1] * factors[2], factors[3]]
    return json.dumps(genome)


def test_one_runtime_thread_stops_the_model_preferring_parallel_jobs(monkeypatch):
    """On one thread a serial candidate is estimated as on linear cores, a parallel one loses
    the factor of two that two cores would give it."""
    func = matmul(128)
    program = program_json(func)
    monkeypatch.delenv(SPEEDUP_ENV, raising=False)
    target = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})
    m = machine_of(target)
    pairs = _core.Program(program).sample_genomes(
        _core.Target(m.cores, vector_bytes=m.vector_bytes, fma_per_cycle=m.fma_per_cycle), 200, 0
    )
    tiled = [
        g for _, g in pairs if any(len(f) == 4 for loops in json.loads(g)["tiles"].values() for f in loops)
    ]
    genomes = tiled + [_serial(g) for g in tiled]

    def scores(speedup: float | None) -> list[float]:
        return _core.Program(program).analytical_scores(
            _core.Target(
                m.cores, vector_bytes=m.vector_bytes, fma_per_cycle=m.fma_per_cycle, parallel_speedup=speedup
            ),
            genomes,
        )

    linear, single = scores(None), scores(1.0)
    gains = [a - b for a, b in zip(linear, single, strict=True)]  # scores are -ln(cycles)
    n = len(tiled)
    assert n > 50
    # Serial candidates gain nothing from linear cores; parallel ones up to ln 2 (all busy).
    assert gains[n:] == pytest.approx([0.0] * n, abs=1e-9)
    assert max(gains[:n]) == pytest.approx(math.log(2), abs=1e-9)
    assert all(-1e-9 <= g <= math.log(2) + 1e-9 for g in gains[:n])
