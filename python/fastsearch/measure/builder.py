"""Building candidates in worker processes that outlive a batch.

MetaSchedule's ``LocalBuilder`` starts a fresh pool of worker processes for every batch it builds,
and each fresh worker spends about 1.3 s of CPU importing TVM and fastsearch before its first
build: at 16 candidates a batch on two workers that was a third of a 64-trial run's build time.
:class:`BuildPool` keeps its workers between batches and starts them (importing everything a
build needs) as soon as it is made, while the tuner searches for the first batch. TVM restarts
the local builder's pool because its workers' memory grows with use; here a worker is replaced
between batches once it has built ``max_uses`` candidates, so no batch waits on a restart.

A build that raises comes back as ``"LocalBuilder: An exception occurred ..."``, one that hangs as
``"LocalBuilder: Timeout ..."`` and one that kills its worker as ``"... Subprocess terminated"``,
the messages MetaSchedule's builder gives (:func:`fastsearch.measure.measurer` classifies them);
a worker that died or hung is replaced on its next build.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import tvm
from tvm.ir import IRModule
from tvm.support.popen_pool import PopenWorker

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["BuildOutcome", "BuildPool", "warm_up", "warm_worker"]

#: Builds a worker does before it is replaced (between batches).
DEFAULT_MAX_USES = 128

#: Seconds a worker may take to start and import what builds need.
WARM_UP_TIMEOUT_S = 300.0


class BuildOutcome:
    """One candidate's build: the artifact's path, or the error message; ``killed_after_s``: the
    limit a build that timed out ran for (it would have taken at least that long)."""

    __slots__ = ("artifact_path", "error_msg", "killed_after_s")

    def __init__(
        self, artifact_path: str | None, error_msg: str | None, killed_after_s: float | None = None
    ) -> None:
        self.artifact_path = artifact_path
        self.error_msg = error_msg
        self.killed_after_s = killed_after_s


def warm_up(modules: Sequence[str]) -> int:
    """Worker side of a worker's start: import what builds need, so the first build does not."""
    import importlib
    import os

    for name in modules:
        importlib.import_module(name)
    return os.getpid()


def warm_worker(process: PopenWorker, modules: Sequence[str]) -> bool:
    """Start ``process`` and have it import ``modules`` (blocks); False if that failed, which
    only means a cold first task: the process is stopped and starts again on its next one."""
    try:
        process.send(warm_up, (list(modules),), timeout=WARM_UP_TIMEOUT_S)
        process.recv()
        return True
    except Exception:  # noqa: BLE001  (any failure leaves a cold worker, never a broken run)
        process.kill()
        return False


def _resolve(func: Callable | str | None, default: str) -> Callable:
    if func is None:
        from tvm.s_tir.meta_schedule.builder import local_builder

        return getattr(local_builder, default)
    if isinstance(func, str):
        return tvm.get_global_func(func)
    return func


def _build_in_worker(
    f_build: Callable | str | None, f_export: Callable | str | None, mod: IRModule, target: Any
) -> str:
    """Worker side of a build: build ``mod`` for ``target`` and export it; the artifact's path."""
    built = _resolve(f_build, "default_build")(mod, target, None)
    return str(_resolve(f_export, "default_export")(built))


class _Worker:
    """One build process, started (and warmed up) ahead of its first build."""

    def __init__(self, warm_modules: Sequence[str]) -> None:
        self.process = PopenWorker()
        self.uses = 0
        self.warm_modules = tuple(warm_modules)
        self.warm = False

    def start(self) -> None:
        """Start the process and import what builds need (blocks; run on the pool's threads)."""
        self.warm = warm_worker(self.process, self.warm_modules)

    def build(
        self, f_build: Any, f_export: Any, mod: IRModule, target: Any, timeout_s: float
    ) -> BuildOutcome:
        self.uses += 1
        try:
            self.process.send(_build_in_worker, (f_build, f_export, mod, target), timeout=timeout_s)
            return BuildOutcome(str(self.process.recv()), None)
        except TimeoutError:
            self.warm = False  # PopenWorker killed it; the next send starts a cold one
            return BuildOutcome(None, f"LocalBuilder: Timeout, killed after {timeout_s} seconds", timeout_s)
        except ChildProcessError as exc:
            self.warm = False
            return BuildOutcome(None, f"LocalBuilder: An exception occurred\n{exc}")
        except Exception as exc:  # noqa: BLE001  (a failed build is a result, not the tuner's error)
            return BuildOutcome(None, f"LocalBuilder: An exception occurred\n{exc}")

    def kill(self) -> None:
        self.process.kill()


class BuildPool:
    """``workers`` build processes kept across batches.

    ``f_build`` and ``f_export`` have the signatures of MetaSchedule's ``default_build`` and
    ``default_export`` (``None``: those; a string: a registered global function); they are sent
    with every build and run in the workers, each build within ``timeout_s``. ``warm_modules``
    are imported by every worker as it starts. Call :meth:`shutdown` (or use as a context
    manager) to stop the workers.
    """

    def __init__(
        self,
        workers: int,
        timeout_s: float,
        f_build: Callable | str | None = None,
        f_export: Callable | str | None = None,
        *,
        max_uses: int = DEFAULT_MAX_USES,
        warm_modules: Sequence[str] = ("tvm.s_tir.meta_schedule.builder.local_builder",),
    ) -> None:
        if workers < 1:
            raise ValueError(f"a build pool needs at least one worker, not {workers}")
        self.timeout_s = timeout_s
        self.f_build = f_build
        self.f_export = f_export
        self.max_uses = max(1, max_uses)
        self.warm_modules = tuple(warm_modules)
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fastsearch-build")
        self._workers = [_Worker(self.warm_modules) for _ in range(workers)]
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self.started = 0  # worker processes started ahead of a build (for tests and reports)
        self._warming = [self._threads.submit(self._start, w) for w in self._workers]

    @property
    def workers(self) -> int:
        return len(self._workers)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _start(self, worker: _Worker) -> None:
        worker.start()
        self.started += 1
        self._idle.put(worker)

    def _build_one(
        self, mod: IRModule, target: Any, timeout: float | Callable[[list[float]], float], done: list[float]
    ) -> BuildOutcome:
        worker = self._idle.get()
        try:
            # A callable limit sees the seconds of this batch's builds finished so far.
            limit = timeout(list(done)) if callable(timeout) else timeout
            t0 = time.perf_counter()
            outcome = worker.build(self.f_build, self.f_export, mod, target, limit)
            if outcome.error_msg is None:
                done.append(time.perf_counter() - t0)
            return outcome
        finally:
            self._idle.put(worker)

    def wait_warm(self) -> None:
        """Wait until the workers started ahead of the builds have imported what builds need."""
        for warming in self._warming:
            warming.result()
        self._warming = []

    def build(
        self,
        mods: Sequence[IRModule],
        target: Any,
        timeout_s: float | Callable[[list[float]], float] | None = None,
    ) -> list[BuildOutcome]:
        """Build and export every module (in parallel, results in order), each within
        ``timeout_s`` (default: the pool's), or within ``timeout_s(seconds)`` where it is
        callable: ``seconds`` are those of the batch's builds finished when the build starts."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        done: list[float] = []
        self.wait_warm()
        # Between batches, replace the workers that built max_uses candidates (their memory
        # grows with use) and every worker a failure left cold, warming all of them together.
        stale = [w for w in self._workers if w.uses >= self.max_uses or not w.warm]
        if stale:
            for w in stale:
                self._take(w)
                w.kill()
            fresh = [_Worker(self.warm_modules) for _ in stale]
            self._workers = [w for w in self._workers if w not in stale] + fresh
            for f in [self._threads.submit(self._start, w) for w in fresh]:
                f.result()
        futures = [self._threads.submit(self._build_one, mod, target, timeout, done) for mod in mods]
        return [f.result() for f in futures]

    def _take(self, worker: _Worker) -> None:
        """Remove ``worker`` from the idle queue (every worker is idle between batches)."""
        held = []
        while True:
            w = self._idle.get()
            if w is worker:
                break
            held.append(w)
        for w in held:
            self._idle.put(w)

    def shutdown(self) -> None:
        """Stop the workers."""
        for warming in self._warming:
            warming.cancel()
        self._threads.shutdown(wait=True)
        for w in self._workers:
            w.kill()
