"""``fastsearch tune --build-only`` and ``fastsearch.tuning.build_only.build_gpu_space``: a GPU
search space drawn, verified, built to CUDA source and (with nvcc) to cubins, never measured;
and the typed errors of GPU targets that cannot be tuned here.

No GPU is needed. The tests that compile cubins skip without nvcc (``pip install '.[cuda]'``);
the rest run everywhere, nvcc or not (the no-nvcc path is forced by hiding it)."""

from __future__ import annotations

import json
import re

import pytest
import tvm
from fastsearch import InvalidTarget, UnsupportedTarget, UnsupportedWorkload, tune
from fastsearch.cli.main import main
from fastsearch.ir import target as target_module
from fastsearch.measure import cubin
from fastsearch.measure.cubin import CubinReport, KernelResources, find_nvcc
from fastsearch.tuning import build_only
from fastsearch.tuning.build_only import BUILD_FAILURES, build_gpu_space, gpu_tasks
from tvm import relax
from tvm.s_tir.meta_schedule.testing import te_workload
from workloads import small

requires_nvcc = pytest.mark.skipif(
    find_nvcc() is None, reason="no nvcc: pip install '.[cuda]' (nvidia-cuda-nvcc)"
)

H100 = "nvidia/nvidia-h100"


@pytest.fixture(scope="module")
def gmm0():
    return te_workload.create_te_workload("GMM", 0)


@pytest.fixture
def no_nvcc(monkeypatch):
    monkeypatch.setattr(cubin, "find_nvcc", lambda: None)


# ---------------------------------------------------------------------------------------------
# The build-only API


def test_without_nvcc_it_samples_verifies_and_builds_to_source(gmm0, no_nvcc):
    report = build_gpu_space(gmm0, H100, n=4, seed=0, name="GMM_0")
    assert report.cubins_skipped is not None
    assert "pip install 'fastsearch[cuda]'" in report.cubins_skipped
    (task,) = report.tasks.values()
    assert task.name == "GMM_0" and task.sampled == 4
    # Our GPU sketches pass the engine's VerifyGPUCode and TVM's postprocessors alike on GMM.
    assert task.valid == task.tvm_valid == task.built == 4
    assert task.compiled == 0 and task.registers is None and not task.failures
    for cand in task.candidates:
        assert cand.valid and cand.tvm_rejected_by is None and cand.build_s is not None
        assert json.loads(cand.trace)  # MetaSchedule trace JSON
    text = report.summary()
    assert "skipped: no nvcc found" in text and "pip install 'fastsearch[cuda]'" in text
    assert "valid 4/4" in text and "4 of 4 TVM passes to CUDA source" in text
    assert "sm_90a" in report.target


@requires_nvcc
def test_with_nvcc_every_valid_gmm_candidate_compiles_to_a_cubin(gmm0):
    report = build_gpu_space(gmm0, H100, n=4, seed=0, arch="sm_90")
    (task,) = report.tasks.values()
    assert report.cubins_skipped is None and report.arch == "sm_90"
    assert task.valid == task.built == task.compiled == 4
    lo, med, hi = task.registers
    assert 0 < lo <= med <= hi <= 255
    assert task.shared_bytes is not None and 0 < task.shared_bytes[2] <= 49152  # GMM caches in shared
    for cand in task.candidates:
        assert cand.kernels and cand.nvcc_s is not None and cand.nvcc_s > 0
        assert cand.failure is None or cand.failure in ("spill", "registers")
    assert task.spilled == task.failures.get("spill", 0)
    text = report.summary()
    assert "4 compiled to cubins" in text and "min/median/max" in text and "spills" in text


def test_a_valid_candidate_that_breaks_a_limit_is_a_failed_build_by_kind(gmm0, monkeypatch):
    """What ptxas reports decides: a spilling cubin is a failed build of kind "spill", one over
    the target's shared memory of kind "shared_memory", whatever the engine said before."""
    reports = iter(
        [
            CubinReport("sm_90", (KernelResources("k", 255, 64, 64, 1024, 128, launch_bound=256),), b"", 0.5),
            CubinReport("sm_90", (KernelResources("k", 64, 0, 0, 65536, 0, launch_bound=128),), b"", 0.5),
            CubinReport("sm_90", (KernelResources("k", 40, 0, 0, 4096, 0, launch_bound=128),), b"", 0.5),
        ]
    )
    monkeypatch.setattr(cubin, "find_nvcc", lambda: "/fake/nvcc")
    monkeypatch.setattr(cubin, "compile_cubin", lambda source, arch, **kw: next(reports))
    report = build_gpu_space(gmm0, H100, n=3, seed=0, workers=1)
    (task,) = report.tasks.values()
    assert [c.failure for c in task.candidates] == ["spill", "shared_memory", None]
    assert task.failures == {"spill": 1, "shared_memory": 1}
    assert task.compiled == 3 and task.spilled == 1
    assert task.registers == (40, 64, 255)
    assert "failed     shared_memory 1, spill 1" in report.summary()
    assert "64 bytes spill stores" in task.candidates[0].message
    assert set(report.failures) <= set(BUILD_FAILURES)


def test_an_nvcc_failure_is_a_failed_build(gmm0, monkeypatch):
    def refuse(source, arch, **kw):
        raise cubin.CubinError("nvcc --cubin failed: error: something", "error", "error: something")

    monkeypatch.setattr(cubin, "find_nvcc", lambda: "/fake/nvcc")
    monkeypatch.setattr(cubin, "compile_cubin", refuse)
    report = build_gpu_space(gmm0, H100, n=2, seed=0)
    (task,) = report.tasks.values()
    assert task.failures == {"nvcc": 2} and task.compiled == 0 and task.built == 2
    assert "nvcc: nvcc --cubin failed" in report.summary()


def test_a_disagreement_is_counted_and_built_for_nvcc_to_judge(gmm0, monkeypatch, no_nvcc):
    """What TVM's postprocessors accept is built, whatever the engine said: a candidate the two
    verdicts disagree on is counted and still built, so that ptxas decides."""

    def verify(program, traces, *, gpu):
        verdicts = program.verify_gpu(traces, gpu=gpu)
        return ["threads per block (made up)" if i == 0 else v for i, v in enumerate(verdicts)]

    monkeypatch.setattr(build_only._core, "Program", _wrapping_program(verify))
    report = build_gpu_space(gmm0, H100, n=3, seed=0)
    (task,) = report.tasks.values()
    assert [c.valid for c in task.candidates] == [False, True, True]
    assert task.valid == 2 and task.tvm_valid == 3 and task.disagreements == 1 and task.built == 3
    assert "1 judged differently" in report.summary()


def test_a_candidate_tvm_refuses_is_a_failed_postproc_build(gmm0, monkeypatch, no_nvcc):
    def refuse_first(base, trace, post):
        refuse_first.calls += 1
        return (None, "VerifyGPUCode") if refuse_first.calls == 1 else real(base, trace, post)

    refuse_first.calls = 0
    real = build_only._tvm_verdict
    monkeypatch.setattr(build_only, "_tvm_verdict", refuse_first)
    report = build_gpu_space(gmm0, H100, n=2, seed=0)
    (task,) = report.tasks.values()
    assert task.failures == {"postproc": 1} and task.built == 1 and task.disagreements == 1
    assert "TVM's VerifyGPUCode refused a candidate the engine passed" in task.candidates[0].message


def _wrapping_program(verify):
    """A stand-in for ``_core.Program`` whose ``verify_gpu`` is ``verify`` over the real one."""
    program_type = build_only._core.Program

    class Wrapped:
        def __init__(self, text):
            self.inner = program_type(text)

        def sample_gpu_sketches(self, *args, **kwargs):
            return self.inner.sample_gpu_sketches(*args, **kwargs)

        def verify_gpu(self, traces, *, gpu):
            return verify(self.inner, traces, gpu=gpu)

    return Wrapped


def test_an_irmodule_is_one_task_per_primfunc(no_nvcc):
    mod = tvm.IRModule(
        {"gmm": te_workload.create_te_workload("GMM", 0), "sfm": te_workload.create_te_workload("SFM", 0)}
    )
    assert list(gpu_tasks(mod)) == ["gmm", "sfm"]
    report = build_gpu_space(mod, H100, n=2, seed=1, cubins=False)
    assert list(report.tasks) == ["gmm", "sfm"]
    assert report.cubins_skipped is not None and "not asked for" in report.cubins_skipped
    assert all(t.built == t.valid == 2 for t in report.tasks.values())
    assert "total        4/4 valid" in report.summary()


def test_the_same_seed_draws_the_same_candidates(gmm0, no_nvcc):
    first = build_gpu_space(gmm0, H100, n=3, seed=5)
    again = build_gpu_space(gmm0, H100, n=3, seed=5)
    other = build_gpu_space(gmm0, H100, n=3, seed=6)
    traces = [[c.trace for c in r.tasks["main"].candidates] for r in (first, again, other)]
    assert traces[0] == traces[1] != traces[2]


@pytest.mark.parametrize(
    ("spec", "error", "text"),
    [
        (None, UnsupportedTarget, "is a CPU target"),
        ({"kind": "vulkan"}, UnsupportedTarget, "is a vulkan GPU target"),
        ({"kind": "cuda"}, InvalidTarget, "max_threads_per_block"),
    ],
)
def test_build_only_refuses_what_is_not_a_cuda_target(gmm0, spec, error, text):
    with pytest.raises(error, match=text):
        build_gpu_space(gmm0, spec, n=2)


def test_build_only_refuses_a_relax_module_and_bad_arguments(gmm0):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    with pytest.raises(UnsupportedWorkload, match="IRModule of PrimFuncs"):
        build_gpu_space(bb.get(), H100, n=2)
    with pytest.raises(UnsupportedWorkload, match="PrimFunc"):
        build_gpu_space("GMM", H100, n=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be at least 1"):
        build_gpu_space(gmm0, H100, n=0)


# ---------------------------------------------------------------------------------------------
# The CLI


def test_the_cli_prints_the_build_only_report(capsys, no_nvcc, tmp_path):
    out = tmp_path / "report.json"
    code = main(
        ["tune", "--workload", "GMM:0", "--target", H100, "--build-only", "--trials", "3",
         "--build-report", str(out)]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "workload     GMM_0 (1, 128, 128, 128)" in printed
    assert "task         GMM_0: 3 drawn, valid 3/3" in printed
    assert "skipped: no nvcc found" in printed and "pip install 'fastsearch[cuda]'" in printed
    data = json.loads(out.read_text())
    assert data["tasks"]["GMM_0"]["built"] == 3 and len(data["tasks"]["GMM_0"]["candidates"]) == 3


@requires_nvcc
def test_the_cli_compiles_cubins(capsys):
    code = main(["tune", "--workload", "SFM:0", "--target", H100, "--build-only", "--trials", "2"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "nvcc --cubin -arch=sm_90a" in printed
    assert "2 compiled to cubins" in printed
    assert re.search(r"registers  \d+/\d+/\d+ per thread", printed)


@pytest.mark.parametrize(
    ("argv", "error", "text"),
    [
        (["--workload", "GMM:0", "--build-only"], "UnsupportedTarget", "is a CPU target"),
        (["--model", "resnet-tiny", "--target", H100, "--build-only"], "UnsupportedWorkload", "--workload"),
        (
            ["--workload", "GMM:0", "--target", "cuda", "--build-only"],
            "InvalidTarget",
            "max_threads_per_block",
        ),
    ],
)
def test_the_cli_names_build_only_errors(argv, error, text, capsys):
    if "cuda" in argv and tvm.cuda(0).exist:
        pytest.skip("on a machine with a GPU, 'cuda' is that GPU, limits included")
    assert main(["tune", *argv]) == 1
    err = capsys.readouterr().err
    assert f"fastsearch: error: {error}:" in err and text in err


# ---------------------------------------------------------------------------------------------
# Tuning a GPU target: refused with a typed error that names the ways to measure


def _assert_names_the_ways_to_measure(message: str) -> None:
    assert "local CUDA GPU" in message
    assert "fastsearch.RPCRunner(tracker=" in message and "key=" in message
    assert "--build-only" in message


@pytest.mark.parametrize("spec", [H100, {"kind": "cuda", "arch": "sm_80"}])
def test_tune_without_a_gpu_or_runner_names_both_ways_to_measure(spec, tmp_path, monkeypatch):
    monkeypatch.setattr(target_module, "has_local_gpu", lambda target: False)
    work = tmp_path / "w"
    with pytest.raises(UnsupportedTarget) as info:
        tune(small("GMM"), spec, trials=1, work_dir=work)
    _assert_names_the_ways_to_measure(str(info.value))
    assert str(info.value).startswith("fastsearch.tune: measuring candidates")
    assert not work.exists()


def test_has_local_gpu_asks_the_runtime():
    assert target_module.has_local_gpu(tvm.target.Target(H100)) == bool(tvm.cuda(0).exist)


def test_the_cli_refuses_to_tune_a_gpu_target_and_names_the_ways(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(target_module, "has_local_gpu", lambda target: False)
    work = tmp_path / "w"
    code = main(["tune", "--workload", "GMM:0", "--target", H100, "--trials", "1", "--work-dir", str(work)])
    assert code == 1
    err = capsys.readouterr().err
    assert "fastsearch: error: UnsupportedTarget: fastsearch tune: measuring candidates" in err
    _assert_names_the_ways_to_measure(err)
    assert not work.exists()


# ---------------------------------------------------------------------------------------------
# Every family (slow): the CI-sized cubin suite (benches/gpu_cubins.py runs it at scale)

FAMILIES = ["C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG"]


@requires_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_valid_candidate_of_every_family_compiles(family):
    """Shape 0 of each family, 4 candidates: every one passes both verdicts, TVM builds it (or
    fails in its ThreadSync pass on a 3-lane vectorized shared-memory fetch: a TVM limitation
    benches/gpu_cubins.py met 10 times in 832 candidates) and nvcc compiles every source TVM
    built."""
    report = build_gpu_space(te_workload.create_te_workload(family, 0), H100, n=4, seed=0, arch="sm_90")
    (task,) = report.tasks.values()
    assert task.sampled >= 2
    assert task.valid == task.tvm_valid == task.sampled and task.disagreements == 0
    tvm_limit = [c for c in task.candidates if c.failure == "build" and "eval_vec_" in c.message]
    assert task.built + len(tvm_limit) == task.valid
    assert task.compiled == task.built
    assert not set(task.failures) - {"spill", "build"}, task.failures
