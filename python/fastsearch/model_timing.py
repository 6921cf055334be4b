"""End-to-end timing of compiled Relax models, interleaved so that drift hits all alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

__all__ = ["paired_ratios", "time_interleaved"]


def time_interleaved(
    exes: list[Any], inputs: list[np.ndarray], rounds: int, min_repeat_ms: int = 200
) -> tuple[list[list[float]], list[np.ndarray]]:
    """Seconds per call of ``main`` of each executable, ``rounds`` interleaved rounds of at
    least ``min_repeat_ms`` each (round ``r`` starts at executable ``r mod n``, so no one always
    runs right after another), and each one's output on ``inputs``."""
    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    vms = [relax.VirtualMachine(exe, dev) for exe in exes]
    outputs = [_as_numpy(vm["main"](*args)) for vm in vms]
    timers = [vm.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=min_repeat_ms) for vm in vms]
    for timer in timers:
        timer(*args)  # warm-up
    results: list[list[float]] = [[] for _ in exes]
    n = len(timers)
    for r in range(rounds):
        for k in range(n):
            i = (r + k) % n
            results[i].append(float(timers[i](*args).results[0]))
    return results, outputs


def paired_ratios(times: list[float], base: list[float]) -> list[float]:
    """Per-round ratios ``times[r] / base[r]``, sorted: rounds timed together share the
    machine's state, so their ratio is steadier than a ratio of medians."""
    return sorted(t / b for t, b in zip(times, base, strict=True))


def _as_numpy(value: Any) -> np.ndarray:
    """A model output (a tensor, or the first tensor of a tuple) as numpy."""
    while not hasattr(value, "numpy"):
        value = value[0]
    return value.numpy()
