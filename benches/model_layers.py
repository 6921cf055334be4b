"""Where a tuned model's time goes, kernel by kernel, next to onnxruntime's per-node times.

For a library ``fastsearch tune`` exported (``model_tuned.so``), every kernel call of one
inference is timed four ways in this process: inside the model's sequence (the kernels called
back to back in the model's order, each timed around its call, over ``--rounds`` inferences),
again (in the same sequence, a second call right after the first: what is left of the first's
loss is not the cache's state), alone (the same call in a tight loop, as tuning timed it: its
weights and input stay in the caches), and right after the kernel that ran before it in the
model (the pair in a loop, less the first alone). onnxruntime runs the same ONNX model with its
profiler on, on the same threads, and prints its per-node medians (the profiler adds about 15%
to each).

    TVM_NUM_THREADS=2 python -m benches.model_layers --zoo resnet-18 --threads 2 /tmp/r18/model_tuned.so
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _loop_us(calls: list[tuple[Any, tuple]], n: int = 200) -> float:
    for f, a in calls:
        f(*a)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            for f, a in calls:
                f(*a)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def _sequence_us(calls: list[tuple[str, Any, tuple]], rounds: int, again: bool) -> list[float]:
    """Mean us of each call in the model's order over ``rounds`` inferences (after three warm-up
    ones); ``again``: each call is made twice in a row and the second is timed."""
    totals = [0.0] * len(calls)
    for r in range(rounds + 3):
        for i, (_, f, a) in enumerate(calls):
            if again:
                f(*a)
            t0 = time.perf_counter()
            f(*a)
            if r >= 3:
                totals[i] += time.perf_counter() - t0
    return [t / rounds * 1e6 for t in totals]


def fastsearch_rows(
    library: str, inputs: list[Any], rounds: int
) -> list[tuple[str, float, float, float, float, str]]:
    """(kernel, in sequence us, called again us, alone us, after its predecessor us, argument
    shapes) per call."""
    import tvm
    from fastsearch.graph.model_timing import kernel_calls
    from tvm import relax

    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    vm = relax.VirtualMachine(tvm.runtime.load_module(library), dev)
    calls, _ = kernel_calls(vm, args)
    seq = _sequence_us(calls, rounds, again=False)
    again = _sequence_us(calls, rounds, again=True)
    rows = []
    for i, (name, f, a) in enumerate(calls):
        alone = _loop_us([(f, a)])
        after = alone
        if i:
            _, pf, pa = calls[i - 1]
            after = _loop_us([(pf, pa), (f, a)]) - _loop_us([(pf, pa)])
        shapes = " ".join("x".join(str(int(d)) for d in x.shape) for x in a if hasattr(x, "shape"))
        rows.append((name, seq[i], again[i], alone, after, shapes))
    return rows


def onnxruntime_rows(
    onnx_file: str, feeds: dict[str, Any], threads: int, runs: int
) -> list[tuple[str, str, float, str]]:
    """(node, op, median us, output shape) per node of onnxruntime's profile."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(onnx_file, options, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    durations: dict[str, list[float]] = {}
    meta: dict[str, tuple[str, str]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            durations.setdefault(name, []).append(float(e["dur"]))
            meta[name] = (str(e["args"].get("op_name", "")), str(e["args"].get("output_type_shape", "")))
    skip = max(1, runs // 10)  # warm-up
    return [(n, meta[n][0], statistics.median(d[skip:] or d), meta[n][1]) for n, d in durations.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", required=True, help="the ONNX zoo model the library was tuned from")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=30, help="inferences timed kernel by kernel")
    parser.add_argument("library", help="model_tuned.so of a fastsearch tune run")
    args = parser.parse_args(argv)

    import onnx
    from fastsearch.testing import onnx_zoo

    model = onnx_zoo.build(args.zoo)
    feeds = onnx_zoo.model_input(model, seed=1)
    rows = fastsearch_rows(args.library, list(feeds.values()), args.rounds)
    width = max(len(r[0]) for r in rows)
    print(
        f"fastsearch ({args.library}), {args.threads} threads (TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')})"
    )
    print(f"{'kernel':<{width}}  {'in model':>9}  {'again':>9}  {'alone':>9}  {'after prev':>10}  arguments")
    for name, seq, again, alone, after, shapes in rows:
        print(f"{name:<{width}}  {seq:9.1f}  {again:9.1f}  {alone:9.1f}  {after:10.1f}  {shapes}")
    sums = "  ".join(f"{sum(r[k] for r in rows):9.1f}" for k in (1, 2, 3))
    print(f"{'sum':<{width}}  {sums}")
    with tempfile.TemporaryDirectory() as tmp:
        onnx_file = str(Path(tmp) / "model.onnx")
        onnx.save(model, onnx_file)
        nodes = onnxruntime_rows(onnx_file, feeds, args.threads, runs=max(50, 5 * args.rounds))
    width = max(len(n[0]) for n in nodes)
    print(f"\nonnxruntime, {args.threads} threads, profiler on")
    print(f"{'node':<{width}}  {'op':<18}  {'us':>9}  output")
    for name, op, us, shape in nodes:
        print(f"{name:<{width}}  {op:<18}  {us:9.1f}  {shape}")
    print(f"{'sum':<{width}}  {'':<18}  {sum(n[2] for n in nodes):9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
