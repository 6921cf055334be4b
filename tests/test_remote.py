"""Remote devices: a TVM RPC tracker and two RPC servers on loopback; fastsearch builds here, runs
every candidate on the servers (two at once), stores the records, and the best kernel compiled from
the database computes what numpy computes."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import tvm
from fastsearch import RemoteError, RPCRunner, tune
from fastsearch.database import RECORD_FILE, TuningDatabase, candidate_key
from fastsearch.ir.target import resolve_target
from fastsearch.measure.measurer import MeasureConfig
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from workloads import small

TARGET = resolve_target({"kind": "llvm", "num-cores": 1})
KEY = "fastsearch-test"

try:  # the tracker needs tornado (TVM's optional dependency); nothing remote can run without it
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker
except ImportError as exc:  # pragma: no cover
    pytest.skip(f"TVM's RPC tracker is unavailable: {exc}", allow_module_level=True)


@pytest.fixture(scope="module")
def cluster():
    """A tracker and two servers registered under KEY; yields the tracker's ``host:port``."""
    start = random.randint(20000, 40000)  # other test runs on this machine may hold ports
    tracker = Tracker(host="127.0.0.1", port=start, port_end=start + 200, silent=True)
    servers = [
        Server(
            host="127.0.0.1",
            port=start + 300,
            port_end=start + 500,
            tracker_addr=(tracker.host, tracker.port),
            key=KEY,
            silent=True,
        )
        for _ in range(2)
    ]
    address = f"{tracker.host}:{tracker.port}"
    try:
        deadline = time.monotonic() + 30
        while RPCRunner(address, KEY).count_servers() < 2:  # servers register asynchronously
            assert time.monotonic() < deadline, "the RPC servers never registered with the tracker"
            time.sleep(0.2)
        yield address
    finally:
        for server in servers:
            server.terminate()
        tracker.terminate()


def test_tune_through_the_tracker_on_two_devices(cluster, tmp_path):
    func = small("GMM")  # (1, 16, 16, 16)
    remote = RPCRunner(tracker=cluster, key=KEY)
    config = MeasureConfig(repeat=2, min_repeat_ms=5, build_workers=1)
    result = tune(
        func, TARGET, trials=8, seed=0, work_dir=tmp_path, strategy="random", batch_size=4,
        measure=config, runner=remote, progress=False,
    )  # fmt: skip
    assert result.trials_measured == 8
    assert result.failed == 0, result.failures
    assert result.best_latency_us is not None and result.best_latency_us > 0
    assert result.timing["verify"] > 0  # the best was checked (on a remote device)

    db = TuningDatabase(tmp_path)
    records = db.records(db.commit_workload(_normalize_mod(func)))
    assert len(records) == 8
    assert len({candidate_key(r.trace) for r in records}) == 8
    assert (tmp_path / RECORD_FILE).read_text().count("\n") == 8

    sch = ms.tir_integration.compile_tir(ms.database.JSONDatabase(work_dir=str(tmp_path)), func, TARGET)
    assert sch is not None and candidate_key(sch.trace) == candidate_key(result.best_trace)
    lib = tvm.compile(sch.mod, target=TARGET)
    rng = np.random.default_rng(1)
    x, y = (rng.uniform(-1, 1, (1, 16, 16)).astype("float32") for _ in range(2))
    z = tvm.runtime.tensor(np.zeros((1, 16, 16), "float32"))
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y), z)
    np.testing.assert_allclose(z.numpy(), np.matmul(x, y), rtol=1e-5, atol=1e-5)


def test_measurer_runs_on_both_devices_at_once(cluster):
    from fastsearch.measure.measurer import Measurer

    with Measurer(TARGET, MeasureConfig(repeat=1, min_repeat_ms=1), runner=RPCRunner(cluster, KEY)) as m:
        assert m.run_workers == 2  # one in flight per registered server
        mod = _normalize_mod(small("GMM"))
        results = m.measure([mod, mod, mod], ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
        Measurer.release(results)
    assert all(r.ok for r in results), [r.error for r in results]


@pytest.mark.parametrize(
    ("tracker", "key", "named"),
    [
        ("no-port", KEY, "no-port"),
        ("127.0.0.1:notaport", KEY, "127.0.0.1:notaport"),
        (None, "no-such-key", "no-such-key"),
    ],
)
def test_bad_tracker_or_key_is_a_remote_error(cluster, tmp_path, tracker, key, named):
    remote = RPCRunner(tracker=tracker or cluster, key=key)
    with pytest.raises(RemoteError, match=named):
        tune(small("GMM"), TARGET, trials=1, work_dir=tmp_path, runner=remote, progress=False)


def test_a_cuda_task_is_built_here_and_run_remotely(cluster, tmp_path):
    """A CUDA target through the tracker: GPU sketch candidates are drawn, postprocessed, built
    here to CUDA modules and sent to the servers, which have no GPU, so every run fails, as a
    run error, and nothing is measured (MeasurementError). On a GPU server the same path times
    them; that needs a GPU, which the tests never have."""
    from fastsearch import MeasurementError

    func = small("GMM")
    remote = RPCRunner(tracker=cluster, key=KEY)
    config = MeasureConfig(repeat=1, min_repeat_ms=1, build_workers=1)
    with pytest.raises(MeasurementError) as info:
        tune(
            func, "nvidia/nvidia-h100", trials=4, seed=0, work_dir=tmp_path, batch_size=4,
            measure=config, runner=remote, progress=False,
        )  # fmt: skip
    message = str(info.value)
    # The servers load a library built here with a CUDA module, and have no CUDA runtime.
    assert "Library binary was created using {cuda}" in message, message
    db = TuningDatabase(tmp_path)
    records = db.records(db.commit_workload(_normalize_mod(func)))
    assert len(records) == 4
    for record in records:  # each candidate a CUDA schedule: thread bindings in its trace
        assert "threadIdx.x" in str(record.trace)
