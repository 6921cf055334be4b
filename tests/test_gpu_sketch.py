"""fastsearch's GPU sketches (Rust) against TVM's CUDA postprocessors (no GPU needed).

For every te_workload family and shape, candidates drawn with ``Program.sample_gpu_sketches``
are replayed by TVM on a fresh schedule and run through MetaSchedule's CUDA postprocessors,
VerifyGPUCode included, on two targets: the H100 tag and a smaller sm_75 GPU. At least 95% of
each family's candidates must pass on each target. Tile sizes, threads and shared memory are
drawn within the target's limits; TVM's own design spaces, re-sampled, pass far less often
(``test_valid_share_beside_tvm`` prints both).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import tvm
from fastsearch import _core
from fastsearch.ir.tir_import import program_json
from fastsearch.ir.tune_context import tune_context
from gpu_workloads import FAMILIES, TARGETS
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

#: Candidates drawn per shape and target (a family has 2 to 5 shapes).
PER_SHAPE = 8
MIN_VALID_SHARE = 0.95
SEED = 7


def gpu_target(target: tvm.target.Target) -> _core.GpuTarget:
    attrs = target.attrs
    return _core.GpuTarget(
        max_threads_per_block=int(attrs["max_threads_per_block"]),
        warp_size=int(attrs["thread_warp_size"]),
        max_shared_memory_per_block=int(attrs["max_shared_memory_per_block"]),
    )


def _valid(sch: s_tir.Schedule, ctx: ms.TuneContext) -> bool:
    """Whether every CUDA postprocessor, VerifyGPUCode last, accepts ``sch`` (changed in place)."""
    for p in ms.postproc.Postproc.create("cuda"):
        p._initialize_with_tune_context(ctx)
        try:
            if not p.apply(sch):
                return False
        except (tvm.error.TVMError, s_tir.ScheduleError, ValueError):
            return False
    return True


def _ours(func: Any, target: tvm.target.Target, n: int) -> list[tuple[str, s_tir.Schedule | None]]:
    """Our candidates of ``func``: each trace with its postprocessed schedule (None: refused)."""
    ctx = tune_context(func, target, task_name="x")
    keys = _core.Program(program_json(func)).sample_gpu_sketches(gpu_target(target), n, SEED)
    out: list[tuple[str, s_tir.Schedule | None]] = []
    for key in keys:
        sch = s_tir.Schedule(func)
        s_tir.Trace.apply_json_to_schedule(json.loads(key), sch)
        out.append((key, sch if _valid(sch, ctx) else None))
    return out


def _tvm_share(func: Any, target: tvm.target.Target, seeds: tuple[int, ...] = (1, 2, 3)) -> tuple[int, int]:
    """TVM's CUDA design spaces of ``func`` re-sampled under ``seeds``: (valid, drawn)."""
    space = ms.space_generator.PostOrderApply(
        sch_rules=ms.schedule_rule.ScheduleRule.create("cuda"),
        postprocs=ms.postproc.Postproc.create("cuda"),
        mutator_probs={},
    )
    ctx = tune_context(func, target, space=space, task_name="x")
    valid = drawn = 0
    for design in ctx.generate_design_space():
        for seed in seeds:
            sch = s_tir.Schedule(func, seed=seed)
            s_tir.Trace(design.trace.insts, {}).apply_to_schedule(sch, remove_postproc=False)
            drawn += 1
            valid += _valid(sch, ctx)
    return valid, drawn


def _family_share(family: str, tname: str) -> tuple[int, int]:
    valid = drawn = 0
    for idx in range(len(te_workload.CONFIGS[family][1])):
        results = _ours(te_workload.create_te_workload(family, idx), TARGETS[tname], PER_SHAPE)
        assert len(results) >= PER_SHAPE // 2, f"{family}[{idx}]: only {len(results)} distinct candidates"
        drawn += len(results)
        valid += sum(sch is not None for _, sch in results)
    return valid, drawn


@pytest.mark.slow
@pytest.mark.parametrize("tname", list(TARGETS))
@pytest.mark.parametrize("family", FAMILIES)
def test_almost_every_candidate_passes_tvms_cuda_postprocessors(family: str, tname: str) -> None:
    valid, drawn = _family_share(family, tname)
    print(f"\n{family} {tname}: {valid}/{drawn} valid")
    assert valid / drawn >= MIN_VALID_SHARE, f"{family} on {tname}: {valid}/{drawn} valid"


@pytest.mark.parametrize("family", ["GMM", "SFM", "CBR"])
def test_a_few_families_pass_on_the_h100(family: str) -> None:
    """The quick subset of the test above (one shape, the H100)."""
    results = _ours(te_workload.create_te_workload(family, 0), TARGETS["sm_90"], 12)
    assert len(results) >= 6
    assert all(sch is not None for _, sch in results), [k for k, s in results if s is None][:1]


def test_the_structure_follows_the_cuda_rules() -> None:
    """GMM is tiled and bound to blocks, virtual threads and threads with both caches; a
    softmax's reductions are drawn across threads, also under their consumer's thread block."""
    gt = gpu_target(TARGETS["sm_90"])
    gmm = _core.Program(program_json(te_workload.create_te_workload("GMM", 0))).sample_gpu_sketches(gt, 8, 1)
    for key in gmm:
        assert all(
            s in key for s in ('"vthread.x"', '"shared"', '"local"', "meta_schedule.cooperative_fetch")
        )
        assert "meta_schedule.thread_extent_low_inclusive" in key
    sfm = _core.Program(program_json(te_workload.create_te_workload("SFM", 0))).sample_gpu_sketches(gt, 40, 1)
    assert any('"SetScope"' in key for key in sfm), "no reduction computed under its consumer"
    assert sum('"threadIdx.x"' in key for key in sfm) == len(sfm)


def test_the_same_seed_gives_the_same_candidates() -> None:
    program = _core.Program(program_json(te_workload.create_te_workload("C2D", 1)))
    gt = gpu_target(TARGETS["sm_75"])
    first = program.sample_gpu_sketches(gt, 16, 3)
    assert first == program.sample_gpu_sketches(gt, 16, 3)
    assert first != program.sample_gpu_sketches(gt, 16, 4)
    assert not set(first) & set(program.sample_gpu_sketches(gt, 16, 3, exclude=first))


def test_gmm_candidates_build_to_cuda_source() -> None:
    """TVM compiles a few postprocessed GMM candidates to CUDA C (no GPU or compiler needed)."""
    target = TARGETS["sm_90"]
    results = _ours(te_workload.create_te_workload("GMM", 1), target, 3)
    assert len(results) == 3
    for _, sch in results:
        assert sch is not None
        source = tvm.compile(sch.mod, target=target).mod.imports[0].inspect_source()
        assert "__global__" in source and "__shared__" in source and "threadIdx.x" in source


@pytest.mark.slow
def test_valid_share_beside_tvm() -> None:
    """Prints our valid share and TVM's re-sampled design spaces' per family and target; ours
    must be at least as high as TVM's overall."""
    ours_total = tvm_total = 0.0
    lines = []
    for tname, target in TARGETS.items():
        for family in FAMILIES:
            ov, od = _family_share(family, tname)
            tv = td = 0
            for idx in range(len(te_workload.CONFIGS[family][1])):
                v, d = _tvm_share(te_workload.create_te_workload(family, idx), target)
                tv, td = tv + v, td + d
            lines.append(f"{family:4} {tname}: ours {ov}/{od}  TVM {tv}/{td}")
            ours_total += ov / od
            tvm_total += tv / td
    print("\n" + "\n".join(lines))
    assert ours_total >= tvm_total
