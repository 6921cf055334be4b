"""What every end-to-end bench records about its run: target, host, date, load and command."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from typing import Any

from fastsearch.ir.target import physical_cores


def run_metadata(script: str, target: object, argv: list[str] | None) -> dict[str, Any]:
    """The run's target, host, UTC date, load average and the command that reproduces it."""
    return {
        "target": str(target),
        "host": f"{platform.machine()}, {physical_cores()} physical cores",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load": os.getloadavg(),
        "command": f"python benches/{script} " + " ".join(sys.argv[1:] if argv is None else argv),
    }
