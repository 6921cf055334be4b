"""The search for a CUDA target: a sampler the tuning loop calls for each batch.

It proposes candidates of fastsearch's GPU sketches through the engine's evolutionary search
(``_core.Program.propose_gpu``): seeded with the best measured genomes, mutated within the
target's thread, shared-memory and register limits, ranked by the analytical GPU model, and
checked by the engine's CUDA postprocessors and VerifyGPUCode before they are proposed. Each
proposal is then replayed in TVM with MetaSchedule's CUDA postprocessors, as every candidate is
before a build.

The model is analytical only: fastsearch has not measured GPU candidates yet, so no learned
model is trained on them here (the per-store features of CUDA candidates are MetaSchedule's, and
the drop-in :class:`fastsearch.metaschedule.CostModel` trains on them inside MetaSchedule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tvm

from fastsearch import _core
from fastsearch.errors import InternalError
from fastsearch.ir.target import cuda_limits
from fastsearch.ir.tir_import import program_json
from fastsearch.search.sample import Candidate, Postprocessor, base_schedule, replay

__all__ = ["GpuSampler"]

#: Population and generations of each batch's evolution: scoring takes microseconds here.
POPULATION = 512
GENERATIONS = 4


class GpuSampler:
    """A sampler (``(func, target, n, seed, exclude) -> candidates``) for one task on a CUDA
    target; ``update(func, measured)`` feeds it each batch's results (key, seconds or None)."""

    def __init__(
        self,
        func: tvm.tirx.PrimFunc,
        target: tvm.target.Target,
        postprocessor: Postprocessor | None = None,
        *,
        strategy: str = "evolutionary",
    ) -> None:
        self.program = _core.Program(program_json(func))
        self.gpu = cuda_limits(target)
        self.postprocessor = postprocessor or Postprocessor(func, target)
        self.base = base_schedule(func)
        self.random = strategy == "random"
        # The genome behind each key this sampler proposed, and the measured ones' seconds.
        self.genomes: dict[str, str] = {}
        self.measured: dict[str, float] = {}

    def update(self, func: tvm.tirx.PrimFunc, measured: Sequence[tuple[str, float | None]]) -> None:
        for key, secs in measured:
            self.measured[key] = math.inf if secs is None else float(secs)

    def _seeds(self) -> list[tuple[str, float]]:
        """Measured genomes that ran, with their seconds: what the evolution starts from."""
        return [
            (self.genomes[k], secs)
            for k, secs in self.measured.items()
            if k in self.genomes and math.isfinite(secs)
        ]

    def __call__(
        self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, n: int, seed: int, exclude: set
    ) -> list[Candidate]:
        excluded = sorted(set(exclude) | set(self.measured))
        if self.random:
            drawn = self.program.sample_gpu_genomes(self.gpu, n, seed, exclude=excluded)
        else:
            proposals = self.program.propose_gpu(
                self.gpu,
                n,
                seed,
                measured=self._seeds(),
                exclude=excluded,
                population=POPULATION,
                generations=GENERATIONS,
            )
            drawn = [(trace, genome) for trace, genome, _ in proposals]
        out: list[Candidate] = []
        for key, genome in drawn:
            sch = replay(self.base, key, self.postprocessor)
            if sch is None:
                continue
            self.genomes[key] = genome
            out.append(Candidate(key, sch))
        if drawn and not out:
            raise InternalError(
                f"TVM's CUDA postprocessors ({self.postprocessor.rejected_by}) refused all {len(drawn)} "
                "candidates the engine verified"
            )
        return out
