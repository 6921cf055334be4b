"""Stand-in measurements for search tests: a deterministic latency for a candidate's key, and a
loop that feeds a sampler's proposals back to it as measured."""

from __future__ import annotations

import json
from typing import Any


def fake_latency(key: str) -> float:
    """A deterministic stand-in for a measurement: prefers wide innermost tiles."""
    decisions = json.loads(key)[1]
    tiles = [d[1] for d in decisions if isinstance(d[1], list) and len(d[1]) == 4]
    return 1.0 / (1.0 + sum(t[-1] for t in tiles))


def measure_until(sampler: Any, func: Any, target: Any, history: dict[str, float], count: int) -> None:
    """Batches of 16 from ``sampler`` (rounds 0, 1, ...), each candidate "measured" with
    :func:`fake_latency` into ``history``, until it holds ``count`` records."""
    round_index = 0
    while len(history) < count:
        batch = sampler(func, target, 16, round_index, set(history))
        history.update((c.key, fake_latency(c.key)) for c in batch)
        round_index += 1
