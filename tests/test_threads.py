"""Kernels run on the target's ``num-cores`` threads: the environment a run gives the processes
that measure (the user's ``TVM_NUM_THREADS`` wins; restored afterwards), the threads a kernel
really runs on in a measuring worker, the cost model's view of them, and
``fastsearch.set_kernel_threads`` for this process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from fastsearch.ir.machine import SPEEDUP_ENV, parallel_speedup, runtime_threads
from fastsearch.ir.target import host_cpu, physical_cores
from fastsearch.ir.threads import THREADS_ENV, kernel_threads, kernel_threads_env
from fastsearch.measure.measurer import MeasureConfig, Measurer, RPCRunner
from tvm.script import tirx as T

TWO = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 2})
ONE = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 1})


@pytest.fixture
def clean_env(monkeypatch):
    for name in (THREADS_ENV, "OMP_NUM_THREADS", SPEEDUP_ENV):
        monkeypatch.delenv(name, raising=False)


def test_a_run_sets_the_targets_cores_and_restores_them(clean_env):
    with kernel_threads_env(TWO) as threads:
        assert threads == 2 and os.environ[THREADS_ENV] == "2"
        with kernel_threads_env(ONE) as inner:  # nested: the outer run's setting stands
            assert inner == 2 and os.environ[THREADS_ENV] == "2"
        assert os.environ[THREADS_ENV] == "2"
    assert THREADS_ENV not in os.environ
    with pytest.raises(RuntimeError), kernel_threads_env(TWO):
        raise RuntimeError("a run that fails")
    assert THREADS_ENV not in os.environ


def test_the_users_setting_wins(clean_env, monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "1")
    with kernel_threads_env(TWO) as threads:
        assert threads == 1 and os.environ[THREADS_ENV] == "1"
    assert os.environ[THREADS_ENV] == "1"


def test_kernels_that_do_not_run_here_leave_the_environment_alone(clean_env):
    with kernel_threads_env(TWO, remote=True) as threads:  # an RPC runner's device
        assert threads is None and THREADS_ENV not in os.environ
    with kernel_threads_env(tvm.target.Target("nvidia/nvidia-h100")) as threads:
        assert threads is None and THREADS_ENV not in os.environ
    # A CPU target without num-cores: this machine's cores, as TVM's schedule rules assume.
    assert kernel_threads(tvm.target.Target({"kind": "llvm"})) == physical_cores()
    with Measurer(TWO, runner=RPCRunner("127.0.0.1:9190", "k", max_workers=1)) as m:
        assert m.kernel_threads is None and THREADS_ENV not in os.environ


def test_the_cost_model_follows_the_threads_kernels_run_on(clean_env, monkeypatch):
    """The runtime's thread count is asked once per setting, not once per process: a run that
    sets it after the model asked (say, under the user's setting) is seen as it is."""
    monkeypatch.setenv(THREADS_ENV, "1")
    assert runtime_threads() == 1
    assert parallel_speedup(TWO) == 1.0
    monkeypatch.delenv(THREADS_ENV)
    with kernel_threads_env(TWO):
        assert runtime_threads() == 2
        assert parallel_speedup(TWO) is None  # linear: both cores run


@T.prim_func
def _thread_ids(ids: T.Buffer((16,), "int64")):
    # Each parallel iteration writes the id of the thread that runs it.
    for i in T.parallel(16):
        ids[i] = T.call_extern("int64", "pthread_self")


@pytest.mark.tuning
@pytest.mark.parametrize(("user", "expected"), [(None, 2), ("1", 1)])
def test_a_measuring_worker_runs_kernels_on_the_targets_cores(clean_env, monkeypatch, user, expected):
    if user is not None:
        monkeypatch.setenv(THREADS_ENV, user)
    with Measurer(TWO, MeasureConfig(build_workers=1)) as m:
        assert m.kernel_threads == expected
        (built,) = m.build([tvm.IRModule({"main": _thread_ids})])
        assert built.artifact_path is not None, built.error
        (ids,) = m.run_isolated(built.artifact_path, [np.zeros(16, "int64")])
        Measurer.release([built])
    assert len(set(ids.tolist())) == expected
    assert os.environ.get(THREADS_ENV) == user  # restored


SET_THREADS = """
import threading, warnings
import numpy as np, tvm
from tvm.script import tirx as T
import fastsearch

seen = set()

@tvm.register_global_func("fastsearch_test.thread_id")
def _thread_id():
    seen.add(threading.get_native_id())
    return 0

@T.prim_func
def f(a: T.Buffer((16,), "int32")):
    for i in T.parallel(16):
        a[i] = T.call_packed("fastsearch_test.thread_id", dtype="int32")

lib = tvm.compile(tvm.IRModule({"main": f}), target="llvm")
first = tvm.get_global_func("runtime.NumThreads")() if LATE else 0  # starts this thread's pool
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = fastsearch.set_kernel_threads(first + 2 if LATE else 2)
lib["main"](tvm.runtime.tensor(np.zeros(16, "int32")))
print(first, got, len(seen), len(caught))
"""


def _set_threads(tmp_path: Path, late: bool) -> list[int]:
    """Runs :data:`SET_THREADS` in a fresh process (a file: TVMScript reads the source)."""
    script = tmp_path / "set_threads.py"
    script.write_text(f"LATE = {late}\n" + SET_THREADS)
    env = {k: v for k, v in os.environ.items() if k not in (THREADS_ENV, "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
    return [int(x) for x in out.stdout.split()]


def test_set_kernel_threads_runs_this_process_kernels_on_n_threads(tmp_path):
    # In a fresh process: a parallel kernel's iterations then run on two threads.
    _, got, threads, warned = _set_threads(tmp_path, late=False)
    assert (got, threads, warned) == (2, 2, 0)


def test_set_kernel_threads_says_when_the_pool_cannot_grow(tmp_path):
    first, got, threads, warned = _set_threads(tmp_path, late=True)
    assert (got, threads, warned) == (first, first, 1)
