"""GPU targets are resolved as a user writes them and refused with typed errors before any
work, never served CPU schedules.

fastsearch's sketches, features and cost models are CPU-only for now. A well-formed GPU target
(a tag, a dict with the limits, or one that names a CUDA ``arch``) is an ``UnsupportedTarget``;
a CUDA target without the limits a GPU search reads (a bare ``"cuda"`` on a machine without a
GPU) is an ``InvalidTarget`` naming them and the ways to give them. No GPU is needed: TVM builds
these targets anywhere; the one test that reads a GPU's own target skips without one.
"""

from __future__ import annotations

import pytest
import tvm
from fastsearch import InvalidTarget, UnsupportedTarget, extract_features, sample, tune
from fastsearch.cli.main import main
from fastsearch.costmodel.features import FEATURE_NAMES
from fastsearch.ir.target import CUDA_ARCH_LIMITS, CUDA_LIMITS, is_gpu, require_searchable, resolve_target
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


@pytest.mark.parametrize("spec", ["cuda", {"kind": "cuda"}])
def test_a_cuda_target_without_its_limits_names_them(spec):
    if spec == "cuda" and tvm.cuda(0).exist:
        pytest.skip("on a machine with a GPU, 'cuda' is that GPU, limits included")
    with pytest.raises(InvalidTarget) as info:
        require_searchable(resolve_target(spec), "check")
    for limit in ("max_threads_per_block", "max_shared_memory_per_block"):
        assert limit in str(info.value)
    assert "arch" in str(info.value) and "nvidia/nvidia-h100" in str(info.value)
    assert set(CUDA_LIMITS) >= {"max_threads_per_block", "max_shared_memory_per_block"}


def test_a_cuda_arch_brings_its_limits():
    """A CUDA dict that names only an architecture gets the per-block limits every arch from
    sm_50 on shares (the H100 tag's values); limits the dict gives win."""
    target = resolve_target({"kind": "cuda", "arch": "sm_90"})
    h100 = resolve_target(H100)
    for limit in CUDA_ARCH_LIMITS:
        assert int(target.attrs[limit]) == int(h100.attrs[limit]) == CUDA_ARCH_LIMITS[limit]
    assert str(target.attrs["arch"]) == "sm_90"
    small_smem = resolve_target({"kind": "cuda", "arch": "sm_90a", "max_shared_memory_per_block": 16384})
    assert int(small_smem.attrs["max_shared_memory_per_block"]) == 16384
    with pytest.raises(UnsupportedTarget):  # well-formed now: refused as a GPU target, not invalid
        require_searchable(target, "check")
    for bad in ("sm_35", "compute_90", "90"):
        with pytest.raises(InvalidTarget, match="'arch' must name a CUDA architecture"):
            resolve_target({"kind": "cuda", "arch": bad})


@pytest.mark.skipif(not tvm.cuda(0).exist, reason="needs a CUDA GPU")
def test_cuda_is_this_machines_gpu():
    target = resolve_target("cuda")
    assert str(target.attrs["arch"]).startswith("sm_")
    assert all(target.attrs.get(limit) is not None for limit in CUDA_LIMITS)


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


def test_extract_features_takes_cuda_and_refuses_other_gpu_targets():
    func = small("GMM")
    trace = Schedule(tvm.IRModule({"main": func})).trace
    (rows,) = extract_features(func, [trace], target=H100)  # GPU features (tests/test_features_gpu.py)
    assert rows[:, FEATURE_NAMES.index("is_gpu")].tolist() == [1.0] * len(rows)
    with pytest.raises(UnsupportedTarget, match="extract_features"):
        extract_features(func, [trace], target={"kind": "rocm"})


@pytest.mark.parametrize(("spec", "error"), [(H100, "UnsupportedTarget"), ("cuda", "InvalidTarget")])
def test_the_cli_names_the_error(spec, error, tmp_path, capsys):
    work = tmp_path / "w"
    code = main(
        ["tune", "--workload", "GMM", "--small", "--trials", "1", "--target", spec, "--work-dir", str(work)]
    )
    assert code == 1
    assert f"fastsearch: error: {error}:" in capsys.readouterr().err
    assert not work.exists()


def test_the_drop_in_classes_take_a_cuda_task():
    """Inside MetaSchedule's TuneContext on a CUDA target: the strategy evolves MetaSchedule's
    CUDA design spaces into candidates TVM's CUDA postprocessors accept, and the features of
    each are the GPU features (is_gpu set). Measuring them needs a GPU."""
    func = small("GMM")
    target = resolve_target(H100)
    space = ms.space_generator.PostOrderApply(
        sch_rules=ms.schedule_rule.ScheduleRule.create("cuda"),
        postprocs=ms.postproc.Postproc.create("cuda"),
        mutator_probs={},
    )
    context = tune_context(func, target, space)
    strategy = SearchStrategy(population_size=16, generations=1, seed=0)
    strategy._initialize_with_tune_context(context)
    strategy.pre_tuning(8, 4, context.generate_design_space(), None, None)
    candidates = strategy.generate_measure_candidates()
    assert candidates
    for c in candidates:
        assert 'thread="threadIdx.x"' in c.sch.mod["main"].script()
    rows, from_tvm = store_features(context, candidates)
    assert from_tvm == 0
    assert all(
        r.shape[1] == len(FEATURE_NAMES) and (r[:, FEATURE_NAMES.index("is_gpu")] == 1).all() for r in rows
    )


def test_the_drop_in_classes_refuse_other_gpu_tasks():
    space = ms.space_generator.PostOrderApply(sch_rules=[], postprocs=[], mutator_probs={})
    context = tune_context(small("GMM"), resolve_target({"kind": "vulkan"}), space)
    with pytest.raises(UnsupportedTarget, match="per-store features"):
        store_features(context, [])
    with pytest.raises(UnsupportedTarget, match="SearchStrategy"):
        SearchStrategy()._initialize_with_tune_context(context)
