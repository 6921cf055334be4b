"""The GPU search (``_core.Program.propose_gpu``) checked by TVM: every proposal replays in TVM
and passes all of MetaSchedule's CUDA postprocessors, VerifyGPUCode included; none repeats a
measured candidate; the same seed proposes the same batch; and the analytical model's estimate
of a proposal is at least as good as the measured seeds'. No GPU is needed (nothing is timed:
the measured seconds here are stand-ins, which is all the search reads of them)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import tvm
from fastsearch import _core
from fastsearch.ir.target import cuda_limits
from fastsearch.ir.tir_import import program_json
from fastsearch.ir.tune_context import tune_context
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

H100 = tvm.target.Target("nvidia/nvidia-h100")
CASES = [("GMM", 1), ("C2D", 1), ("DEP", 1), ("CBR", 2), ("SFM", 1), ("NRM", 0), ("T2D", 0)]


def _tvm_accepts(func: Any, trace: str) -> bool:
    ctx = tune_context(func, H100, task_name="x")
    sch = s_tir.Schedule(func)
    s_tir.Trace.apply_json_to_schedule(json.loads(trace), sch)
    posts = ms.postproc.Postproc.create("cuda")
    for p in posts:
        p._initialize_with_tune_context(ctx)
    return all(p.apply(sch) for p in posts)


@pytest.mark.parametrize(("family", "index"), CASES)
def test_proposals_are_valid_for_tvm_and_new(family: str, index: int) -> None:
    func = te_workload.create_te_workload(family, index)
    program = _core.Program(program_json(func))
    gpu = cuda_limits(H100)
    seeds = program.sample_gpu_genomes(gpu, 4, 1)
    measured = [(genome, 1e-3 * (i + 1)) for i, (_, genome) in enumerate(seeds)]
    exclude = [key for key, _ in seeds]
    proposals = program.propose_gpu(
        gpu, 8, 7, measured=measured, exclude=exclude, population=96, generations=2
    )
    assert len(proposals) >= 4, f"{family}: {len(proposals)} proposals"
    traces = [t for t, _, _ in proposals]
    assert len(set(traces)) == len(traces)
    assert not set(traces) & set(exclude)
    rejected = [t for t in traces if not _tvm_accepts(func, t)]
    assert not rejected, (
        f"{family}: TVM's postprocessors reject {len(rejected)} of {len(traces)}: {rejected[0]}"
    )
    again = program.propose_gpu(gpu, 8, 7, measured=measured, exclude=exclude, population=96, generations=2)
    assert [t for t, _, _ in again] == traces
    # The search ranks by the model: its best proposal is no worse than the seeds it started from.
    seed_estimates = program.estimate_gpu(gpu, [g for g, _ in measured])
    assert min(score for _, _, score in proposals) <= min(seed_estimates) * 1.0001


def test_a_malformed_measured_genome_raises() -> None:
    program = _core.Program(program_json(te_workload.create_te_workload("GMM", 0)))
    with pytest.raises(_core.MalformedInput):
        program.propose_gpu(cuda_limits(H100), 2, 0, measured=[("not a genome", 1.0)])
