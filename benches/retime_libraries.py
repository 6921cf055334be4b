"""Re-time exported tuned models of one zoo model side by side with onnxruntime, in fresh processes.

Each ``LABEL=PATH`` is a library a tuning run exported (``fastsearch tune`` writes
``model_tuned.so`` into its work directory). They are timed together, in interleaved rounds, in
``--processes`` fresh processes; onnxruntime runs the same ONNX model in processes of its own,
alternating with them (:func:`fastsearch.graph.model_timing.time_in_fresh_processes`). Every output is
checked against ONNX's reference evaluator.

    fastsearch tune --model mobilenet-v2-small --trials 300 --layout NCHW --work-dir /tmp/nchw
    fastsearch tune --model mobilenet-v2-small --trials 300 --layout NCHWc --work-dir /tmp/nchwc
    python -m benches.retime_libraries --zoo mobilenet-v2-small --threads 2 \\
        nchw=/tmp/nchw/model_tuned.so nchwc=/tmp/nchwc/model_tuned.so
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", required=True, help="the ONNX zoo model the libraries were tuned from")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("libraries", nargs="+", metavar="LABEL=PATH")
    args = parser.parse_args(argv)

    import numpy as np
    import onnx
    from fastsearch.graph.model_timing import time_in_fresh_processes
    from fastsearch.testing import onnx_zoo

    libs = dict(item.split("=", 1) for item in args.libraries)
    model = onnx_zoo.build(args.zoo)
    feeds = onnx_zoo.model_input(model, seed=1)
    ref = onnx_zoo.reference_outputs(model, feeds)[0]
    from benches.runs import busy_warning, other_cpu_load

    warning = busy_warning(other_cpu_load())
    with tempfile.TemporaryDirectory() as tmp:
        onnx_file = Path(tmp) / "model.onnx"
        onnx.save(model, onnx_file)
        timing = time_in_fresh_processes(
            libs,
            list(feeds.values()),
            args.threads,
            onnx_file=onnx_file,
            processes=args.processes,
            rounds=args.rounds,
        )
    base = "onnxruntime" if "onnxruntime" in timing.times else next(iter(libs))
    if warning:
        print(warning + "\n")
    print(
        f"`{args.zoo}`, {args.threads} threads, {args.processes} fresh processes x {args.rounds} rounds "
        f"(onnxruntime in processes of its own)\n"
    )
    print(f"| | median (us) | fastest round (us) | vs {base} | max abs diff to ONNX's reference |")
    print("|---|---:|---:|---:|---:|")
    for name in timing.times:
        diff = float(np.abs(timing.outputs[name].astype("float64") - ref).max())
        print(
            f"| {name} | {timing.median_us(name):.1f} | {min(timing.times[name]) * 1e6:.1f} | "
            f"{timing.ratio(name, base):.3f} | {diff:.1e} |"
        )
    names = list(libs)
    for i, a in enumerate(names):
        for b in names[:i]:
            print(f"\n{a} / {b}: {timing.ratio(a, b):.3f} (median of per-round ratios)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
