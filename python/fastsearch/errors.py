"""Exception hierarchy of fastsearch.

Every error fastsearch raises on purpose derives from :class:`FastsearchError`; the Rust core's
errors arrive as the subclass that names their kind.
"""

from __future__ import annotations

from fastsearch._core import (
    FastsearchError,
    InternalError,
    InvalidTrace,
    MalformedInput,
    ScheduleError,
    UnsupportedWorkload,
)


class InvalidTarget(FastsearchError):
    """The target is unknown or malformed."""


class DatabaseError(FastsearchError):
    """The tuning database is unreadable or inconsistent."""


class MeasurementError(FastsearchError):
    """No candidate could be built and measured."""


__all__ = [
    "DatabaseError",
    "FastsearchError",
    "InternalError",
    "InvalidTarget",
    "InvalidTrace",
    "MalformedInput",
    "MeasurementError",
    "ScheduleError",
    "UnsupportedWorkload",
]
