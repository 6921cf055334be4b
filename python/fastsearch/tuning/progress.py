"""A dependency-free progress bar on stderr: trials done / total, best latency so far, elapsed time.

On a terminal the bar redraws in place; otherwise (logs, pipes) it prints one line per update,
at most every ``min_interval_s`` seconds, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ProgressBar", "format_latency"]


def format_latency(us: float | None) -> str:
    """Human-readable latency from microseconds (``"-"`` when unknown)."""
    if us is None:
        return "-"
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.2f} us"


class ProgressBar:
    """Trials done out of ``total``, with the best latency so far.

    ``enabled=False`` makes every method a no-op. Use as a context manager so the line is
    finished (newline) at the end, whatever happens.
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        width: int = 30,
        label: str = "tuning",
        min_interval_s: float = 2.0,
    ) -> None:
        self.total = max(0, int(total))
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.label = label
        self.min_interval_s = min_interval_s
        self.done = 0
        self.failed = 0
        self.best_us: float | None = None
        self.start = time.perf_counter()
        self._last_print = 0.0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_state: tuple[int, float | None, int] | None = None

    def __enter__(self) -> Self:
        self.render(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(
        self,
        done: int | None = None,
        *,
        best_us: float | None = None,
        failed: int | None = None,
        advance: int = 0,
    ) -> None:
        """Set (or advance) the trials done, the best latency and the failure count, then redraw."""
        if done is not None:
            self.done = done
        self.done += advance
        if best_us is not None:
            self.best_us = best_us
        if failed is not None:
            self.failed = failed
        self.render()

    def _state(self) -> tuple[int, float | None, int]:
        return (self.done, self.best_us, self.failed)

    def line(self) -> str:
        """The current progress line (without carriage return or newline)."""
        total = max(self.total, 1)
        frac = min(1.0, self.done / total)
        filled = round(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        text = (
            f"{self.label} [{bar}] {self.done}/{self.total} trials  "
            f"best {format_latency(self.best_us)}  {elapsed:.0f}s"
        )
        if self.failed:
            text += f"  ({self.failed} failed)"
        return text

    def render(self, force: bool = False) -> None:
        """Draw the line: in place on a terminal, otherwise rate-limited full lines."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._tty:
            self.stream.write("\r\x1b[2K" + self.line())
        else:
            if not force and now - self._last_print < self.min_interval_s and self.done < self.total:
                return
            self._last_state = self._state()
            self.stream.write(self.line() + "\n")
        self._last_print = now
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line."""
        if not self.enabled:
            return
        if self._tty:
            self.stream.write("\r\x1b[2K" + self.line() + "\n")
        elif self._last_state != self._state():
            self.stream.write(self.line() + "\n")
        self.stream.flush()
        self.enabled = False
