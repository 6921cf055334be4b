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
from fastsearch.measure import MeasureConfig, RPCRunner
from fastsearch.partition import partition
from fastsearch.sample import sample
from fastsearch.tune import TuneResult, tune

__all__ = [
    "DatabaseError",
    "DatabaseWarning",
    "FastsearchError",
    "InternalError",
    "InvalidTarget",
    "InvalidTrace",
    "MalformedInput",
    "MeasureConfig",
    "MeasurementError",
    "RPCRunner",
    "RemoteError",
    "ScheduleError",
    "TuneResult",
    "UnsupportedWorkload",
    "__version__",
    "partition",
    "sample",
    "tune",
]
