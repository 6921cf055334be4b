"""Time compiled kernels side by side in several fresh processes.

One process's timing of a kernel carries where that process put its arguments and code: on this
2-core machine the same compiled C1D kernel timed 325, 381 and 618 us in three fresh processes,
and a C2D kernel that timed 215 us in four processes timed 436 us in the suite's one. Most of
that moves every kernel of a process alike (the process effect, about 12% standard deviation in
log time on C1D; what is left per kernel and process is about 6%), so kernels timed together in
one process compare far better than their absolute times do.

:func:`retime_in_processes` exports the kernels once, then each of ``processes`` fresh processes
loads them, draws its own random arguments (seeded by the process's index), and times them in
``repeat`` interleaved rounds (every other process in reverse order). It returns each process's
median per kernel; :func:`pair` turns two kernels' results into medians over processes and
per-process ratios, and :func:`summarize` adds the median of those ratios, the figure the suite
reports.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def retime_in_processes(
    libs: list[Any],
    func: Any,
    repeat: int,
    processes: int,
    min_repeat_ms: int = 100,
    device: str = "cpu",
) -> list[list[float]]:
    """Seconds per call of ``main`` of each of ``libs`` (compiled executables of ``func``): one
    list per process, one median per kernel. ``device`` is the runtime device the kernels run
    on (``"cpu"``, or ``"cuda"`` for kernels built for a CUDA target: device 0)."""
    from tvm.s_tir import meta_schedule as ms

    info = [a.as_json() for a in ms.arg_info.ArgInfo.from_prim_func(func)]
    per_process: list[list[float]] = []
    with tempfile.TemporaryDirectory(prefix="kernel_retime_") as tmp:
        paths = []
        for i, lib in enumerate(libs):
            path = Path(tmp) / f"kernel_{i}.so"
            lib.export_library(str(path))
            paths.append(str(path))
        spec = Path(tmp) / "spec.json"
        spec.write_text(
            json.dumps({"paths": paths, "args": info, "min_repeat_ms": min_repeat_ms, "device": device})
        )
        for p in range(processes):
            out = subprocess.run(
                [sys.executable, __file__, str(spec), str(repeat), str(p)],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                raise RuntimeError(f"re-timing process {p} failed:\n{out.stderr[-2000:]}")
            per_process.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return per_process


def pair(per_process: list[list[float]], a: int, b: int) -> tuple[float, float, list[float]]:
    """Kernels ``a`` and ``b``: their medians over processes (us) and every process's ratio
    ``a / b``, in process order."""
    return (
        statistics.median(row[a] for row in per_process) * 1e6,
        statistics.median(row[b] for row in per_process) * 1e6,
        [row[a] / row[b] for row in per_process],
    )


def summarize(per_process: list[list[float]]) -> dict[str, Any]:
    """For two kernels (fastsearch's, then MetaSchedule's): medians over processes (us), every
    process's ratio, and the median of those ratios."""
    fs_us, ms_us, ratios = pair(per_process, 0, 1)
    return {
        "fastsearch_retimed_us": fs_us,
        "metaschedule_retimed_us": ms_us,
        "retimed_ratio": statistics.median(ratios),
        "retimed_ratios_per_process": ratios,
    }


def _worker(spec_path: str, repeat: int, index: int) -> None:
    import tvm
    from fastsearch.measure.measurer import random_arguments
    from tvm.s_tir import meta_schedule as ms

    spec = json.loads(Path(spec_path).read_text())
    dev = tvm.device(spec.get("device", "cpu"), 0)
    info = [ms.arg_info.ArgInfo.from_json(a) for a in spec["args"]]
    args = [tvm.runtime.tensor(a, dev) for a in random_arguments(info, seed=index)]
    order = list(range(len(spec["paths"])))
    if index % 2:
        order.reverse()
    timers = {}
    for i in order:
        lib = tvm.runtime.load_module(spec["paths"][i])
        timers[i] = lib.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=spec["min_repeat_ms"])
        timers[i](*args)  # warm-up
    times: dict[int, list[float]] = {i: [] for i in order}
    for _ in range(repeat):
        for i in order:
            times[i].append(float(timers[i](*args).results[0]))
    print(json.dumps([statistics.median(times[i]) for i in range(len(order))]))


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
