"""Type stubs of the Rust extension ``fastsearch._core``."""

import numpy as np

__all__ = [
    "SKETCH_FEATURE_NAMES",
    "FastsearchError",
    "InternalError",
    "InvalidTrace",
    "MalformedInput",
    "ScheduleError",
    "UnsupportedWorkload",
    "__version__",
    "analytical_scores",
    "apply_trace",
    "extract_features",
    "extract_features_each",
    "forest_predict",
    "fusion_proposals",
    "merge_fusion_groups",
    "partition_graph",
    "program_summary",
    "propose",
    "sample_genomes",
    "sample_sketches",
    "sketch_feature_rows",
    "transfer_genomes",
    "transfer_sibling_genomes",
]

__version__: str

class FastsearchError(Exception): ...
class UnsupportedWorkload(FastsearchError): ...
class ScheduleError(FastsearchError): ...
class InvalidTrace(FastsearchError): ...
class MalformedInput(FastsearchError): ...
class InternalError(FastsearchError): ...

def program_summary(program_json: str) -> str: ...
def sample_sketches(
    program_json: str, num_cores: int, n: int, seed: int, exclude: list[str] = ...
) -> list[str]: ...
def extract_features(program_json: str, trace_jsons: list[str]) -> list[np.ndarray]: ...
def extract_features_each(
    program_json: str, trace_jsons: list[str], postprocess: bool = False
) -> list[np.ndarray | None]: ...
def sample_genomes(
    program_json: str,
    num_cores: int,
    vector_bytes: int,
    n: int,
    seed: int,
    exclude: list[str] = ...,
    fma_per_cycle: float = 2.0,
    parallel_speedup: float | None = None,
) -> list[tuple[str, str]]: ...
def transfer_genomes(program_json: str, genomes: list[str]) -> list[tuple[str, str] | None]: ...
def transfer_sibling_genomes(
    source_program_json: str, program_json: str, genomes: list[str]
) -> list[tuple[str, str] | None]: ...
def analytical_scores(
    program_json: str,
    num_cores: int,
    vector_bytes: int,
    genomes: list[str],
    fma_per_cycle: float = 2.0,
    parallel_speedup: float | None = None,
) -> list[float]: ...
def propose(
    program_json: str,
    num_cores: int,
    vector_bytes: int,
    strategy: str,
    n: int,
    seed: int,
    measured: dict[str, float],
    seeds: list[str],
    population: int | None = None,
    generations: int | None = None,
    model_json: str | None = None,
    model_weight: float = 0.0,
    fma_per_cycle: float = 2.0,
    parallel_speedup: float | None = None,
) -> list[tuple[str, str, float, str]]: ...
def sketch_feature_rows(
    program_json: str,
    num_cores: int,
    vector_bytes: int,
    genomes: list[str],
    fma_per_cycle: float = 2.0,
    parallel_speedup: float | None = None,
) -> np.ndarray: ...
def forest_predict(model_json: str, rows: np.ndarray) -> list[float]: ...

SKETCH_FEATURE_NAMES: list[str]

def apply_trace(program_json: str, trace_json: str, postprocess: bool = False) -> str: ...
def partition_graph(graph_json: str, max_fuse_depth: int = 256) -> list[list[int]]: ...
def fusion_proposals(
    graph_json: str, groups: list[list[int]], max_fuse_depth: int = 256
) -> list[tuple[str, list[int]]]: ...
def merge_fusion_groups(
    graph_json: str, groups: list[list[int]], merges: list[list[int]]
) -> list[list[int]]: ...
