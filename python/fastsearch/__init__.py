"""fastsearch: an auto-tuner for Apache TVM with a search engine written in Rust."""

from __future__ import annotations

from fastsearch._core import __version__
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
    UnsupportedWorkload,
)
from fastsearch.features import extract_features
from fastsearch.measure import MeasureConfig, RPCRunner
from fastsearch.partition import partition
from fastsearch.sample import sample
from fastsearch.tune import TuneResult, tune
from fastsearch.tvm import CostModel, FeatureExtractor, SearchStrategy
from fastsearch.warm_start import WarmStart

__all__ = [
    "CostModel",
    "DatabaseError",
    "DatabaseWarning",
    "FastsearchError",
    "FeatureExtractor",
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
    "UnsupportedWorkload",
    "WarmStart",
    "__version__",
    "extract_features",
    "partition",
    "sample",
    "tune",
]
