"""What the CUDA tests share: the te_workload families, the two CUDA targets they run on (the
H100 tag, sm_90, and a smaller sm_75 GPU), and a TuneContext on a CUDA target with TVM's CUDA
design space when asked."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import tvm
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from workloads import FAMILIES, space_context

__all__ = ["FAMILIES", "TARGETS", "cuda_context", "resampled_design_spaces"]

#: The H100's tag (sm_90: the software-pipelined spaces too) and a smaller GPU (sm_75).
TARGETS = {
    "sm_90": tvm.target.Target("nvidia/nvidia-h100"),
    "sm_75": tvm.target.Target(
        {
            "kind": "cuda",
            "arch": "sm_75",
            "max_threads_per_block": 1024,
            "max_shared_memory_per_block": 49152,
            "thread_warp_size": 32,
        }
    ),
}


def cuda_context(func: Any, target: tvm.target.Target, design_spaces: bool) -> ms.TuneContext:
    """A TuneContext of ``func`` on ``target``, with TVM's default CUDA design space when asked."""
    return space_context(func, target, "cuda", design_spaces)


def resampled_design_spaces(
    func: Any, target: tvm.target.Target, seeds: Iterable[int]
) -> Iterator[tuple[int, int, ms.TuneContext, s_tir.Schedule]]:
    """TVM's CUDA design spaces of ``func`` on ``target``, each replayed with fresh random
    decisions under every seed (postprocessing instructions kept): (space index, seed, the
    TuneContext, the schedule)."""
    ctx = cuda_context(func, target, design_spaces=True)
    for si, space in enumerate(ctx.generate_design_space()):
        for seed in seeds:
            sch = s_tir.Schedule(func, seed=seed)
            s_tir.Trace(space.trace.insts, {}).apply_to_schedule(sch, remove_postproc=False)
            yield si, seed, ctx, sch
