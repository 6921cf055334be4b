"""fastsearch.measure.cubin: CUDA candidates compiled to sm_90 cubins with nvcc (the ``cuda``
extra's wheel), their resources read from ptxas, and the limits a candidate must keep.

The tests that run nvcc skip when none is found (``pip install '.[cuda]'`` brings it); no GPU is
needed for any of them."""

from __future__ import annotations

import re

import pytest
import tvm
from fastsearch import MalformedInput, MeasurementError, UnsupportedTarget
from fastsearch.ir.tune_context import tune_context
from fastsearch.measure import cubin
from fastsearch.measure.cubin import (
    CubinError,
    CubinReport,
    KernelResources,
    check_limits,
    compile_cubin,
    cuda_source_of,
    find_nvcc,
    parse_ptxas,
)
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

requires_nvcc = pytest.mark.skipif(
    find_nvcc() is None, reason="no nvcc: pip install '.[cuda]' (nvidia-cuda-nvcc)"
)

ELF_MAGIC = b"\x7fELF"

#: 96 live floats per thread under __launch_bounds__(1024, 2): ptxas may give a thread at most 32
#: registers, so it spills.
SPILLING_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(1024, 2) spill_kernel(
    const float* __restrict__ x, float* __restrict__ y, int n) {
  float acc[96];
  #pragma unroll
  for (int i = 0; i < 96; ++i) acc[i] = x[threadIdx.x + i * 1024];
  for (int k = 0; k < n; ++k) {
    #pragma unroll
    for (int i = 0; i < 96; ++i) acc[i] = acc[i] * acc[(i + 1) % 96] + x[k + i];
  }
  float s = 0.f;
  #pragma unroll
  for (int i = 0; i < 96; ++i) s += acc[i] * (float)i;
  y[threadIdx.x] = s;
}
"""


def shared_kernel(floats: int) -> str:
    """A kernel with a static shared array of ``floats`` floats."""
    return f"""
extern "C" __global__ void __launch_bounds__(256) shared_kernel(float* __restrict__ y) {{
  __shared__ float buf[{floats}];
  buf[threadIdx.x] = y[threadIdx.x];
  __syncthreads();
  y[threadIdx.x] = buf[{floats - 1} - threadIdx.x];
}}
"""


def gmm_candidates(seeds=range(1, 13)):
    """GMM:0 (1x128x128x128) scheduled by TVM's own CUDA design space for the H100 tag, its
    decisions drawn anew with each seed, kept where every postprocessor accepts the schedule."""
    func = te_workload.create_te_workload("GMM", 0)
    target = tvm.target.Target("nvidia/nvidia-h100")
    space = ms.space_generator.PostOrderApply(
        sch_rules=ms.schedule_rule.ScheduleRule.create("cuda"),
        postprocs=ms.postproc.Postproc.create("cuda"),
        mutator_probs={},
    )
    ctx = tune_context(func, target, space=space, task_name="GMM_0")
    postprocs = list(ctx.space_generator.postprocs)
    for p in postprocs:
        p._initialize_with_tune_context(ctx)
    kept = []
    for design in ctx.space_generator.generate_design_space(ctx.mod):
        for seed in seeds:
            sch = s_tir.Schedule(ctx.mod, seed=seed)
            s_tir.Trace(design.trace.insts, {}).apply_to_schedule(sch, remove_postproc=False)
            if all(p.apply(sch) for p in postprocs):
                kept.append(sch)
    return target, kept


# ---------------------------------------------------------------------------------------------
# Without nvcc


def test_find_nvcc_falls_back_to_cuda_path_then_path(monkeypatch, tmp_path):
    monkeypatch.setattr(cubin, "_wheel_nvcc", lambda: None)
    toolkit = tmp_path / "toolkit"
    (toolkit / "bin").mkdir(parents=True)
    fake = toolkit / "bin" / "nvcc"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CUDA_PATH", str(toolkit))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert find_nvcc() == str(fake)

    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "nowhere"))
    assert find_nvcc() is None
    monkeypatch.setenv("PATH", str(toolkit / "bin"))
    assert find_nvcc() == str(fake)


def test_missing_nvcc_is_unsupported_target(monkeypatch):
    monkeypatch.setattr(cubin, "find_nvcc", lambda: None)
    with pytest.raises(UnsupportedTarget, match=re.escape("pip install 'fastsearch[cuda]'")):
        compile_cubin(SPILLING_KERNEL)


def test_parse_ptxas_reads_every_entry_function():
    # CUDA 13's format, then CUDA 12's (which also reports constant banks).
    output = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'main_kernel' for 'sm_90a'
ptxas info    : Function properties for main_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 24576 bytes smem
ptxas info    : Compile time = 10.445 ms
ptxas info    : Compiling entry function 'other' for 'sm_90'
ptxas info    : Function properties for other
    784 bytes stack frame, 1492 bytes spill stores, 1128 bytes spill loads
ptxas info    : Used 32 registers, 4096 bytes smem, 368 bytes cmem[0], 8 bytes cmem[2]
"""
    first, second = parse_ptxas(output, {"main_kernel": 256})
    assert first == KernelResources("main_kernel", 80, 0, 0, 24576, 0, 0, 1, 256)
    assert second == KernelResources("other", 32, 1492, 1128, 4096, 784, 376, 0, None)
    assert not first.spills and second.spills


def test_check_limits_classifies_by_kind():
    def report(**fields):
        base = {
            "name": "k",
            "registers": 64,
            "spill_store_bytes": 0,
            "spill_load_bytes": 0,
            "shared_bytes": 0,
            "stack_bytes": 0,
        }
        return CubinReport("sm_90", (KernelResources(**{**base, **fields}),), ELF_MAGIC, 0.0)

    assert check_limits(report()) is None
    assert check_limits(report(spill_store_bytes=4)) == "spill"
    assert check_limits(report(spill_load_bytes=4, shared_bytes=1 << 20)) == "spill"
    assert check_limits(report(shared_bytes=49153)) == "shared_memory"
    assert check_limits(report(shared_bytes=49152)) is None
    assert check_limits(report(registers=200), max_registers_per_thread=128) == "registers"
    # 64 registers x 1024 threads fill the 65,536 registers of a block; 72 (rounded to 72 by the
    # warp's 256-register granularity) do not fit.
    assert check_limits(report(registers=64), threads_per_block=1024) is None
    assert check_limits(report(registers=72), threads_per_block=1024) == "registers"
    assert check_limits(report(registers=72, launch_bound=1024)) == "registers"
    assert check_limits(report(registers=72, launch_bound=1024), threads_per_block=512) is None


def test_cuda_source_of_a_cpu_module_is_malformed_input():
    func = te_workload.create_te_workload("GMM", 0)
    rt_mod = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    with pytest.raises(MalformedInput, match="no CUDA source"):
        cuda_source_of(rt_mod)


# ---------------------------------------------------------------------------------------------
# With nvcc


@requires_nvcc
@pytest.mark.tuning
def test_gmm_candidates_from_tvms_cuda_space_compile_to_sm90_cubins():
    target, candidates = gmm_candidates()
    # Seeds 1 to 12 keep 7 candidates of the 3 design spaces (the rest fail VerifyGPUCode).
    assert len(candidates) >= 3
    arch = str(target.attrs["arch"])
    assert arch == "sm_90a"
    for sch in candidates:
        source = cuda_source_of(tvm.compile(sch.mod, target=target))
        report = compile_cubin(source, arch)
        assert report.arch == arch
        assert report.cubin.startswith(ELF_MAGIC)
        assert report.seconds > 0
        globals_in_source = set(
            re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)", source)
        )
        assert {k.name for k in report.kernels} == globals_in_source
        for kernel in report.kernels:
            assert 0 < kernel.registers <= 255
            assert kernel.launch_bound is not None and kernel.launch_bound > 0
            assert kernel.shared_bytes <= 49152
        # VerifyGPUCode kept only what fits the H100 tag's block; none of these spill.
        assert (
            check_limits(
                report,
                registers_per_block=int(target.attrs["registers_per_block"]),
                max_shared_bytes=int(target.attrs["max_shared_memory_per_block"]),
            )
            is None
        )


@requires_nvcc
def test_a_spilling_kernel_is_reported_and_classified_spill():
    report = compile_cubin(SPILLING_KERNEL, "sm_90")
    (kernel,) = report.kernels
    assert kernel.name == "spill_kernel" and kernel.launch_bound == 1024
    # Measured with nvcc 13.5: 32 registers, 1492 bytes of spill stores, 1128 of spill loads.
    assert kernel.registers <= 32
    assert kernel.spill_store_bytes > 0 and kernel.spill_load_bytes > 0
    assert kernel.stack_bytes > 0
    assert report.spills and check_limits(report) == "spill"
    assert report.cubin.startswith(ELF_MAGIC)
    # Without the launch bound's pressure the same loop fits in registers.
    relaxed = compile_cubin(SPILLING_KERNEL.replace("__launch_bounds__(1024, 2)", ""), "sm_90")
    assert not relaxed.spills and relaxed.kernels[0].registers > 32
    assert check_limits(relaxed) is None


@requires_nvcc
def test_static_shared_memory_past_48_kib_is_refused_by_ptxas():
    fits = compile_cubin(shared_kernel(12288), "sm_90")  # 48 KiB exactly
    assert fits.kernels[0].shared_bytes == 49152
    assert check_limits(fits) is None
    # A target that gives a block less shared memory than the kernel declares.
    assert check_limits(fits, max_shared_bytes=32768) == "shared_memory"

    with pytest.raises(CubinError, match="too much shared data") as info:
        compile_cubin(shared_kernel(12289), "sm_90")  # 4 bytes more: ptxas refuses it
    assert info.value.kind == "shared_memory"
    assert isinstance(info.value, MeasurementError)


def test_an_nvcc_that_cannot_run_is_a_cubin_error(tmp_path):
    not_executable = tmp_path / "nvcc"
    not_executable.write_text("")
    with pytest.raises(CubinError, match="cannot run") as info:
        compile_cubin(SPILLING_KERNEL, nvcc=str(not_executable))
    assert info.value.kind == "error"


@requires_nvcc
def test_nvcc_errors_and_timeouts_are_typed():
    with pytest.raises(CubinError, match="error") as info:
        compile_cubin('extern "C" __global__ void broken(float* y) { y[0] = undeclared; }')
    assert info.value.kind == "error"
    assert "undeclared" in str(info.value)

    with pytest.raises(CubinError, match="timeout") as info:
        compile_cubin(SPILLING_KERNEL, timeout_s=0.001)
    assert info.value.kind == "timeout"
