"""Measurement: build candidates in parallel worker processes kept across batches
(:class:`~fastsearch.measure.builder.BuildPool`), run
them with its LocalRunner (``time_evaluator`` with repeats) or, through an RPC tracker, on remote
devices with its RPCRunner, and check outputs against a reference.

A candidate that fails to build, crashes, hangs past its timeout or fails to run comes back as a
:class:`MeasureResult` with ``error`` set and ``failure`` naming the kind (one of
:data:`FAILURE_KINDS`); nothing raises, the search goes on. ``run_secs`` are the per-repeat seconds
the runner returns, stored as MetaSchedule stores them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm.ir import IRModule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, LocalRunner, RPCConfig, RunnerInput
from tvm.s_tir.meta_schedule.runner import RPCRunner as _MSRPCRunner

from fastsearch.errors import RemoteError
from fastsearch.ir.machine import l2_cache_bytes
from fastsearch.ir.target import device_type, physical_cores
from fastsearch.ir.threads import kernel_threads_env
from fastsearch.ir.vector_math import TIR_PIPELINE
from fastsearch.measure.builder import BuildPool, warm_worker

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "FAILURE_KINDS",
    "CandidateFault",
    "MeasureConfig",
    "MeasureResult",
    "Measurer",
    "RPCRunner",
    "build_module",
    "compare_outputs",
    "plain_args_info",
    "random_arguments",
    "run_function",
]

#: Why a candidate failed, as counted in ``TuneResult.failures``: its trace could not be replayed
#: or was rejected by a postprocessor; the build raised, hung past ``build_timeout_s`` or killed its
#: worker process; the run raised, hung past ``run_timeout_s`` or killed its worker; or it ran but
#: its output differs from the untuned function's.
FAILURE_KINDS = (
    "apply error",
    "build error",
    "build timeout",
    "build crash",
    "run error",
    "run timeout",
    "run crash",
    "wrong answer",
)


def _failure_kind(stage: str, message: str) -> str:
    """Classify a builder/runner error message (MetaSchedule reports timeouts and dead worker
    processes only in the message text)."""
    if "Timeout" in message or "timed out" in message.lower():
        return f"{stage} timeout"
    if "Subprocess terminated" in message:  # PopenWorker's ChildProcessError: the worker died
        return f"{stage} crash"
    return f"{stage} error"


class CandidateFault(Exception):
    """A candidate killed or hung the worker process that ran it; ``kind`` is ``"run crash"`` or
    ``"run timeout"``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _run_artifact(path: str, arrays: list[np.ndarray], entry: str, dev_type: str) -> list[np.ndarray]:
    """Worker side of :meth:`Measurer.run_isolated`."""
    rt_mod = tvm.runtime.load_module(path)
    return run_function(rt_mod, arrays, tvm.runtime.device(dev_type, 0), entry)


#: Builds a task has had before its build timeout follows them
#: (:meth:`MeasureConfig.build_timeout_for`).
BUILD_TIMEOUT_AFTER = 8


@dataclass(frozen=True)
class MeasureConfig:
    """How candidates are built and timed.

    Each candidate runs ``repeat`` timed repeats (after one warm-up run); each repeat calls the
    kernel ``number`` times, raised until the repeat lasts at least ``min_repeat_ms`` (10 ms: a
    run's time moves from one call of the runner to the next by far more than 10 ms of repeats
    leave. Over 12 interleaved calls of 12 kernels of GMM, C1D, DEP and SFM, the spread of a
    call's mean was 2.2% with 10 ms and 2.5% with 20 ms (medians), at 0.055 against 0.109 s a
    call: ``benches.timing_spread``. 64-trial suites gave 0.743 with either).
    ``enable_cpu_cache_flush`` flushes the CPU caches before each repeat (then keep ``number=1``
    for cold-cache timings). ``build_workers=None`` uses one build process per physical core.
    ``build_func`` replaces the builder's build function (MetaSchedule's ``default_build``
    signature ``(mod, target, params) -> runtime.Module``, run in the build worker processes;
    default :func:`build_module`). ``confirm_runs``: a candidate that would become its task's
    best is run that many more times, each on freshly allocated arguments, and timed by the mean
    over all runs. A kernel's time here moves by up to 50% from one run to the next with where
    its arguments land in memory (a 5-run C1D kernel: 331, 371, 389, 523, 478 us), so one lucky
    run would otherwise make a best that is not.

    ``final_candidates``: when a task's trials are done, its best that many records are built
    again and timed side by side (:meth:`Measurer.side_by_side`) in ``final_rounds`` interleaved
    rounds in each of ``final_processes`` worker processes (the kept one, then fresh ones); a
    challenger that beats the best in the mean of its per-round ratios (and computes the right
    answer) becomes the best (``fastsearch.tune``). ``0`` or ``1`` turns this off. Some kernels'
    times depend on the process they run in, not on the round: on C1D:2 (Zen 5) one best read
    77 us while tuning and 110-113 us in each of 4 fresh processes, its runner-up 77 and 83-84,
    so one process alone can crown a kernel that users' processes run slower.

    ``build_timeout_s`` bounds every build. Once a task has :data:`BUILD_TIMEOUT_AFTER` builds
    (its first batch's finished builds count), a build that takes ``build_timeout_scale`` times
    their lower quartile (at least ``build_timeout_floor_s``) is stopped and counted as a build
    timeout (:meth:`build_timeout_for`): one TBG:0 candidate, unrolled 512 deep, built in 32 s
    where its task's median was 0.14 s, and the batch waited for it; such candidates ran no
    faster. The quartile, not the median: a first batch's builds include each worker's cold
    first build and a few slow ones, and on TBG:0 their median (0.69 s) let one build run 27.5 s
    where the quartile's limit stops it at the floor.

    ``cold_weights``: a task whose weights (the arguments between the first and the output)
    take more than twice a core's L2 cache (:func:`l2_cache_bytes`) is timed with every argument
    but the first flushed from the caches before each call (``cold_repeat`` calls, by their
    mean), while tuning and in its final round. In a model such a kernel streams its weights
    from memory on every inference: ResNet-18's 512-channel 3x3 convolutions (9.4 MB of
    weights) took 0.79 ms alone with warm caches and 1.07 to 1.17 ms in the model; tuned cold,
    0.89 to 0.96 ms in the model. Tasks nearer the L2's size (2.4 MB of weights, or a 3.2 MB
    output) tuned cold ran slower in the model, so they stay warm. ``None`` (the default) does
    this when tuning a whole model only; ``True`` for every task; ``False`` never.
    ``enable_cpu_cache_flush`` (every task, every size) takes precedence.

    ``model_candidates``: after the final rounds of a whole model (a Relax module, timed on this
    machine), each task's best that many records are tried inside the model's call sequence, in
    ``model_rounds`` interleaved rounds in a fresh process, and a runner-up that is faster there
    becomes the best (:mod:`fastsearch.tuning.model_round`). ``0`` or ``1`` turns this off.
    """

    number: int = 1
    repeat: int = 3
    min_repeat_ms: int = 10
    enable_cpu_cache_flush: bool = False
    build_workers: int | None = None
    build_timeout_s: float = 60.0
    build_timeout_scale: float = 40.0
    build_timeout_floor_s: float = 10.0
    run_timeout_s: float = 30.0
    cooldown_s: float = 0.0
    build_func: Callable | None = None
    confirm_runs: int = 2
    final_candidates: int = 4
    final_rounds: int = 5
    final_processes: int = 2
    cold_weights: bool | None = None
    cold_repeat: int = 10
    model_candidates: int = 6
    model_rounds: int = 20

    def evaluator_config(self, cold: bool = False) -> EvaluatorConfig:
        """The MetaSchedule :class:`EvaluatorConfig` of this configuration; ``cold``: one call
        per repeat, ``cold_repeat`` of them, every argument but the first flushed before each."""
        if cold and not self.enable_cpu_cache_flush:
            return EvaluatorConfig(
                number=1, repeat=self.cold_repeat, min_repeat_ms=0, enable_cpu_cache_flush=True
            )
        return EvaluatorConfig(
            number=self.number,
            repeat=self.repeat,
            min_repeat_ms=self.min_repeat_ms,
            enable_cpu_cache_flush=self.enable_cpu_cache_flush,
        )

    def build_timeout_for(self, build_secs: Sequence[float]) -> float:
        """The build timeout of a task whose earlier builds took ``build_secs`` seconds."""
        if len(build_secs) < BUILD_TIMEOUT_AFTER:
            return self.build_timeout_s
        typical = sorted(build_secs)[len(build_secs) // 4]  # the lower quartile
        scaled = self.build_timeout_scale * typical
        return min(self.build_timeout_s, max(self.build_timeout_floor_s, scaled))

    def times_cold(self, args_info: Sequence[ms.arg_info.ArgInfo], whole_model: bool) -> bool:
        """Whether a task with these arguments is timed with cold weights (``cold_weights``)."""
        if self.enable_cpu_cache_flush or self.cold_weights is False:
            return False
        if self.cold_weights is None and not whole_model:
            return False
        return sum(_arg_bytes(info) for info in list(args_info)[1:-1]) > 2 * l2_cache_bytes()


def _arg_bytes(info: ms.arg_info.ArgInfo) -> int:
    _, dtype, shape = plain_args_info(info)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


#: The stages of a build :func:`export_module` times: TVM's passes, code generation, export.
BUILD_STAGES = ("passes", "codegen", "export")


def build_seconds(stages: Mapping[str, float | None] | None) -> float | None:
    """A build's seconds, its :data:`BUILD_STAGES` together; None when one was not recorded."""
    parts = [(stages or {}).get(k) for k in BUILD_STAGES]
    return None if any(v is None for v in parts) else sum(v for v in parts if v is not None)


@dataclass
class MeasureResult:
    """Outcome of one candidate: per-repeat seconds, or the error that stopped it."""

    run_secs: list[float] | None = None
    error: str | None = None
    artifact_path: str | None = field(default=None, repr=False)
    failure: str | None = None  # one of FAILURE_KINDS when error is set
    # The built function's arguments when they differ from the workload's: a schedule that
    # rewrites a weight's layout (prepacking) is built without the rewrite and takes the weight
    # in its new layout.
    args_info: list | None = field(default=None, repr=False)
    # Seconds of the build's stages (``passes``: TVM's, ``codegen``: LLVM's, ``export``), when
    # the builder recorded them (:func:`export_module`).
    build_stages: dict[str, float] | None = None
    # Seconds a build ran before it was stopped (a build timeout): it needed at least that long.
    build_killed_s: float | None = None

    def fail(self, kind: str, error: str) -> None:
        """Mark the candidate failed with ``kind`` (one of :data:`FAILURE_KINDS`)."""
        self.failure, self.error, self.run_secs = kind, error, None

    @property
    def ok(self) -> bool:
        """Whether the candidate built and ran."""
        return self.error is None and bool(self.run_secs)

    @property
    def build_s(self) -> float | None:
        """Seconds of the whole build, its stages together (None where not recorded)."""
        return build_seconds(self.build_stages)

    @property
    def mean_us(self) -> float | None:
        """Mean of the repeats in microseconds (what MetaSchedule ranks by)."""
        return statistics.fmean(self.run_secs) * 1e6 if self.ok and self.run_secs else None

    @property
    def median_us(self) -> float | None:
        """Median of the repeats in microseconds."""
        return statistics.median(self.run_secs) * 1e6 if self.ok and self.run_secs else None

    @property
    def min_us(self) -> float | None:
        """Fastest repeat in microseconds."""
        return min(self.run_secs) * 1e6 if self.ok and self.run_secs else None


@dataclass(frozen=True)
class RPCRunner:
    """Run candidates on remote devices registered with a TVM RPC tracker under ``key``.

    Builds stay on this machine (cross-compile with a target for the devices); each built
    candidate is uploaded to one device through MetaSchedule's RPCRunner, with ``max_workers``
    candidates in flight at once (default: the number of servers with ``key`` on the tracker,
    one per device). ``session_timeout_s`` (default: ``MeasureConfig.run_timeout_s``) bounds one
    candidate's session; a device that dies or hangs fails only that candidate.
    """

    tracker: str
    key: str
    max_workers: int | None = None
    priority: int = 1
    session_timeout_s: float | None = None

    def address(self) -> tuple[str, int]:
        """``(host, port)`` of the tracker; :class:`RemoteError` when ``tracker`` is not ``host:port``."""
        host, sep, port = self.tracker.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RemoteError(f"invalid RPC tracker address {self.tracker!r}: expected 'host:port'")
        return host, int(port)

    def rpc_config(self, timeout_s: float) -> RPCConfig:
        host, port = self.address()
        secs = self.session_timeout_s if self.session_timeout_s is not None else timeout_s
        return RPCConfig(
            tracker_host=host,
            tracker_port=port,
            tracker_key=self.key,
            session_priority=self.priority,
            session_timeout_sec=max(1, math.ceil(secs)),  # RPCConfig takes whole seconds
        )

    def count_servers(self, timeout_s: float = 10.0) -> int:
        """Servers registered with ``key`` now; :class:`RemoteError` when the tracker is unreachable."""
        try:
            return int(self.rpc_config(timeout_s).count_num_servers(allow_missing=True))
        except RemoteError:
            raise
        except Exception as exc:
            raise RemoteError(f"cannot reach the RPC tracker at {self.tracker}: {exc}") from exc

    def connect(self, timeout_s: float) -> Any:
        """An RPC session on one of the devices (for checking outputs there)."""
        try:
            return self.rpc_config(timeout_s).connect_server()
        except Exception as exc:
            raise RemoteError(
                f"cannot get a device with key {self.key!r} from the RPC tracker at {self.tracker}: {exc}"
            ) from exc

    def make(self, config: MeasureConfig) -> tuple[_MSRPCRunner, int]:
        """MetaSchedule's RPCRunner for this tracker and how many candidates it runs at once."""
        workers = self.max_workers
        if workers is None:
            workers = self.count_servers()
            if workers == 0:  # every candidate would wait out its timeout: say why now
                raise RemoteError(f"the RPC tracker at {self.tracker} has no server with key {self.key!r}")
        if workers < 1:
            raise RemoteError(f"RPCRunner max_workers must be at least 1, got {workers}")
        runner = _MSRPCRunner(
            rpc_config=self.rpc_config(config.run_timeout_s),
            evaluator_config=config.evaluator_config(),
            cooldown_sec=config.cooldown_s,
            max_workers=workers,
        )
        return runner, workers


def build_module(mod: IRModule, target: tvm.target.Target, _params: dict | None = None) -> tvm.runtime.Module:
    """Build function of the builder workers: MetaSchedule's ``default_build`` without its import
    of ``tvm.s_tir.tensor_intrin``, lowered with fastsearch's TIR pipeline (vector ``exp``:
    :mod:`fastsearch.ir.vector_math`).

    That import registers every tensor intrinsic (tens of seconds per fresh worker process);
    intrinsics are needed where a trace is
    applied (``tensorize``), never to build the scheduled module.
    """
    return _build(mod, target, TIR_PIPELINE)


def build_module_tvm_lowering(
    mod: IRModule, target: tvm.target.Target, _params: dict | None = None
) -> tvm.runtime.Module:
    """:func:`build_module` with TVM's default TIR pipeline: the code MetaSchedule's own builder
    makes (benchmarks tune MetaSchedule with it)."""
    return _build(mod, target, "default")


def _build(mod: IRModule, target: tvm.target.Target, pipeline: str) -> tvm.runtime.Module:
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    t0 = time.perf_counter()
    passes = _PassSeconds()
    current = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(
        opt_level=current.opt_level,
        required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass),
        config=dict(current.config),
        instruments=[passes],
    ):
        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        built = tvm.tirx.build(mod, target=target, pipeline=pipeline)
    total = time.perf_counter() - t0
    _last_build.clear()
    _last_build.update(passes=passes.seconds, codegen=max(0.0, total - passes.seconds))
    return built


#: Stage seconds of the last :func:`build_module` in this (builder worker) process, for
#: :func:`export_module` to store beside the artifact.
_last_build: dict[str, float] = {}

#: Suffix of the file beside a build artifact that holds its stage seconds (JSON).
BUILD_STAGES_SUFFIX = ".stages.json"


@tvm.instrument.pass_instrument
class _PassSeconds:
    """Seconds spent in TVM's passes (outermost passes only: a Sequential's own passes are
    inside it); the rest of a build is code generation (LLVM)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._t0 = 0.0

    def run_before_pass(self, mod: IRModule, info: Any) -> None:
        if self._depth == 0:
            self._t0 = time.perf_counter()
        self._depth += 1

    def run_after_pass(self, mod: IRModule, info: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._t0


def export_module(mod: tvm.runtime.Module) -> str:
    """Export function of the builder workers: MetaSchedule's default export (a tar of object
    files, linked where it is loaded: what an RPC device needs), timed, with the stage seconds
    of the build (TVM's passes, code generation, export) written beside the artifact
    (:data:`BUILD_STAGES_SUFFIX`)."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_export

    return _timed_export(mod, default_export)


def export_shared_module(mod: tvm.runtime.Module) -> str:
    """:func:`export_module` for candidates run on this machine: linked into a shared library
    in the builder. The runner's one process loads it at once, where it linked a tar at every
    load (about 20 ms a load, a candidate's first run and each confirming run), while the
    builders link in parallel."""
    return _timed_export(mod, _export_shared)


def _export_shared(mod: tvm.runtime.Module) -> str:
    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    mod.export_library(path)
    return path


def _timed_export(mod: tvm.runtime.Module, export: Callable[[tvm.runtime.Module], str]) -> str:
    t0 = time.perf_counter()
    path = export(mod)
    stages = dict(_last_build, export=time.perf_counter() - t0)
    _last_build.clear()
    with open(path + BUILD_STAGES_SUFFIX, "w", encoding="utf-8") as f:
        json.dump(stages, f)
    return path


def read_build_stages(artifact_path: str) -> dict[str, float] | None:
    """The stage seconds :func:`export_module` wrote for an artifact; None when there are none."""
    try:
        with open(artifact_path + BUILD_STAGES_SUFFIX, encoding="utf-8") as f:
            stages = json.load(f)
    except (OSError, ValueError):
        return None
    return {str(k): float(v) for k, v in stages.items()} if isinstance(stages, dict) else None


def built_args_info(mod: IRModule) -> list | None:
    """The arguments of ``mod``'s ``main`` as :func:`build_module` builds it, when a weight
    layout rewrite (MetaSchedule's RewriteLayout on a ``layout_free_buffers`` argument) changes
    them; ``None`` when they are the workload's."""
    attrs = mod["main"].attrs
    if attrs is None or "layout_free_buffers" not in attrs:
        return None
    return list(ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True))


def _remove_artifact(path: str | None) -> None:
    """Delete a build artifact and the temporary directory its export made for it."""
    if not path:
        return
    parent = os.path.dirname(path)
    if os.path.basename(parent).startswith("tmp") and os.path.dirname(parent) == tempfile.gettempdir():
        shutil.rmtree(parent, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except OSError:
            pass


class Measurer:
    """Builds and times candidates for one target: built in a :class:`BuildPool` (worker
    processes kept for the Measurer's life), timed by MetaSchedule's local runner, or its RPC
    runner when ``runner`` is an :class:`RPCRunner`.

    Its worker processes run a local CPU target's kernels on the target's ``num-cores`` threads
    (``TVM_NUM_THREADS``, set until :meth:`close` unless the user set it: ``kernel_threads``
    says how many; :func:`fastsearch.ir.threads.kernel_threads_env`).
    ``f_build`` is the builder's build function (signature of MetaSchedule's ``default_build``:
    ``(mod, target, params) -> runtime.Module``; default :func:`build_module`, ``None`` for
    MetaSchedule's own; ``MeasureConfig.build_func`` overrides it); it runs in the builder's
    worker processes. Use as a context manager, or call :meth:`close`, to stop the worker processes
    (and restore ``TVM_NUM_THREADS``).
    """

    def __init__(
        self,
        target: tvm.target.Target,
        config: MeasureConfig | None = None,
        *,
        f_build: Callable | str | None = build_module,
        runner: RPCRunner | None = None,
    ) -> None:
        self.target = target
        self.config = config or MeasureConfig()
        # The worker processes inherit the environment when they start (a crashed one restarts
        # later): a local CPU target's kernels run on its num-cores threads until close().
        self._threads = contextlib.ExitStack()
        self.kernel_threads = self._threads.enter_context(
            kernel_threads_env(target, remote=runner is not None)
        )
        workers = self.config.build_workers or physical_cores()
        if self.config.build_func is not None:
            f_build = self.config.build_func
        self.remote = runner
        self.device_type = device_type(target)
        warm = ["tvm.s_tir.meta_schedule.builder.local_builder", __name__]
        if callable(f_build) and getattr(f_build, "__module__", None):
            warm.append(f_build.__module__)
        # Started first: the workers import TVM while the runner starts and the tuner searches
        # for the first batch.
        self.builder = BuildPool(
            workers,
            self.config.build_timeout_s,
            f_build=f_build,
            # Local CPU candidates are linked by the builders; remote and GPU ones as MetaSchedule
            # ships them (a tar, linked where it runs).
            f_export=export_shared_module if runner is None and self.device_type == "cpu" else export_module,
            warm_modules=list(dict.fromkeys(warm)),
        )
        self._isolated: Any = None  # PopenWorker of run_isolated and side_by_side
        self._isolated_warming: threading.Thread | None = None
        if runner is None:
            # Started (importing TVM) now, beside the builders, rather than at the first check.
            self._isolated_warming = threading.Thread(target=self._warm_isolated, daemon=True)
            self._isolated_warming.start()
        self.runner: LocalRunner | _MSRPCRunner
        self._cold_runner: LocalRunner | None = None  # made on first use (cold weights)
        try:
            if runner is None:
                self.runner = LocalRunner(
                    timeout_sec=self.config.run_timeout_s,
                    evaluator_config=self.config.evaluator_config(),
                    cooldown_sec=self.config.cooldown_s,
                )
                self.run_workers = 1
            else:
                self.runner, self.run_workers = runner.make(self.config)
        except BaseException:
            self.runner = None  # type: ignore[assignment]
            self.close()
            raise
        self.build_seconds = 0.0
        self.run_seconds = 0.0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes (builders, runner, checking) and restore
        ``TVM_NUM_THREADS``."""
        self.builder.shutdown()
        for runner in (self.runner, self._cold_runner):
            pool = getattr(runner, "pool", None)
            if pool is not None:
                with contextlib.suppress(Exception):  # the worker is already gone
                    pool.shutdown()
        self._stop_isolated()
        self._threads.close()

    def _stop_isolated(self) -> None:
        """Stop the isolated worker (once it has started, if it is starting); the next call that
        needs it starts a fresh one."""
        if self._isolated_warming is not None:
            self._isolated_warming.join()
            self._isolated_warming = None
        if self._isolated is not None:
            with contextlib.suppress(Exception):  # the worker is already gone
                self._isolated.kill()
            self._isolated = None

    def _warm_isolated(self) -> None:
        from tvm.support.popen_pool import PopenWorker

        worker = PopenWorker()
        warm_worker(worker, ["fastsearch.measure.measurer"])
        self._isolated = worker

    def _isolated_worker(self) -> Any:
        """The isolated worker process (started on first use unless warming up already)."""
        from tvm.support.popen_pool import PopenWorker

        self.wait_for_workers()
        if self._isolated is None:
            self._isolated = PopenWorker()
        return self._isolated

    def wait_for_workers(self) -> None:
        """Wait until the worker processes started with the Measurer have started: kernels are
        timed on an otherwise idle machine."""
        if self._isolated_warming is not None:
            self._isolated_warming.join()
            self._isolated_warming = None
        self.builder.wait_warm()

    def run_isolated(
        self, artifact_path: str, arrays: Sequence[np.ndarray], entry: str = "main"
    ) -> list[np.ndarray]:
        """Call ``entry`` of a built candidate on copies of ``arrays`` in a worker process of its
        own and return every argument afterwards.

        A candidate that passed the runner can still crash or hang on other inputs; here that
        kills only the worker (restarted on the next call): :class:`CandidateFault` says which.
        """

        worker = self._isolated_worker()
        timeout = self.config.run_timeout_s
        worker.send(_run_artifact, (artifact_path, list(arrays), entry, self.device_type), timeout=timeout)
        try:
            return list(worker.recv())
        except TimeoutError:
            raise CandidateFault("run timeout", f"killed after {timeout} seconds") from None
        except ChildProcessError:
            raise CandidateFault("run crash", "the worker process running it died") from None

    def build(
        self, mods: Sequence[IRModule], build_secs: Sequence[float] | None = None
    ) -> list[MeasureResult]:
        """Build all ``mods`` in parallel: a result with ``artifact_path`` (until :meth:`release`)
        and the built function's ``args_info`` when a weight layout rewrite changed it, or the
        build's error, per module. ``build_secs``: the seconds of the task's earlier builds; each
        build's limit is :meth:`MeasureConfig.build_timeout_for` of them and of the batch's
        builds finished before it starts (``None``: ``MeasureConfig.build_timeout_s``)."""
        t0 = time.perf_counter()
        timeout: float | Callable[[list[float]], float] = self.config.build_timeout_s
        if build_secs is not None:
            earlier = list(build_secs)
            timeout = lambda done: self.config.build_timeout_for(earlier + done)
        try:
            built = self.builder.build(mods, self.target, timeout)
        except Exception as exc:  # noqa: BLE001  (the pool failed: the whole batch failed; search goes on)
            built = None
            build_error = f"BuildPool failed: {exc}"
        self.build_seconds += time.perf_counter() - t0

        results: list[MeasureResult] = []
        for i in range(len(mods)):
            if built is None:
                results.append(MeasureResult(error=build_error, failure=_failure_kind("build", build_error)))
                continue
            res = built[i]
            if res.error_msg is not None or res.artifact_path is None:
                msg = str(res.error_msg or "build produced no artifact")
                results.append(
                    MeasureResult(
                        error=msg, failure=_failure_kind("build", msg), build_killed_s=res.killed_after_s
                    )
                )
            else:
                path = str(res.artifact_path)
                results.append(
                    MeasureResult(
                        artifact_path=path,
                        args_info=built_args_info(mods[i]),
                        build_stages=read_build_stages(path),
                    )
                )
        return results

    def side_by_side(
        self,
        artifact_paths: Sequence[str],
        arrays: Sequence[np.ndarray] | Sequence[Sequence[np.ndarray]],
        rounds: int,
        entry: str = "main",
        cold: bool = False,
        fresh: bool = False,
    ) -> list[list[float]]:
        """Seconds per call of each built candidate, timed in ``rounds`` interleaved rounds (every
        other round in reverse order) on the same ``arrays`` in one worker process of their own
        (or on ``arrays[i]`` for candidate ``i``, when ``arrays`` holds one list per candidate:
        candidates that take a prepacked weight each take it in their own layout). ``cold``:
        timed with cold weights (``MeasureConfig.cold_weights``).

        Candidates timed together share the process's memory placement and the machine's state
        of the moment, which move a kernel's time by tens of percent from one measurement to
        the next here; side by side, what is left is mostly their difference. ``fresh``: in a
        worker process started for this call (the one kept until now is stopped), whose memory
        holds nothing from earlier runs.
        Raises :class:`CandidateFault` if the worker crashes or hangs.
        """

        if fresh:
            self._stop_isolated()
        worker = self._isolated_worker()
        timeout = self.config.run_timeout_s * len(artifact_paths) * (rounds + 1)  # warm-up + rounds
        how = self.config.evaluator_config(cold)  # flushed calls as the runner times them
        t0 = time.perf_counter()
        worker.send(
            _time_side_by_side,
            (
                list(artifact_paths),
                list(arrays),
                entry,
                self.device_type,
                rounds,
                self.config.min_repeat_ms,
                how.repeat if how.enable_cpu_cache_flush else 0,
            ),
            timeout=timeout,
        )
        try:
            return [list(row) for row in worker.recv()]
        except TimeoutError:
            raise CandidateFault("run timeout", f"killed after {timeout:.0f} seconds") from None
        except ChildProcessError:
            raise CandidateFault("run crash", "the worker process running them died") from None
        finally:
            self.run_seconds += time.perf_counter() - t0

    def _runner_for(self, cold: bool) -> LocalRunner | _MSRPCRunner:
        """The runner timing a task: with cold weights, a local runner of its own."""
        if not cold or self.remote is not None:
            return self.runner
        if self._cold_runner is None:
            self._cold_runner = LocalRunner(
                timeout_sec=self.config.run_timeout_s,
                evaluator_config=self.config.evaluator_config(cold=True),
                cooldown_sec=self.config.cooldown_s,
            )
        return self._cold_runner

    def measure(
        self,
        mods: Sequence[IRModule],
        args_info: Sequence[ms.arg_info.ArgInfo],
        cold: bool = False,
        build_secs: Sequence[float] | None = None,
    ) -> list[MeasureResult]:
        """Build all ``mods`` in parallel, then time each one that built.

        ``args_info`` describes the arguments of the ``main`` function (the same for every
        candidate of a workload). Artifacts stay on disk (``artifact_path``) until :meth:`release`.
        ``cold``: timed with cold weights (``MeasureConfig.cold_weights``; local runs only).
        ``build_secs``: the task's earlier build seconds, for the build timeout (:meth:`build`).
        """
        runner = self._runner_for(cold)
        if not mods:
            return []
        results = self.build(mods, build_secs)
        to_run = [i for i, res in enumerate(results) if res.artifact_path is not None]
        self.wait_for_workers()

        t0 = time.perf_counter()
        info = list(args_info)
        # The local runner times one candidate at a time (they would share this CPU); remote
        # devices each take one, so up to run_workers candidates are in flight together.
        for start in range(0, len(to_run), self.run_workers):
            chunk = to_run[start : start + self.run_workers]
            try:
                futures = runner.run(
                    [
                        RunnerInput(results[i].artifact_path, self.device_type, results[i].args_info or info)
                        for i in chunk
                    ]
                )
            except Exception as exc:  # noqa: BLE001  (a failed candidate must not stop the search)
                for i in chunk:
                    results[i].fail("run error", f"{type(runner).__name__} failed: {exc}")
                continue
            for i, future in zip(chunk, futures):
                self._collect(results[i], future)
        self.run_seconds += time.perf_counter() - t0
        return results

    def confirm(
        self, result: MeasureResult, args_info: Sequence[ms.arg_info.ArgInfo], cold: bool = False
    ) -> None:
        """Runs a built candidate ``confirm_runs`` more times and adds their timings to
        ``result.run_secs`` (a failing run marks it failed, as the first would have)."""
        info = list(result.args_info or args_info)
        runner = self._runner_for(cold)
        for _ in range(self.config.confirm_runs):
            if not result.ok or result.artifact_path is None:
                return
            first = list(result.run_secs or [])
            t0 = time.perf_counter()
            try:
                (future,) = runner.run([RunnerInput(result.artifact_path, self.device_type, info)])
            except Exception as exc:  # noqa: BLE001  (a failed candidate must not stop the search)
                result.fail("run error", f"{type(runner).__name__} failed: {exc}")
                return
            self._collect(result, future)
            self.run_seconds += time.perf_counter() - t0
            if result.ok:
                result.run_secs = first + list(result.run_secs or [])

    def _collect(self, result: MeasureResult, future: Any) -> None:
        try:
            run = future.result()
        except Exception as exc:  # noqa: BLE001  (a failed candidate must not stop the search)
            result.fail("run error", f"{type(self.runner).__name__} failed: {exc}")
            return
        if run.error_msg is not None or run.run_secs is None:
            msg = str(run.error_msg or "runner returned no timings")
            result.fail(_failure_kind("run", msg), msg)
            return
        secs = [float(s) for s in run.run_secs]
        if not secs or any(not np.isfinite(s) or s <= 0 for s in secs):
            result.fail("run error", f"runner returned invalid timings {secs}")
        else:
            result.run_secs = secs

    @staticmethod
    def release(results: Sequence[MeasureResult]) -> None:
        """Delete the build artifacts of ``results``."""
        for res in results:
            _remove_artifact(res.artifact_path)
            res.artifact_path = None


# -- correctness ---------------------------------------------------------------------------------


def random_arguments(args_info: Sequence[ms.arg_info.ArgInfo], seed: int = 0) -> list[np.ndarray]:
    """Random numpy arrays for every tensor argument (deterministic in ``seed``).

    ``args_info`` is ``ms.arg_info.ArgInfo.from_prim_func(func)``. Floats are uniform in [-1, 1],
    integers in [0, 8), so reductions stay far from overflow.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for i, info in enumerate(args_info):
        kind, dtype, shape = plain_args_info(info)
        if kind != "TENSOR":
            raise ValueError(f"argument {i} is a {kind}, not a tensor")
        if dtype == "bool":
            arr = rng.integers(0, 2, size=shape).astype("bool")
        elif dtype.startswith(("int", "uint")):
            arr = rng.integers(0, 8, size=shape).astype(dtype)
        else:
            arr = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        arrays.append(arr)
    return arrays


def _time_side_by_side(
    paths: list[str],
    arrays: list[np.ndarray],
    entry: str,
    dev_type: str,
    rounds: int,
    min_repeat_ms: int,
    flushed_calls: int = 0,
) -> list[list[float]]:
    """Worker side of :meth:`Measurer.side_by_side`: with ``flushed_calls`` (the configuration's
    ``enable_cpu_cache_flush``), each round times that many calls, each after flushing the caches
    of all arguments but the first, by their mean, as the tuning runs timed them; otherwise one
    loop of at least ``min_repeat_ms``."""
    dev = tvm.runtime.device(dev_type, 0)
    per_candidate = bool(arrays) and isinstance(arrays[0], (list, tuple))
    shared = [] if per_candidate else [tvm.runtime.tensor(a, dev) for a in arrays]
    args: list[list[Any]] = [
        [tvm.runtime.tensor(a, dev) for a in arrays[i]] if per_candidate else shared
        for i in range(len(paths))
    ]
    how: dict[str, Any] = (
        {"repeat": flushed_calls, "f_preproc": "cache_flush_cpu_non_first_arg"}
        if flushed_calls
        else {"repeat": 1, "min_repeat_ms": min_repeat_ms}
    )
    timers = []
    for i, path in enumerate(paths):
        timer = tvm.runtime.load_module(path).time_evaluator(entry, dev, number=1, **how)
        timer(*args[i])  # warm-up
        timers.append(timer)
    times: list[list[float]] = [[] for _ in paths]
    for r in range(rounds):
        order = range(len(paths)) if r % 2 == 0 else reversed(range(len(paths)))
        for i in order:
            times[i].append(float(timers[i](*args[i]).mean))
    return times


def plain_args_info(info: ms.arg_info.ArgInfo) -> tuple[str, str, list[int]]:
    """``(kind, dtype, shape)`` of an argument description."""
    row = info.as_json()
    return str(row[0]), str(row[1]), [int(d) for d in row[2]]


def run_function(
    rt_mod: tvm.runtime.Module, arrays: Sequence[np.ndarray], device: tvm.runtime.Device, name: str = "main"
) -> list[np.ndarray]:
    """Call ``name`` of a built module on copies of ``arrays``; returns every argument afterwards."""
    args = [tvm.runtime.tensor(a, device) for a in arrays]
    rt_mod[name](*args)
    device.sync()
    return [a.numpy() for a in args]


def compare_outputs(
    expected: Sequence[np.ndarray], actual: Sequence[np.ndarray], rtol: float = 1e-3, atol: float = 1e-4
) -> str | None:
    """``None`` if all arrays match (floats within tolerance, others exactly), else what differs.

    The absolute tolerance is scaled by the largest magnitude of each expected array, so sums of
    many terms reordered by a schedule still compare equal.
    """
    for i, (exp, act) in enumerate(zip(expected, actual)):
        if exp.shape != act.shape:
            return f"argument {i}: shape {act.shape} != expected {exp.shape}"
        if np.issubdtype(exp.dtype, np.floating):
            scale = float(np.max(np.abs(exp))) if exp.size else 0.0
            bad = ~np.isclose(act, exp, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True)
            if bad.any():
                idx = tuple(int(x) for x in np.argwhere(bad)[0])
                return (
                    f"argument {i}: {int(bad.sum())} of {exp.size} values differ, "
                    f"e.g. at {idx}: {act[idx]!r} != expected {exp[idx]!r}"
                )
        elif not np.array_equal(exp, act):
            return f"argument {i}: values differ"
    return None
