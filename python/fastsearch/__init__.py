"""fastsearch: an auto-tuner for Apache TVM with a search engine written in Rust."""

from __future__ import annotations

from fastsearch._core import __version__
from fastsearch.errors import (
    DatabaseError,
    FastsearchError,
    InternalError,
    InvalidTarget,
    InvalidTrace,
    MalformedInput,
    MeasurementError,
    ScheduleError,
    UnsupportedWorkload,
)
from fastsearch.partition import partition
from fastsearch.sample import sample
from fastsearch.tune import TuneResult, tune

__all__ = [
    "DatabaseError",
    "FastsearchError",
    "InternalError",
    "InvalidTarget",
    "InvalidTrace",
    "MalformedInput",
    "MeasurementError",
    "ScheduleError",
    "TuneResult",
    "UnsupportedWorkload",
    "__version__",
    "partition",
    "sample",
    "tune",
]
