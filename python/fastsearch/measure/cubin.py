"""CUDA candidates compiled down to the metal: ``nvcc --cubin`` for one architecture (sm_90 by
default), with ptxas's per-kernel resource usage read from its verbose output.

No GPU is needed: a candidate built by ``tvm.compile(..., target=<a CUDA target>)`` holds its CUDA
C++ source (:func:`cuda_source_of`), and :func:`compile_cubin` hands it to nvcc with the flags
TVM's own nvcc path uses. nvcc comes from the ``nvidia-cuda-nvcc`` wheel of the ``cuda`` extra
(``pip install 'fastsearch[cuda]'``), from ``$CUDA_PATH/bin`` or from ``PATH``
(:func:`find_nvcc`); it needs a host C++ compiler on ``PATH`` for its preprocessing.

A candidate that spills registers to local memory, or that needs more registers or shared memory
per block than the target has, is a failed build by kind (:func:`check_limits`). ptxas itself
rejects more than 48 KiB of static shared memory: :func:`compile_cubin` raises :class:`CubinError`
with ``kind == "shared_memory"`` for that.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastsearch.errors import MalformedInput, MeasurementError, UnsupportedTarget

__all__ = [
    "NVCC_WHEELS",
    "CompileFailure",
    "CubinError",
    "CubinReport",
    "KernelResources",
    "ResourceFailure",
    "check_limits",
    "compile_cubin",
    "cuda_source_of",
    "find_nvcc",
    "nvcc_flags",
    "parse_ptxas",
]

#: Why a compiled candidate fails: it spills registers to local memory, or needs more registers or
#: more shared memory than the target gives a thread or a block.
ResourceFailure = Literal["spill", "registers", "shared_memory"]

#: Why :func:`compile_cubin` failed (:attr:`CubinError.kind`): ptxas refused a kernel's static
#: shared memory, nvcc failed otherwise, or it ran past its timeout.
CompileFailure = Literal["shared_memory", "error", "timeout"]

#: Distributions that ship nvcc, newest layout first (``nvidia/cu13/bin/nvcc`` for CUDA 13,
#: ``nvidia/cuda_nvcc/bin/nvcc`` for CUDA 12's ``-cu12`` wheel).
NVCC_WHEELS = ("nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12")

_INSTALL_HINT = "pip install 'fastsearch[cuda]' (or put a CUDA toolkit's bin on PATH, or set CUDA_PATH)"


class CubinError(MeasurementError):
    """nvcc or ptxas failed on a candidate; ``kind`` says how, ``output`` holds nvcc's output."""

    def __init__(self, message: str, kind: CompileFailure, output: str = "") -> None:
        super().__init__(message)
        self.kind: CompileFailure = kind
        self.output = output


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one entry function (``name`` as ptxas spells it: TVM's kernels are
    ``extern "C"``, so unmangled). ``shared_bytes`` is static shared memory only: dynamic shared
    memory is sized at launch. ``constant_bytes`` sums the ``cmem[...]`` banks where ptxas reports
    them (CUDA 13's ptxas does not). ``launch_bound`` is the kernel's ``__launch_bounds__`` maximum
    threads per block, read from the source, or None."""

    name: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    shared_bytes: int
    stack_bytes: int
    constant_bytes: int = 0
    barriers: int = 0
    launch_bound: int | None = None

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


@dataclass(frozen=True)
class CubinReport:
    """A compiled cubin (an ELF image), its kernels' resources and nvcc's wall-clock seconds."""

    arch: str
    kernels: tuple[KernelResources, ...]
    cubin: bytes
    seconds: float
    nvcc_output: str = ""

    @property
    def spills(self) -> bool:
        """Whether any kernel spills registers to local memory."""
        return any(k.spills for k in self.kernels)

    def kernel(self, name: str) -> KernelResources:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)


def _wheel_nvcc() -> str | None:
    for dist_name in NVCC_WHEELS:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for file in dist.files or ():
            if file.name == "nvcc" and file.parent.name == "bin":
                path = Path(str(dist.locate_file(file)))
                if path.is_file() and os.access(path, os.X_OK):
                    return str(path)
    return None


def find_nvcc() -> str | None:
    """The nvcc to use: the ``nvidia-cuda-nvcc`` wheel's (the ``cuda`` extra), else
    ``$CUDA_PATH/bin/nvcc`` (the variable TVM reads), else the first on ``PATH``; None if none."""
    found = _wheel_nvcc()
    if found is not None:
        return found
    cuda_path = os.environ.get("CUDA_PATH")
    if cuda_path:
        candidate = Path(cuda_path) / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("nvcc")


def nvcc_flags(arch: str) -> list[str]:
    """nvcc's flags for one cubin: those of TVM's nvcc path (``tvm.support.nvcc``: -O3, half and
    bfloat16 operators, relaxed constexpr, extended lambdas, fast math, ptxas's register usage
    level 10 and its verbose report)."""
    return [
        "--cubin",
        f"-arch={arch}",
        "-O3",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT162_OPERATORS__",
        "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "--use_fast_math",
        "--ptxas-options=-v,--register-usage-level=10,--warn-on-local-memory-usage",
    ]


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_BARRIERS = re.compile(r"used (\d+) barriers")
_LAUNCH_BOUNDS = re.compile(r"__global__\s+void\s+__launch_bounds__\(\s*(\d+)[^)]*\)\s+(\w+)\s*\(")
_TOO_MUCH_SHARED = re.compile(r"uses too much shared data")


def parse_ptxas(output: str, launch_bounds: dict[str, int] | None = None) -> tuple[KernelResources, ...]:
    """Each entry function's resources from ptxas's ``-v`` output (in its order)."""
    bounds = launch_bounds or {}
    kernels: list[KernelResources] = []
    fields: dict[str, Any] | None = None

    def close() -> None:
        if fields is not None:
            kernels.append(KernelResources(**fields, launch_bound=bounds.get(fields["name"])))

    for line in output.splitlines():
        if m := _ENTRY.search(line):
            close()
            fields = {
                "name": m.group(1),
                "registers": 0,
                "spill_store_bytes": 0,
                "spill_load_bytes": 0,
                "shared_bytes": 0,
                "stack_bytes": 0,
            }
        elif fields is None:
            continue
        elif m := _PROPERTIES.search(line):
            fields["stack_bytes"], fields["spill_store_bytes"], fields["spill_load_bytes"] = map(
                int, m.groups()
            )
        elif m := _USED.search(line):
            fields["registers"] = int(m.group(1))
            smem = _SMEM.search(line)
            fields["shared_bytes"] = int(smem.group(1)) if smem else 0
            fields["constant_bytes"] = sum(int(c) for c in _CMEM.findall(line))
            barriers = _BARRIERS.search(line)
            fields["barriers"] = int(barriers.group(1)) if barriers else 0
    close()
    return tuple(kernels)


def _run(cmd: list[str], cwd: str, timeout_s: float) -> tuple[int, str]:
    """Run ``cmd`` in its own process group (nvcc starts cicc and ptxas), killed whole on timeout."""
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    except OSError as exc:
        raise CubinError(f"cannot run {cmd[0]}: {exc}", "error") from exc
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise CubinError(f"nvcc ran past its timeout of {timeout_s:g} s", "timeout", out or "") from None
    return proc.returncode, out


def _failure(output: str) -> CompileFailure:
    return "shared_memory" if _TOO_MUCH_SHARED.search(output) else "error"


def compile_cubin(
    cuda_source: str,
    arch: str = "sm_90",
    *,
    options: Sequence[str] = (),
    timeout_s: float = 120.0,
    nvcc: str | None = None,
) -> CubinReport:
    """Compile ``cuda_source`` to a cubin for ``arch`` (``"sm_90"``, ``"sm_90a"``, ...) with
    :func:`nvcc_flags` and ``options``, in a temporary directory, and read each kernel's resources
    from ptxas's report.

    Raises :class:`~fastsearch.UnsupportedTarget` when no nvcc is found (``nvcc=None`` looks with
    :func:`find_nvcc`), :class:`CubinError` (a :class:`~fastsearch.MeasurementError`) when nvcc
    fails or runs past ``timeout_s``, with the end of its output in the message."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise UnsupportedTarget(f"compiling CUDA to a cubin needs nvcc, and none was found: {_INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="fastsearch-cubin-") as tmp:
        Path(tmp, "kernels.cu").write_text(cuda_source)
        cmd = [nvcc, *nvcc_flags(arch), *options, "-o", "kernels.cubin", "kernels.cu"]
        start = time.perf_counter()
        returncode, output = _run(cmd, tmp, timeout_s)
        seconds = time.perf_counter() - start
        cubin_path = Path(tmp, "kernels.cubin")
        if returncode != 0 or not cubin_path.is_file():
            errors = [line for line in output.splitlines() if "error" in line.lower()]
            detail = "\n".join(errors[-10:]) or output[-2000:]
            raise CubinError(
                f"nvcc --cubin -arch={arch} failed (exit {returncode}):\n{detail}", _failure(output), output
            )
        cubin = cubin_path.read_bytes()
    bounds = {name: int(n) for n, name in _LAUNCH_BOUNDS.findall(cuda_source)}
    return CubinReport(arch, parse_ptxas(output, bounds), cubin, seconds, output)


def _registers_per_block(registers: int, threads: int, warp_size: int = 32) -> int:
    """Registers a block takes: each warp's allocation rounded up to 256 registers."""
    per_warp = -(-registers * warp_size // 256) * 256
    return per_warp * -(-threads // warp_size)


def check_limits(
    report: CubinReport,
    *,
    max_registers_per_thread: int = 255,
    max_shared_bytes: int = 49152,
    threads_per_block: int | None = None,
    registers_per_block: int = 65536,
) -> ResourceFailure | None:
    """None when every kernel of ``report`` fits, else why one does not: ``"spill"`` (it spills
    registers to local memory), ``"registers"`` (more than ``max_registers_per_thread`` a thread,
    or more than ``registers_per_block`` for a block of ``threads_per_block`` threads, or of its
    ``__launch_bounds__`` when that is None), ``"shared_memory"`` (more static shared memory than
    ``max_shared_bytes``). The defaults are sm_90's (and the ``nvidia/nvidia-h100`` tag's
    ``max_shared_memory_per_block``); a target's ``registers_per_block`` and
    ``max_shared_memory_per_block`` can be passed as they are."""
    for kernel in report.kernels:
        if kernel.spills:
            return "spill"
    for kernel in report.kernels:
        threads = threads_per_block if threads_per_block is not None else kernel.launch_bound
        if kernel.registers > max_registers_per_thread:
            return "registers"
        if threads is not None and _registers_per_block(kernel.registers, threads) > registers_per_block:
            return "registers"
    for kernel in report.kernels:
        if kernel.shared_bytes > max_shared_bytes:
            return "shared_memory"
    return None


def _cuda_modules(mod: Any) -> list[Any]:
    found = [mod] if mod.kind == "cuda" else []
    for imported in mod.imports:
        found.extend(_cuda_modules(imported))
    return found


def cuda_source_of(rt_mod: Any) -> str:
    """The CUDA C++ source of a module built by ``tvm.compile(..., target=<a CUDA target>)`` (a
    ``tvm.runtime.Executable`` or a ``tvm.runtime.Module``): its imported ``cuda`` modules'
    source, joined. Raises :class:`~fastsearch.MalformedInput` when it holds no CUDA module."""
    mod = getattr(rt_mod, "mod", rt_mod)
    sources = [m.inspect_source("cuda") for m in _cuda_modules(mod)]
    sources = [s for s in sources if s]
    if not sources:
        raise MalformedInput(
            f"the module (kind {mod.kind!r}) holds no CUDA source: build it for a CUDA target"
        )
    return "\n".join(sources)
