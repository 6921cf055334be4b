"""Timing candidates outside a tuning run: the step the bench scripts that measure sketch
candidates (``first_batch.py``, ``analytical_accuracy.py``) share."""

from __future__ import annotations

from collections.abc import Iterable

import tvm
from fastsearch.measure.measurer import MeasureConfig, Measurer
from fastsearch.search.sample import Postprocessor, base_schedule, replay
from tvm.s_tir import meta_schedule as ms


def measure_keys(
    func: tvm.tirx.PrimFunc, target: tvm.target.Target, keys: Iterable[str]
) -> dict[str, float | None]:
    """Replays each candidate key (trace JSON) on ``func`` with fastsearch's postprocessors and
    times those that replay in one measuring session, so that all see the same machine state.
    Returns mean microseconds by key, in the order given, None where building or running
    failed; keys that do not replay are left out."""
    post, base = Postprocessor(func, target), base_schedule(func)
    replayed = [(key, replay(base, key, post)) for key in dict.fromkeys(keys)]
    kept = [(key, sch) for key, sch in replayed if sch is not None]
    with Measurer(target, MeasureConfig(repeat=3, min_repeat_ms=20)) as measurer:
        results = measurer.measure([sch.mod for _, sch in kept], ms.arg_info.ArgInfo.from_prim_func(func))
        Measurer.release(results)
    return {key: res.mean_us if res.ok else None for (key, _), res in zip(kept, results, strict=True)}
