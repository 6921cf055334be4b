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


class UnsupportedTarget(FastsearchError):
    """The target is well formed, but fastsearch cannot search it: its sketches, features and
    cost models are CPU-only for now, and a GPU target would silently get CPU schedules."""


class DatabaseError(FastsearchError):
    """The tuning database is unreadable or inconsistent."""


class MeasurementError(FastsearchError):
    """No candidate could be built and measured."""


class RemoteError(FastsearchError):
    """The RPC tracker is unreachable, malformed, or has no device with the requested key."""


class DatabaseWarning(UserWarning):
    """The tuning database was repaired on load (e.g. the torn last line of a killed run)."""


__all__ = [
    "DatabaseError",
    "DatabaseWarning",
    "FastsearchError",
    "InternalError",
    "InvalidTarget",
    "InvalidTrace",
    "MalformedInput",
    "MeasurementError",
    "RemoteError",
    "ScheduleError",
    "UnsupportedTarget",
    "UnsupportedWorkload",
]
