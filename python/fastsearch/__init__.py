"""fastsearch: an auto-tuner for Apache TVM with a search engine written in Rust."""

from __future__ import annotations

from fastsearch._core import __version__
from fastsearch.costmodel.features import extract_features
from fastsearch.errors import (
    DatabaseError,
    DatabaseWarning,
    FastsearchError,
    InternalError,
    InvalidTarget,
    InvalidTrace,
    MalformedInput,
    MeasurementError,
    RemoteError,
    ScheduleError,
    UnsupportedTarget,
    UnsupportedWorkload,
)
from fastsearch.graph.partition import partition
from fastsearch.ir.threads import set_kernel_threads
from fastsearch.measure.measurer import MeasureConfig, RPCRunner
from fastsearch.metaschedule import CostModel, FeatureExtractor, SearchStrategy
from fastsearch.search.sample import sample
from fastsearch.search.warm_start import WarmStart
from fastsearch.tuning.options import FusionSearch, Verification
from fastsearch.tuning.tune import TuneResult, tune

__all__ = [
    "CostModel",
    "DatabaseError",
    "DatabaseWarning",
    "FastsearchError",
    "FeatureExtractor",
    "FusionSearch",
    "InternalError",
    "InvalidTarget",
    "InvalidTrace",
    "MalformedInput",
    "MeasureConfig",
    "MeasurementError",
    "RPCRunner",
    "RemoteError",
    "ScheduleError",
    "SearchStrategy",
    "TuneResult",
    "UnsupportedTarget",
    "UnsupportedWorkload",
    "Verification",
    "WarmStart",
    "__version__",
    "extract_features",
    "partition",
    "sample",
    "set_kernel_threads",
    "tune",
]
