"""What the analytical cost model assumes of the machine a target runs on, and how many of its
cores a kernel measured here actually runs on.

The model divides a kernel's work among the cores it keeps busy. The target's ``num-cores`` sets
how many parallel jobs a schedule creates, but TVM's runtime runs them on its own thread pool:
``TVM_NUM_THREADS`` when set, else half the logical CPUs (it assumes two hardware threads per
core). On a virtual machine with 2 vCPUs, one core each, that is one thread: every kernel runs
serially, and a schedule that splits its work into parallel jobs gains nothing over one that
spends the same loops on locality (MetaSchedule's fastest kernels for C1D and C2D 7x7 there have
no parallel loop). So for this machine's own CPU the model's speedup on all cores is the runtime's
thread count when that is smaller than ``num-cores``, read in the environment the measuring
processes get. ``fastsearch.tune`` and the command set ``TVM_NUM_THREADS`` to ``num-cores`` for
their runs unless the user set it (:mod:`fastsearch.ir.threads`), so the speedup is linear there
unless the user asked for fewer threads. ``FASTSEARCH_PARALLEL_SPEEDUP`` sets it instead: a
number, or ``linear`` for the core count (say, for a remote device whose runtime is configured
otherwise).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

import tvm

from fastsearch import _core
from fastsearch.ir.target import host_cpu
from fastsearch.ir.threads import THREADS_ENV

#: Overrides the runtime's thread count as the speedup on all cores: a number, or ``linear``.
SPEEDUP_ENV = "FASTSEARCH_PARALLEL_SPEEDUP"

__all__ = [
    "SPEEDUP_ENV",
    "Machine",
    "fma_per_cycle",
    "l2_cache_bytes",
    "machine_of",
    "num_cores",
    "parallel_speedup",
    "runtime_threads",
    "vector_bytes",
    "vector_registers",
]


def num_cores(target: tvm.target.Target) -> int:
    value = target.attrs.get("num-cores")
    return int(value) if value is not None else 1


def vector_bytes(target: tvm.target.Target) -> int:
    """SIMD width the target's LLVM CPU has: 64 with AVX-512, 32 with AVX2, else 16."""
    from tvm.target.codegen import target_has_features

    try:
        if target_has_features("avx512f", target):
            return 64
        if target_has_features("avx2", target):
            return 32
    except Exception:  # noqa: BLE001, S110  (TVM raises ValueError, RuntimeError, tvm.error.*)
        pass
    return 16


def vector_registers(target: tvm.target.Target) -> int:
    """Architectural vector registers of the target's CPU: 32 with AVX-512 and on AArch64, 16 on
    x86-64 without AVX-512 (a register tile of AVX-512's size spills on AVX2)."""
    if vector_bytes(target) >= 64:
        return 32
    triple = str(target.attrs.get("mtriple", "")) if target.attrs is not None else ""
    if triple.startswith(("aarch64", "arm64")):
        return 32
    return 16


#: LLVM CPUs that issue one FMA of their widest vectors per cycle where most x86 cores issue
#: two: Zen 4 runs 512-bit vectors on 256-bit units, Zen 1 256-bit ones on 128-bit units.
_HALF_RATE_FMA = ("znver1", "znver4")


def fma_per_cycle(target: tvm.target.Target) -> float:
    """Vector FMAs of :func:`vector_bytes` width a core of ``target`` issues per cycle (what the
    analytical model's compute and latency terms assume)."""
    mcpu = str(target.attrs.get("mcpu", "")) if target.attrs is not None else ""
    return 1.0 if mcpu in _HALF_RATE_FMA else 2.0


class Machine(NamedTuple):
    """The target's CPU as the Rust cost model sees it."""

    cores: int
    vector_bytes: int
    fma_per_cycle: float
    #: Speedup of a kernel on all ``cores`` over one core; None: linear (``cores``).
    parallel_speedup: float | None
    #: Architectural vector registers; None: x86-64's for ``vector_bytes`` (32 with AVX-512).
    vector_registers: int | None = None

    def core_target(self) -> _core.Target:
        """This machine as the Rust search's :class:`fastsearch._core.Target`."""
        return _core.Target(
            self.cores,
            vector_bytes=self.vector_bytes,
            fma_per_cycle=self.fma_per_cycle,
            parallel_speedup=self.parallel_speedup,
            vector_registers=self.vector_registers,
        )


def machine_of(target: tvm.target.Target) -> Machine:
    """The :class:`Machine` of an LLVM ``target``."""
    return Machine(
        num_cores(target),
        vector_bytes(target),
        fma_per_cycle(target),
        parallel_speedup(target),
        vector_registers(target),
    )


def runtime_threads() -> int | None:
    """Threads TVM's runtime runs a parallel kernel on in the processes that measure kernels
    (they inherit this process's environment): asked of a child process once per setting of
    ``TVM_NUM_THREADS`` and ``OMP_NUM_THREADS``, so that it follows what a run sets
    (:func:`fastsearch.ir.threads.kernel_threads_env`).

    Not asked here: starting TVM's thread pool pins the calling thread to one CPU, and every
    builder process started after it would inherit that (builds took twice as long).
    A ``TVM_NUM_THREADS`` between 1 and the CPUs this process may run on (what a run sets) is
    taken as it is, as TVM's runtime takes it, without the child process (1.7 s at every run's
    start); TVM caps larger ones, so those are asked."""
    tvm_threads = os.environ.get(THREADS_ENV)
    try:
        threads = int(tvm_threads or "")
    except ValueError:
        threads = 0
    if 1 <= threads <= min(len(os.sched_getaffinity(0)), os.cpu_count() or 1):
        return threads
    return _runtime_threads(tvm_threads, os.environ.get("OMP_NUM_THREADS"))


@functools.cache
def _runtime_threads(tvm_threads: str | None, omp_threads: str | None) -> int | None:
    """:func:`runtime_threads` for the environment's current ``tvm_threads`` and ``omp_threads``
    (the cache's key; the child process reads them from the environment it inherits)."""
    code = "import tvm; print(tvm.get_global_func('runtime.NumThreads')())"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
        )
        return max(1, int(out.stdout.split()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        warnings.warn(
            f"cannot ask TVM's runtime for its thread count ({exc}); the cost model assumes every "
            f"core runs (set {SPEEDUP_ENV} to say otherwise)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def parallel_speedup(target: tvm.target.Target) -> float | None:
    """The speedup the model expects of a kernel on all of the target's ``num-cores`` over one
    core: None (linear) unless ``target`` is this machine's CPU and TVM's runtime runs fewer
    threads than that, then the thread count (or what ``FASTSEARCH_PARALLEL_SPEEDUP`` says)."""
    override = os.environ.get(SPEEDUP_ENV, "").strip()
    if override:
        if override.lower() == "linear":
            return None
        try:
            return max(1.0, float(override))
        except ValueError:
            raise ValueError(f"{SPEEDUP_ENV}={override!r}: expected a number or 'linear'") from None
    cores = num_cores(target)
    if str(target.kind.name) != "llvm" or cores < 2:
        return None
    attrs = target.attrs or {}
    if str(attrs.get("mcpu", "")) != host_cpu() or "mtriple" in attrs:
        return None  # another machine's CPU (an RPC device): its runtime is not this one
    threads = runtime_threads()
    return float(threads) if threads is not None and threads < cores else None


@functools.cache
def l2_cache_bytes() -> int:
    """One core's L2 cache on this machine (Linux's sysfs), 1 MiB where it cannot be read."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        try:
            if (index / "level").read_text().strip() != "2" or "Instruction" in (index / "type").read_text():
                continue
            size = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
            return int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return 1 << 20
