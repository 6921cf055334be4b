"""How many threads TVM's runtime runs a kernel on: in the processes that measure candidates, and
in this process.

TVM's runtime runs a parallel kernel on ``TVM_NUM_THREADS`` threads when set (else
``OMP_NUM_THREADS``), else on half the logical CPUs (it assumes two hardware threads per core).
On a virtual machine whose vCPUs are one core each that is half the cores: one thread on a
2-vCPU machine. Each thread that runs parallel kernels on more than one thread starts a pool of
its own, of that size, and the pool never grows afterwards.

A local CPU target's candidates are measured on the target's ``num-cores`` threads: for the
length of a run, :func:`kernel_threads_env` sets ``TVM_NUM_THREADS`` for the processes the run
starts (the builders, runners and checking workers inherit the environment when they start),
then restores it. A ``TVM_NUM_THREADS`` the user set wins; ``OMP_NUM_THREADS`` does not count as
a choice for TVM (it is often set for NumPy's BLAS). ``fastsearch.tune`` and the command do
this; :func:`set_kernel_threads` does the same for kernels run in this process afterwards (the
modules ``TuneResult.compile()`` builds).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

import tvm

from fastsearch.ir.target import physical_cores

#: The environment variable TVM's runtime sizes its thread pools by.
THREADS_ENV = "TVM_NUM_THREADS"

#: ``runtime.config_threadpool``'s affinity mode that TVM's thread pool starts with (``kBig``:
#: one worker per core, on the fastest cores first).
_AFFINITY_BIG = 1

__all__ = [
    "THREADS_ENV",
    "kernel_threads",
    "kernel_threads_env",
    "runs_here",
    "set_kernel_threads",
    "target_threads",
    "user_threads",
]


def runs_here(target: tvm.target.Target, *, remote: bool = False) -> bool:
    """Whether ``target``'s kernels run on this machine's CPU, in TVM's runtime here: an LLVM
    target measured without an RPC runner (``remote``)."""
    return not remote and str(target.kind.name) == "llvm"


def target_threads(target: tvm.target.Target) -> int:
    """The threads a kernel for ``target`` is meant to run on: its ``num-cores``, or this
    machine's physical cores where it names none (as TVM's schedule rules then assume)."""
    value = target.attrs.get("num-cores") if target.attrs is not None else None
    return max(1, int(value)) if value is not None else physical_cores()


def user_threads() -> int | None:
    """The thread count the user set with ``TVM_NUM_THREADS``, as TVM's runtime reads it (at
    least 1); None when it is not set."""
    value = os.environ.get(THREADS_ENV)
    if value is None:
        return None
    try:
        return max(1, int(value.strip()))
    except ValueError:
        return 1  # TVM reads it with atoi: 0, then at least one thread


def kernel_threads(target: tvm.target.Target, *, remote: bool = False) -> int | None:
    """The threads kernels for ``target`` run on when fastsearch measures them here: the user's
    ``TVM_NUM_THREADS`` when set, else the target's ``num-cores`` (:func:`target_threads`);
    None for a target whose kernels do not run on this machine's CPU (:func:`runs_here`)."""
    if not runs_here(target, remote=remote):
        return None
    user = user_threads()
    return user if user is not None else target_threads(target)


@contextlib.contextmanager
def kernel_threads_env(target: tvm.target.Target, *, remote: bool = False) -> Iterator[int | None]:
    """Within the block, processes started to run ``target``'s kernels (they inherit this
    process's environment) run them on :func:`kernel_threads` threads: ``TVM_NUM_THREADS`` is set
    to the target's ``num-cores`` unless the user set it. Yields the thread count (None for a
    target whose kernels do not run here, whose environment is left alone); on exit the variable
    is removed again if the block set it. Nested blocks leave it to the outermost."""
    threads = kernel_threads(target, remote=remote)
    ours = threads is not None and THREADS_ENV not in os.environ
    if ours:
        os.environ[THREADS_ENV] = str(threads)
    try:
        yield threads
    finally:
        if ours and os.environ.get(THREADS_ENV) == str(threads):
            del os.environ[THREADS_ENV]


def set_kernel_threads(n: int | None = None) -> int:
    """Run TVM kernels in this process on ``n`` threads (default: this machine's physical cores,
    the ``num-cores`` of ``target=None``); returns the threads the calling thread's pool now
    runs.

    Sets ``TVM_NUM_THREADS`` (every thread pool started from now on, in any thread of this
    process or in a process it starts, gets ``n`` threads) and reconfigures the calling thread's
    pool through TVM's ``runtime.config_threadpool``. TVM cannot grow a pool that already
    started: if this thread's pool started earlier with fewer threads (it ran parallel kernels
    on more than one thread, or asked ``runtime.NumThreads``), the result is smaller than ``n``
    and a :class:`RuntimeWarning` says so. Call it before the first kernel runs (or set
    ``TVM_NUM_THREADS`` before Python starts). TVM binds the calling thread to the
    first ``n`` CPUs, and processes started later inherit that binding: with ``n`` below the
    CPU count, tune before calling it."""
    threads = physical_cores() if n is None else int(n)
    if threads < 1:
        raise ValueError(f"set_kernel_threads: n must be at least 1, got {n}")
    os.environ[THREADS_ENV] = str(threads)
    configure = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    if configure is None:  # a runtime without TVM's own thread pool: the variable is all there is
        return threads
    configure(_AFFINITY_BIG, threads)
    running = int(tvm.get_global_func("runtime.NumThreads")())
    if running < threads:
        warnings.warn(
            f"set_kernel_threads({threads}): this thread's TVM thread pool started earlier with "
            f"{running} thread(s) and cannot grow; kernels run here stay on {running} (threads "
            f"started from now on get {threads}). Call it before the first kernel runs, or set "
            f"{THREADS_ENV}={threads} before starting Python",
            RuntimeWarning,
            stacklevel=2,
        )
    return running
