"""Target resolution: turn what the user wrote into a :class:`tvm.target.Target`.

``None`` and ``"llvm"`` mean this machine's CPU: an LLVM target with ``mcpu`` set to the host CPU
(without it LLVM emits generic x86-64 code, several times slower) and ``num-cores`` set to the
number of physical cores. A JSON dict (or its text) is handed to TVM; an LLVM target that names
neither ``mcpu`` nor ``mtriple`` gets the host's ``mcpu`` and core count filled in, since it can
only mean this machine.
"""

from __future__ import annotations

import json
import re
from typing import Any, Union

import psutil
import tvm

from fastsearch import _core
from fastsearch.errors import InvalidTarget, UnsupportedTarget

TargetLike = Union[str, dict, tvm.target.Target, None]  # noqa: UP007  (runtime alias, py3.10)

__all__ = [
    "CUDA_ARCH_LIMITS",
    "TargetLike",
    "cuda_limits",
    "device",
    "device_type",
    "has_local_gpu",
    "host_cpu",
    "physical_cores",
    "require_cuda_limits",
    "require_measurable",
    "require_searchable",
    "resolve_target",
    "target_kind",
]


def host_cpu() -> str:
    """The LLVM name of this machine's CPU (e.g. ``"skylake-avx512"``)."""
    return str(tvm.target.codegen.llvm_get_system_cpu())


def physical_cores() -> int:
    """Number of physical cores of this machine (at least 1)."""
    n = psutil.cpu_count(logical=False) or psutil.cpu_count(logical=True) or 1
    return max(1, int(n))


def _host_llvm_config() -> dict[str, Any]:
    return {"kind": "llvm", "mcpu": host_cpu(), "num-cores": physical_cores()}


def _describe(target: Any) -> str:
    if isinstance(target, dict):
        try:
            return json.dumps(target, sort_keys=True)
        except (TypeError, ValueError):
            return repr(target)
    return repr(target)


#: Per-block limits every CUDA architecture from sm_50 on shares (the CUDA programming guide's
#: table of compute capabilities): what a CUDA target dict that names only an ``arch`` gets.
#: The H100 tag (``nvidia/nvidia-h100``) carries the same values.
CUDA_ARCH_LIMITS: dict[str, int] = {
    "max_num_threads": 1024,
    "max_threads_per_block": 1024,
    "max_shared_memory_per_block": 49152,
    "registers_per_block": 65536,
    "thread_warp_size": 32,
}


def _cuda_arch_limits(config: dict[str, Any], original: Any) -> dict[str, Any]:
    """``config`` (a CUDA target dict) with :data:`CUDA_ARCH_LIMITS` filled in where it names an
    ``arch`` (``sm_XY``, optionally ``a``) and leaves a limit out; limits it gives win."""
    arch = config.get("arch")
    if arch is None:
        return config
    match = re.fullmatch(r"sm_(\d+)a?", str(arch))
    if match is None or int(match.group(1)) < 50:
        raise InvalidTarget(
            f"invalid target {_describe(original)}: 'arch' must name a CUDA architecture from "
            f"sm_50 on, such as 'sm_90' or 'sm_90a', got {arch!r}"
        )
    return {**CUDA_ARCH_LIMITS, **config}


def _cuda_device_target() -> tvm.target.Target | None:
    """The target of this machine's CUDA device 0, its arch and limits read from the driver (the
    rest from :data:`CUDA_ARCH_LIMITS`), or None when there is no CUDA device."""
    try:
        dev = tvm.cuda(0)
        if not dev.exist:
            return None
        config = {
            "kind": "cuda",
            "arch": "sm_" + str(dev.compute_version).replace(".", ""),
            "max_threads_per_block": int(dev.max_threads_per_block),
            "max_shared_memory_per_block": int(dev.max_shared_memory_per_block),
            "thread_warp_size": int(dev.warp_size),
        }
    except (RuntimeError, ValueError, AttributeError, OSError):  # no CUDA runtime or driver
        return None
    return _from_config(config, "cuda")


def _from_config(config: dict[str, Any], original: Any) -> tvm.target.Target:
    config = dict(config)
    if config.get("kind") == "cuda":
        config = _cuda_arch_limits(config, original)
    cores = config.get("num-cores")
    if isinstance(cores, int) and not isinstance(cores, bool) and cores < 1:  # TVM accepts any int
        raise InvalidTarget(f"invalid target {_describe(original)}: 'num-cores' must be >= 1, got {cores}")
    if config.get("kind") == "llvm" and "mcpu" not in config and "mtriple" not in config:
        config.setdefault("mcpu", host_cpu())
        config.setdefault("num-cores", physical_cores())
    try:
        return tvm.target.Target(config)
    except Exception as exc:  # TVM raises ValueError / TVMError with the reason
        raise InvalidTarget(f"invalid target {_describe(original)}: {exc}") from exc


def resolve_target(target: TargetLike = None) -> tvm.target.Target:
    """Resolve ``target`` to a :class:`tvm.target.Target`.

    Accepts ``None``/``"llvm"`` (this CPU), a target dict, a JSON string of one, a tag
    (``"nvidia/nvidia-h100"``), a plain kind name (``"c"``), or a ready ``Target`` (returned
    unchanged). ``"cuda"`` is this machine's GPU (arch and limits from the driver) when it has one.
    A CUDA dict that names an ``arch`` gets the per-block limits every architecture from sm_50
    shares (:data:`CUDA_ARCH_LIMITS`) where it leaves them out. Raises
    :class:`fastsearch.InvalidTarget` naming the target when TVM does not accept it.
    """
    if isinstance(target, tvm.target.Target):
        return target
    if target is None:
        return _from_config(_host_llvm_config(), "llvm")
    if isinstance(target, dict):
        if "kind" not in target:
            raise InvalidTarget(f"invalid target {_describe(target)}: a target dict needs a 'kind'")
        return _from_config(target, target)
    if isinstance(target, str):
        text = target.strip()
        if not text:
            raise InvalidTarget("invalid target '': the target is empty")
        if text.startswith("{"):
            try:
                config = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InvalidTarget(f"invalid target {target!r}: not valid JSON ({exc})") from exc
            if not isinstance(config, dict):
                raise InvalidTarget(f"invalid target {target!r}: JSON must be an object")
            if "kind" not in config:
                raise InvalidTarget(f"invalid target {target!r}: a target dict needs a 'kind'")
            return _from_config(config, target)
        if text == "llvm":
            return _from_config(_host_llvm_config(), target)
        if text == "cuda":
            # This machine's GPU, when it has one; otherwise TVM's bare "cuda" (no limits).
            found = _cuda_device_target()
            if found is not None:
                return found
        try:
            return tvm.target.Target(text)
        except Exception as exc:
            raise InvalidTarget(f"invalid target {target!r}: {exc}") from exc
    raise InvalidTarget(
        f"invalid target {target!r}: expected None, a string, a dict or a tvm.target.Target, "
        f"got {type(target).__name__}"
    )


def target_kind(target: tvm.target.Target) -> str:
    """The target's kind name (``"llvm"``, ``"cuda"``, ...)."""
    return str(target.kind.name)


def device_type(target: tvm.target.Target) -> str:
    """The runtime device name for ``target`` (``"cpu"`` for LLVM, ``"cuda"`` for CUDA, ...)."""
    code = int(target.get_target_device_type())
    for dev, name in tvm.runtime.Device._DEVICE_TYPE_TO_NAME.items():
        if int(dev) == code:
            return str(name)
    raise InvalidTarget(f"target {target} has no runtime device (device type {code})")


def device(target: tvm.target.Target) -> tvm.runtime.Device:
    """Device 0 of ``target`` in this process."""
    return tvm.runtime.device(device_type(target), 0)


#: What TVM's GPU schedule rules and VerifyGPUCode read from a CUDA target; a bare ``"cuda"``
#: (sm_50 by default) has none of the memory limits.
CUDA_LIMITS = ("max_threads_per_block", "max_shared_memory_per_block", "thread_warp_size")


def is_gpu(target: tvm.target.Target) -> bool:
    """Whether ``target`` is a GPU (its keys name ``gpu``: CUDA, ROCm, Vulkan, Metal, ...)."""
    return "gpu" in [str(k) for k in target.keys]


def require_cuda_limits(target: tvm.target.Target) -> None:
    """A CUDA target without the limits a GPU search reads is an :class:`InvalidTarget` naming
    them and the ways to give them."""
    missing = [k for k in CUDA_LIMITS if target.attrs.get(k) is None]
    if missing:
        raise InvalidTarget(
            f"invalid target {target}: a CUDA target needs {', '.join(missing)}; use a tag "
            "such as 'nvidia/nvidia-h100', name the architecture "
            '({"kind": "cuda", "arch": "sm_90"}), give the limits in the target dict, or '
            "pass 'cuda' on a machine with a GPU"
        )


def cuda_limits(target: tvm.target.Target) -> _core.GpuTarget:
    """The limits of a CUDA ``target`` as the engine takes them (threads per block, warp size,
    shared memory per block); :class:`InvalidTarget` where the target lacks one, and for a target
    that is not CUDA."""
    if target_kind(target) != "cuda":
        raise InvalidTarget(f"target {target} is not a CUDA target")
    require_cuda_limits(target)
    return _core.GpuTarget(
        max_threads_per_block=int(target.attrs["max_threads_per_block"]),
        warp_size=int(target.attrs["thread_warp_size"]),
        max_shared_memory_per_block=int(target.attrs["max_shared_memory_per_block"]),
    )


def require_searchable(target: tvm.target.Target, what: str) -> None:
    """Refuse, with a typed error, a target fastsearch's search cannot serve, before any work:
    a CUDA target without the limits a GPU search reads is an :class:`InvalidTarget` naming
    them; any GPU target is an :class:`UnsupportedTarget` (fastsearch's sketches, features and
    cost models are CPU-only, and would otherwise hand back CPU schedules). ``what`` names the
    caller in the message."""
    if not is_gpu(target):
        return
    kind = target_kind(target)
    if kind == "cuda":
        require_cuda_limits(target)
    raise UnsupportedTarget(
        f"{what}: fastsearch searches CPU targets (kind 'llvm') only; {kind} target {target} "
        "would get CPU schedules. For a CUDA target, fastsearch tune --build-only checks the GPU "
        "search space without measuring; tune GPU kernels with MetaSchedule "
        "(tvm.s_tir.meta_schedule.tune_tir) meanwhile"
    )


def has_local_gpu(target: tvm.target.Target) -> bool:
    """Whether this machine has device 0 of ``target``'s kind (a CUDA GPU for a CUDA target)."""
    try:
        return bool(device(target).exist)
    except (InvalidTarget, RuntimeError, ValueError, AttributeError, OSError):  # no runtime or driver
        return False


def require_measurable(target: tvm.target.Target, what: str, *, remote: bool) -> None:
    """Refuse, with a typed error and before any work, to tune a GPU target whose candidates
    cannot be measured: with no CUDA GPU here and no RPC runner (``remote`` False), an
    :class:`UnsupportedTarget` naming the two ways to measure and ``--build-only``. A CUDA target
    without its limits is an :class:`InvalidTarget` naming them, a non-CUDA GPU target is refused
    as by :func:`require_searchable`. CPU targets, and CUDA targets a GPU or a runner measures,
    pass."""
    if not is_gpu(target):
        return
    kind = target_kind(target)
    if kind != "cuda":
        require_searchable(target, what)
    require_cuda_limits(target)
    if not remote and not has_local_gpu(target):
        raise UnsupportedTarget(
            f"{what}: measuring candidates for the {kind} target {target} needs a GPU, and this "
            "machine has no CUDA GPU and no RPC runner was given. Measure on a machine with a local "
            "CUDA GPU, or on a remote GPU server through "
            "fastsearch.RPCRunner(tracker='HOST:9190', key='KEY') (the CLI's --rpc-tracker and "
            "--rpc-key; README.md, 'CUDA targets'). To check the GPU search space without "
            "measuring (candidates drawn, verified, built to CUDA and, with nvcc, to cubins): "
            "fastsearch tune --build-only, or fastsearch.tuning.build_only.build_gpu_space(func, target)"
        )
