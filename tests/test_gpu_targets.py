"""GPU targets are refused with typed errors before any work, never served CPU schedules.

fastsearch's sketches, features and cost models are CPU-only for now. A well-formed GPU target
is an ``UnsupportedTarget``; a CUDA target without the limits a GPU search reads (a bare
``"cuda"``) is an ``InvalidTarget`` naming them. No GPU is needed: TVM builds these targets
anywhere.
"""

from __future__ import annotations

import pytest
import tvm
from fastsearch import InvalidTarget, UnsupportedTarget, extract_features, sample, tune
from fastsearch.cli.main import main
from fastsearch.ir.target import CUDA_LIMITS, is_gpu, require_searchable, resolve_target
from fastsearch.ir.tune_context import tune_context
from fastsearch.metaschedule import SearchStrategy, store_features
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from workloads import small

H100 = "nvidia/nvidia-h100"
SM75 = {"kind": "cuda", "arch": "sm_75", "max_threads_per_block": 1024,
        "max_shared_memory_per_block": 49152, "thread_warp_size": 32}  # fmt: skip


@pytest.mark.parametrize("spec", [H100, SM75, {"kind": "vulkan"}])
def test_well_formed_gpu_targets_are_unsupported(spec):
    target = resolve_target(spec)
    assert is_gpu(target)
    with pytest.raises(UnsupportedTarget, match=r"fastsearch.sample: .*CPU targets .* MetaSchedule"):
        sample(small("GMM"), spec, n=2)


@pytest.mark.parametrize("spec", ["cuda", {"kind": "cuda", "arch": "sm_75"}])
def test_a_cuda_target_without_its_limits_names_them(spec):
    with pytest.raises(InvalidTarget) as info:
        require_searchable(resolve_target(spec), "check")
    for limit in ("max_threads_per_block", "max_shared_memory_per_block"):
        assert limit in str(info.value)
    assert set(CUDA_LIMITS) >= {"max_threads_per_block", "max_shared_memory_per_block"}


def test_cpu_targets_pass():
    require_searchable(resolve_target(None), "check")
    assert not is_gpu(resolve_target({"kind": "llvm", "num-cores": 1}))


def test_tune_refuses_before_writing_anything(tmp_path):
    work = tmp_path / "w"
    with pytest.raises(UnsupportedTarget, match="fastsearch.tune"):
        tune(small("GMM"), H100, trials=1, work_dir=work)
    with pytest.raises(InvalidTarget, match="max_threads_per_block"):
        tune(small("GMM"), "cuda", trials=1, work_dir=work)
    assert not work.exists()


def test_extract_features_refuses_a_gpu_target():
    func = small("GMM")
    trace = Schedule(tvm.IRModule({"main": func})).trace
    with pytest.raises(UnsupportedTarget, match="extract_features"):
        extract_features(func, [trace], target=H100)


@pytest.mark.parametrize(("spec", "error"), [(H100, "UnsupportedTarget"), ("cuda", "InvalidTarget")])
def test_the_cli_names_the_error(spec, error, tmp_path, capsys):
    work = tmp_path / "w"
    code = main(
        ["tune", "--workload", "GMM", "--small", "--trials", "1", "--target", spec, "--work-dir", str(work)]
    )
    assert code == 1
    assert f"fastsearch: error: {error}:" in capsys.readouterr().err
    assert not work.exists()


def test_the_drop_in_classes_refuse_a_gpu_task():
    space = ms.space_generator.PostOrderApply(sch_rules=[], postprocs=[], mutator_probs={})
    context = tune_context(small("GMM"), resolve_target(H100), space)
    with pytest.raises(UnsupportedTarget, match="per-store features"):
        store_features(context, [])
    with pytest.raises(UnsupportedTarget, match="SearchStrategy"):
        SearchStrategy()._initialize_with_tune_context(context)
