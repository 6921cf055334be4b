"""Type stubs of the Rust extension ``fastsearch._core``.

Handles are built once and used many times: a :class:`Program` is parsed once and owns its
sketch space, a :class:`Target` holds the CPU facts, a :class:`Forest` a learned model. Every
call releases the GIL while the core works, and Ctrl-C interrupts the wait.
"""

from typing import Literal, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "CODE_SIZE_NAMES",
    "SKETCH_FEATURE_NAMES",
    "FastsearchError",
    "Forest",
    "GpuTarget",
    "InternalError",
    "InvalidTrace",
    "MalformedInput",
    "Program",
    "ScheduleError",
    "Target",
    "TraceReader",
    "UnsupportedWorkload",
    "__version__",
    "fusion_proposals",
    "merge_fusion_groups",
    "partition_graph",
    "tvm_trace_texts",
]

__version__: str

class FastsearchError(Exception): ...
class UnsupportedWorkload(FastsearchError): ...
class ScheduleError(FastsearchError): ...
class InvalidTrace(FastsearchError): ...
class MalformedInput(FastsearchError): ...
class InternalError(FastsearchError): ...

@final
class Target:
    """A CPU as the search sees it."""

    def __new__(
        cls,
        num_cores: int,
        *,
        vector_bytes: int = 32,
        fma_per_cycle: float = 2.0,
        parallel_speedup: float | None = None,
        vector_registers: int | None = None,
    ) -> Target: ...
    @property
    def num_cores(self) -> int: ...
    @property
    def vector_bytes(self) -> int: ...
    @property
    def fma_per_cycle(self) -> float: ...
    @property
    def parallel_speedup(self) -> float: ...
    @property
    def vector_registers(self) -> int: ...

@final
class GpuTarget:
    """A CUDA target's limits, for the schedule engine's CUDA postprocessors."""

    def __new__(
        cls, *, max_threads_per_block: int, warp_size: int, max_shared_memory_per_block: int
    ) -> GpuTarget: ...
    @property
    def max_threads_per_block(self) -> int: ...
    @property
    def warp_size(self) -> int: ...
    @property
    def max_shared_memory_per_block(self) -> int: ...

@final
class Forest:
    """Gradient-boosted trees (an XGBoost booster's JSON), evaluated in Rust."""

    def __new__(cls, booster_json: str) -> Forest: ...
    def predict(self, rows: npt.NDArray[np.float32]) -> list[float]: ...

@final
class TraceReader:
    """Reads TVM traces through tvm-ffi's C ABI (``fastsearch.ir.loop_nest``); internal."""

    def __new__(
        cls,
        *,
        trace_type: int,
        as_json: int,
        c_api: tuple[int, int, int],
        int_imm: tuple[int, int],
        float_imm: tuple[int, int],
    ) -> TraceReader: ...

@final
class Program:
    """A task's program model (``fastsearch.ir.tir_import.program_json``), parsed once."""

    def __new__(cls, program_json: str) -> Program: ...
    def summary(self) -> str: ...
    def sample_sketches(
        self, target: Target, n: int, seed: int, *, exclude: list[str] = ...
    ) -> list[str]: ...
    def sample_genomes(
        self, target: Target, n: int, seed: int, *, exclude: list[str] = ...
    ) -> list[tuple[str, str]]: ...
    def sample_gpu_sketches(
        self, target: GpuTarget, n: int, seed: int, *, exclude: list[str] = ...
    ) -> list[str]: ...
    def sample_gpu_genomes(
        self, target: GpuTarget, n: int, seed: int, *, exclude: list[str] = ...
    ) -> list[tuple[str, str]]: ...
    def propose_gpu(
        self,
        target: GpuTarget,
        n: int,
        seed: int,
        *,
        measured: list[tuple[str, float]] = ...,
        exclude: list[str] = ...,
        population: int = 512,
        generations: int = 4,
    ) -> list[tuple[str, str, float]]: ...
    def estimate_gpu(self, target: GpuTarget, genomes: list[str]) -> list[float]: ...
    def analytical_scores(self, target: Target, genomes: list[str]) -> list[float]: ...
    def sketch_feature_rows(self, target: Target, genomes: list[str]) -> npt.NDArray[np.float32]: ...
    def propose(
        self,
        target: Target,
        *,
        strategy: Literal["evolutionary", "annealing"],
        n: int,
        seed: int,
        measured: dict[str, float],
        seeds: list[str],
        population: int | None = None,
        generations: int | None = None,
        model: Forest | None = None,
        model_weight: float = 0.0,
    ) -> list[tuple[str, str, float, str]]: ...
    def transfer_genomes(self, genomes: list[str]) -> list[tuple[str, str] | None]: ...
    def transfer_sibling_genomes(
        self, source: Program, genomes: list[str]
    ) -> list[tuple[str, str] | None]: ...
    def apply_trace(
        self, trace_json: str, *, postprocess: bool = False, gpu: GpuTarget | None = None
    ) -> str: ...
    def verify_gpu(self, trace_jsons: list[str], *, gpu: GpuTarget) -> list[str | None]: ...
    def extract_features(
        self, trace_jsons: list[str], *, gpu: GpuTarget | None = None
    ) -> list[npt.NDArray[np.float32]]: ...
    def extract_features_each(
        self, trace_jsons: list[str], *, postprocess: bool = False, gpu: GpuTarget | None = None
    ) -> list[npt.NDArray[np.float32] | None]: ...
    def lowered_text(self, trace_json: str, *, gpu: GpuTarget | None = None) -> str: ...
    def code_sizes(self, trace_jsons: list[str], *, postprocess: bool = True) -> npt.NDArray[np.float32]: ...
    def extract_features_tvm(
        self, reader: TraceReader, traces: list[int], *, gpu: GpuTarget | None = None
    ) -> list[npt.NDArray[np.float32] | None]: ...

SKETCH_FEATURE_NAMES: list[str]
CODE_SIZE_NAMES: list[str]

def partition_graph(graph_json: str, max_fuse_depth: int = 256) -> list[list[int]]: ...
def fusion_proposals(
    graph_json: str, groups: list[list[int]], max_fuse_depth: int = 256
) -> list[tuple[Literal["prologue", "epilogue", "horizontal"], list[int]]]: ...
def merge_fusion_groups(
    graph_json: str, groups: list[list[int]], merges: list[list[int]]
) -> list[list[int]]: ...
def tvm_trace_texts(reader: TraceReader, traces: list[int]) -> list[str | None]: ...
