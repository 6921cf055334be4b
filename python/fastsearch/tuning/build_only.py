"""``fastsearch tune --build-only``: a GPU search space checked without a GPU and without
measuring anything.

For each task (a PrimFunc, or each PrimFunc of an IRModule), :func:`build_gpu_space` draws ``n``
of fastsearch's GPU sketch candidates for a CUDA target, verifies them with the engine's
VerifyGPUCode (``_core.Program.verify_gpu``) and with TVM's own CUDA postprocessors (VerifyGPUCode
last), builds each one TVM's postprocessors accept through TVM (``tvm.compile``) to CUDA source
(so a candidate the two verdicts disagree on is judged by nvcc too) and, when nvcc is found
(the ``cuda`` extra), compiles that source to a cubin for the target's architecture, reading
each kernel's registers, spills and shared memory from ptxas. A candidate that does not build,
that nvcc refuses, that spills or that breaks a limit of the target is a failed build, by kind.
Without nvcc the candidates are still drawn, verified and built to source, and the report says
the cubins were skipped and how to get them.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm.s_tir import Schedule

from fastsearch import _core
from fastsearch.errors import UnsupportedTarget, UnsupportedWorkload
from fastsearch.ir.target import (
    TargetLike,
    cuda_limits,
    is_gpu,
    physical_cores,
    resolve_target,
    target_kind,
)
from fastsearch.ir.tir_import import program_json
from fastsearch.measure import cubin
from fastsearch.measure.cubin import CubinError, CubinReport, KernelResources, check_limits, cuda_source_of
from fastsearch.search.sample import Postprocessor, base_schedule, replay

__all__ = [
    "BUILD_FAILURES",
    "BuildOnlyReport",
    "CandidateBuild",
    "TaskBuildReport",
    "build_gpu_space",
    "cuda_target",
    "describe_cuda_target",
    "gpu_tasks",
]

#: Why a valid candidate is a failed build: TVM's postprocessors refuse what the engine passed
#: (``"postproc"``), ``tvm.compile`` fails (``"build"``), nvcc fails (``"nvcc"``) or runs past its
#: timeout (``"timeout"``), the cubin spills registers (``"spill"``), or it needs more registers
#: or shared memory than the target gives a block (``"registers"``, ``"shared_memory"``).
BUILD_FAILURES = ("postproc", "build", "nvcc", "timeout", "spill", "registers", "shared_memory")

_INSTALL_HINT = "pip install 'fastsearch[cuda]' (NVIDIA's nvcc wheel), or put a CUDA toolkit's bin on PATH"


@dataclass
class CandidateBuild:
    """One candidate: its trace (MetaSchedule JSON), the engine's VerifyGPUCode verdict
    (``engine_error``, None when valid), TVM's postprocessors' verdict (``tvm_rejected_by``: the
    postprocessor that refused it, None when all accept it), and for a candidate TVM accepts what
    its build gave: the kernels' resources when compiled, or the failure kind and message (a
    candidate the engine passes and TVM refuses is a failed build of kind ``"postproc"``)."""

    trace: str
    engine_error: str | None
    tvm_rejected_by: str | None
    built: bool = False
    kernels: tuple[KernelResources, ...] = ()
    failure: str | None = None
    message: str = ""
    build_s: float | None = None
    nvcc_s: float | None = None

    @property
    def valid(self) -> bool:
        """Valid by the engine's VerifyGPUCode (what is built is what TVM's postprocessors accept)."""
        return self.engine_error is None

    @property
    def compiled(self) -> bool:
        """Whether nvcc produced a cubin (it may still be a failed build: spills, limits)."""
        return bool(self.kernels)

    @property
    def registers(self) -> int | None:
        """The most registers a thread of any of its kernels takes, once compiled."""
        return max(k.registers for k in self.kernels) if self.kernels else None

    @property
    def shared_bytes(self) -> int | None:
        """The most static shared memory of any of its kernels, once compiled."""
        return max(k.shared_bytes for k in self.kernels) if self.kernels else None

    @property
    def spills(self) -> bool:
        return any(k.spills for k in self.kernels)

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "engine_error": self.engine_error,
            "tvm_rejected_by": self.tvm_rejected_by,
            "built": self.built,
            "failure": self.failure,
            "message": self.message,
            "build_s": self.build_s,
            "nvcc_s": self.nvcc_s,
            "kernels": [k.__dict__ for k in self.kernels],
        }


def _spread(values: Sequence[float]) -> tuple[float, float, float] | None:
    return (min(values), statistics.median(values), max(values)) if values else None


@dataclass
class TaskBuildReport:
    """What one task's candidates gave (:class:`CandidateBuild` each, in drawing order)."""

    name: str
    requested: int
    candidates: list[CandidateBuild] = field(default_factory=list)

    @property
    def sampled(self) -> int:
        return len(self.candidates)

    @property
    def valid(self) -> int:
        return sum(c.valid for c in self.candidates)

    @property
    def tvm_valid(self) -> int:
        return sum(c.tvm_rejected_by is None for c in self.candidates)

    @property
    def disagreements(self) -> int:
        """Candidates the engine's verdict and TVM's postprocessors judge differently."""
        return sum(c.valid != (c.tvm_rejected_by is None) for c in self.candidates)

    @property
    def built(self) -> int:
        return sum(c.built for c in self.candidates)

    @property
    def compiled(self) -> int:
        return sum(c.compiled for c in self.candidates)

    @property
    def failures(self) -> dict[str, int]:
        return dict(Counter(c.failure for c in self.candidates if c.failure is not None))

    @property
    def registers(self) -> tuple[float, float, float] | None:
        """(min, median, max) registers per thread over the compiled candidates."""
        return _spread([c.registers for c in self.candidates if c.registers is not None])

    @property
    def shared_bytes(self) -> tuple[float, float, float] | None:
        return _spread([c.shared_bytes for c in self.candidates if c.shared_bytes is not None])

    @property
    def spilled(self) -> int:
        return sum(c.spills for c in self.candidates)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requested": self.requested,
            "sampled": self.sampled,
            "valid": self.valid,
            "tvm_valid": self.tvm_valid,
            "disagreements": self.disagreements,
            "built": self.built,
            "compiled": self.compiled,
            "spilled": self.spilled,
            "failures": self.failures,
            "registers": self.registers,
            "shared_bytes": self.shared_bytes,
            "candidates": [c.to_json() for c in self.candidates],
        }


@dataclass
class BuildOnlyReport:
    """What :func:`build_gpu_space` found: per task, and over all tasks (``target`` described in
    a few words, ``arch`` the cubins'). ``cubins_skipped`` says
    why no cubin was compiled (no nvcc, or ``cubins=False``), None when they were."""

    target: str
    arch: str
    tasks: dict[str, TaskBuildReport]
    cubins_skipped: str | None
    seconds: dict[str, float]

    def _candidates(self) -> list[CandidateBuild]:
        return [c for t in self.tasks.values() for c in t.candidates]

    @property
    def sampled(self) -> int:
        return len(self._candidates())

    @property
    def valid(self) -> int:
        return sum(c.valid for c in self._candidates())

    @property
    def compiled(self) -> int:
        return sum(c.compiled for c in self._candidates())

    @property
    def failures(self) -> dict[str, int]:
        return dict(Counter(c.failure for c in self._candidates() if c.failure is not None))

    def summary(self) -> str:
        """The report the CLI prints: a few lines per task, then the totals and the time spent."""
        lines = [f"build only   {self.target}: nothing is measured"]
        if self.cubins_skipped:
            lines.append(f"cubins       skipped: {self.cubins_skipped}")
        else:
            lines.append(f"cubins       nvcc --cubin -arch={self.arch}, resources from ptxas")
        for t in self.tasks.values():
            lines.extend(_task_lines(t, self.cubins_skipped is None))
        if len(self.tasks) > 1:
            failed = sum(self.failures.values())
            lines.append(
                f"total        {self.valid}/{self.sampled} valid, {self.compiled} compiled, "
                f"{failed} failed builds"
            )
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items() if k != "total")
        lines.append(f"time (s)     total {self.seconds.get('total', 0.0):.1f}: {parts}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "arch": self.arch,
            "cubins_skipped": self.cubins_skipped,
            "seconds": self.seconds,
            "tasks": {name: t.to_json() for name, t in self.tasks.items()},
        }


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "0/0"


def _task_lines(t: TaskBuildReport, cubins: bool) -> list[str]:
    drawn = f"{t.sampled} drawn" + (
        f" (of {t.requested} asked; the space has no more)" if t.sampled < t.requested else ""
    )
    lines = [
        f"task         {t.name}: {drawn}, valid {_share(t.valid, t.sampled)} (engine's VerifyGPUCode), "
        f"TVM's CUDA postprocessors pass {_share(t.tvm_valid, t.sampled)}"
        + (f", {t.disagreements} judged differently" if t.disagreements else ""),
        f"  built      {t.built} of {t.tvm_valid} TVM passes to CUDA source"
        + (f", {t.compiled} compiled to cubins" if cubins else ""),
    ]
    regs, smem = t.registers, t.shared_bytes
    if regs is not None and smem is not None:
        lines.append(
            f"  registers  {regs[0]:.0f}/{regs[1]:.0f}/{regs[2]:.0f} per thread (min/median/max); "
            f"spills {_share(t.spilled, t.compiled)}; shared memory "
            f"{smem[0] / 1024:.1f}/{smem[1] / 1024:.1f}/{smem[2] / 1024:.1f} KiB"
        )
    if t.failures:
        lines.append("  failed     " + ", ".join(f"{k} {n}" for k, n in sorted(t.failures.items())))
        first = next(c for c in t.candidates if c.failure is not None)
        text = " ".join(first.message.split())
        lines.append(f"    {first.failure}: {text[:300]}{' ...' if len(text) > 300 else ''}")
    return lines


def gpu_tasks(mod: tvm.tirx.PrimFunc | tvm.IRModule, name: str | None = None) -> dict[str, tvm.tirx.PrimFunc]:
    """The tasks of ``mod``: a PrimFunc (named ``name`` or ``main``), or each PrimFunc of an
    IRModule of PrimFuncs. A Relax model is an :class:`UnsupportedWorkload` for now."""
    if isinstance(mod, tvm.tirx.PrimFunc):
        return {name or "main": mod}
    if isinstance(mod, tvm.IRModule):
        funcs = {gv.name_hint: f for gv, f in mod.functions.items()}
        others = [n for n, f in funcs.items() if not isinstance(f, tvm.tirx.PrimFunc)]
        if others:
            raise UnsupportedWorkload(
                "build-only takes a PrimFunc or an IRModule of PrimFuncs; this module also holds "
                f"{', '.join(sorted(others))} (a Relax model's tasks are not extracted for GPUs yet)"
            )
        return {n: funcs[n] for n in sorted(funcs)}
    raise UnsupportedWorkload(
        f"build-only takes a tvm.tirx.PrimFunc or an IRModule of PrimFuncs, got {type(mod).__name__}"
    )


def cuda_target(target: TargetLike) -> tvm.target.Target:
    """``target`` resolved, when it is a CUDA target with its limits: else
    :class:`~fastsearch.UnsupportedTarget` (not CUDA) or :class:`~fastsearch.InvalidTarget`
    (limits missing)."""
    resolved = resolve_target(target)
    if target_kind(resolved) != "cuda":
        what = f"{target_kind(resolved)} GPU" if is_gpu(resolved) else "CPU"
        raise UnsupportedTarget(
            f"build-only checks a CUDA search space; {resolved} is a {what} target "
            "(give a CUDA target such as 'nvidia/nvidia-h100' or {'kind': 'cuda', 'arch': 'sm_90'})"
        )
    cuda_limits(resolved)  # InvalidTarget naming the limits a CUDA target lacks
    return resolved


def describe_cuda_target(target: tvm.target.Target) -> str:
    """A CUDA target in a few words: its arch and the per-block limits the search reads."""
    attrs = target.attrs
    return (
        f"cuda {attrs.get('arch', '?')} ({int(attrs['max_threads_per_block'])} threads, "
        f"{int(attrs['max_shared_memory_per_block']) / 1024:g} KiB shared memory, "
        f"{int(attrs.get('registers_per_block', 65536))} registers per block)"
    )


def _tvm_verdict(base: Schedule, trace: str, post: Postprocessor) -> tuple[Schedule | None, str | None]:
    """The candidate replayed by TVM and postprocessed, or None and the postprocessor (or
    ``"replay"``) that refused it."""
    post.rejected_by = None
    sch = replay(base, trace, post)
    if sch is None:
        return None, post.rejected_by or "replay"
    return sch, None


def _limits_of(target: tvm.target.Target) -> dict[str, int]:
    attrs = target.attrs
    return {
        "registers_per_block": int(attrs.get("registers_per_block", 65536)),
        "max_shared_bytes": int(attrs["max_shared_memory_per_block"]),
    }


def _finish_cubin(cand: CandidateBuild, job: Future[CubinReport], limits: dict[str, int]) -> None:
    try:
        report = job.result()
    except CubinError as exc:
        cand.failure = {"error": "nvcc", "timeout": "timeout", "shared_memory": "shared_memory"}[exc.kind]
        cand.message = str(exc)
        return
    cand.kernels = report.kernels
    cand.nvcc_s = report.seconds
    kind = check_limits(report, **limits)
    if kind is not None:
        cand.failure = kind
        worst = max(report.kernels, key=lambda k: (k.spill_store_bytes + k.spill_load_bytes, k.registers))
        cand.message = (
            f"{worst.name}: {worst.registers} registers, {worst.spill_store_bytes} bytes spill stores, "
            f"{worst.spill_load_bytes} bytes spill loads, {worst.shared_bytes} bytes shared memory"
        )


def _build_task(
    name: str,
    func: tvm.tirx.PrimFunc,
    target: tvm.target.Target,
    n: int,
    seed: int,
    compile_one: Callable[[str], Future[CubinReport]] | None,
    seconds: dict[str, float],
) -> tuple[TaskBuildReport, list[tuple[CandidateBuild, Future[CubinReport]]]]:
    gpu = cuda_limits(target)
    start = time.perf_counter()
    program = _core.Program(program_json(func))
    traces = program.sample_gpu_sketches(gpu, n, seed)
    verdicts = program.verify_gpu(traces, gpu=gpu)
    seconds["sample"] += time.perf_counter() - start
    report = TaskBuildReport(name, n)
    jobs: list[tuple[CandidateBuild, Future[CubinReport]]] = []
    post = Postprocessor(func, target)
    base = base_schedule(func)
    for trace, verdict in zip(traces, verdicts):
        start = time.perf_counter()
        sch, rejected_by = _tvm_verdict(base, trace, post)
        seconds["postproc"] += time.perf_counter() - start
        cand = CandidateBuild(trace, verdict, rejected_by)
        report.candidates.append(cand)
        # Built: what TVM's postprocessors accept (TVM builds only those), the engine's verdict
        # aside, so that nvcc judges a candidate the two verdicts disagree on.
        if sch is None:
            if cand.valid:
                cand.failure, cand.message = (
                    "postproc",
                    f"TVM's {rejected_by} refused a candidate the engine passed",
                )
            continue
        start = time.perf_counter()
        try:
            source = cuda_source_of(tvm.compile(sch.mod, target=target))
        except Exception as exc:  # noqa: BLE001  (TVM raises assorted errors from its passes)
            cand.failure, cand.message = "build", f"{type(exc).__name__}: {exc}"
            continue
        finally:
            cand.build_s = time.perf_counter() - start
            seconds["build"] += cand.build_s
        cand.built = True
        if compile_one is not None:
            jobs.append((cand, compile_one(source)))
    return report, jobs


def build_gpu_space(
    mod: tvm.tirx.PrimFunc | tvm.IRModule,
    target: TargetLike,
    n: int = 16,
    seed: int = 0,
    *,
    name: str | None = None,
    arch: str | None = None,
    cubins: bool = True,
    workers: int | None = None,
    nvcc_timeout_s: float = 120.0,
) -> BuildOnlyReport:
    """Draw ``n`` of fastsearch's GPU sketch candidates per task of ``mod`` for the CUDA
    ``target``, verify them, build the valid ones to CUDA source and (``cubins`` and nvcc found)
    compile each to a cubin for ``arch`` (default: the target's ``arch``), on ``workers``
    parallel nvcc processes (default: the physical cores). Nothing is measured; no GPU is needed.

    Raises :class:`~fastsearch.UnsupportedTarget` for a target that is not CUDA,
    :class:`~fastsearch.InvalidTarget` for a CUDA target without its limits, and
    :class:`~fastsearch.UnsupportedWorkload` for a module that is not PrimFuncs."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    resolved = cuda_target(target)
    tasks = gpu_tasks(mod, name)
    arch = arch or str(resolved.attrs.get("arch", "sm_90"))
    nvcc = cubin.find_nvcc() if cubins else None
    skipped = None
    if not cubins:
        skipped = "not asked for (cubins=False, --no-cubins)"
    elif nvcc is None:
        skipped = f"no nvcc found; to compile cubins: {_INSTALL_HINT}"
    seconds = {"sample": 0.0, "postproc": 0.0, "build": 0.0, "nvcc wait": 0.0}
    limits = _limits_of(resolved)
    start = time.perf_counter()
    reports: dict[str, TaskBuildReport] = {}
    with ThreadPoolExecutor(max_workers=workers or physical_cores()) as pool:
        compile_one = None
        if nvcc is not None:

            def compile_one(source: str) -> Future[CubinReport]:
                return pool.submit(cubin.compile_cubin, source, arch, timeout_s=nvcc_timeout_s, nvcc=nvcc)

        pending = []
        for task_name, func in tasks.items():
            reports[task_name], jobs = _build_task(task_name, func, resolved, n, seed, compile_one, seconds)
            pending.extend(jobs)
        wait_start = time.perf_counter()
        for cand, job in pending:
            _finish_cubin(cand, job, limits)
        seconds["nvcc wait"] += time.perf_counter() - wait_start
    # nvcc's own seconds, summed over the parallel workers (they overlap the builds).
    seconds["nvcc"] = sum(c.nvcc_s or 0.0 for r in reports.values() for c in r.candidates)
    seconds["total"] = time.perf_counter() - start
    return BuildOnlyReport(describe_cuda_target(resolved), arch, reports, skipped, seconds)
