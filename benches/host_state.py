"""How steady this host's timing is: three small TVM kernels timed every few seconds.

Whole-model comparisons on shared 2-vCPU hosts move by 5-30% between runs minutes apart. This
bench shows when and how the host changes under the same code, so that a comparison can be
timed in one steady spell, or its figures read for what they are:

* ``sync``: a parallel kernel with one element of work a thread, so its time is the runtime's
  fork and join across the cores (how quickly the two vCPUs see each other's writes);
* ``copy``: an 8 MB read and an 8 MB write across both cores (memory and last-level cache);
* ``compute``: a chain of multiply-adds on data that stays in L1 (the cores' clock).

    TVM_NUM_THREADS=2 python -m benches.host_state --seconds 300

Each line is one sample; the summary gives each kernel's quantiles and how often ``sync``
changed spell (a sample more than 1.5x, or less than 1/1.5, of the one before).
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable


def _kernel(rows: int, cols: int, body: Callable, target) -> Callable[[], float]:  # type: ignore[type-arg, no-untyped-def]
    """Microseconds per call of ``B[i, j] = body(A, i, j)`` over ``rows`` x ``cols`` float32,
    rows split across the threads and each row vectorized by 16."""
    import numpy as np
    import tvm
    from tvm import s_tir, te

    a = te.placeholder((rows, cols), name="A")
    b = te.compute((rows, cols), lambda i, j: body(a, i, j), name="B")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    block = sch.get_sblock("B")
    i, j = sch.get_loops(block)
    sch.parallel(i)
    _, inner = sch.split(j, [None, 16])
    sch.vectorize(inner)
    lib = tvm.compile(sch.mod, target=target)
    dev = tvm.cpu()
    x = tvm.runtime.tensor(np.random.default_rng(0).random((rows, cols), dtype="float32"), dev)
    y = tvm.runtime.tensor(np.zeros((rows, cols), "float32"), dev)
    timer = lib.mod.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=100)
    return lambda: float(timer(x, y).mean) * 1e6


def _fma_chain(a, i, j):  # type: ignore[no-untyped-def]
    x = a[i, j]
    for _ in range(64):
        x = x * 0.999 + 0.001
    return x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    args = parser.parse_args(argv)

    import numpy as np
    from fastsearch.ir.target import resolve_target

    target = resolve_target("llvm")
    kernels = {
        "sync": _kernel(2, 64, lambda a, i, j: a[i, j] + 1.0, target),
        "copy": _kernel(2048, 1024, lambda a, i, j: a[i, j] * 2.0, target),
        "compute": _kernel(64, 1024, _fma_chain, target),
    }
    samples: dict[str, list[float]] = {name: [] for name in kernels}
    start = time.time()
    while time.time() - start < args.seconds:
        line = [f"{time.time() - start:7.1f} s"]
        for name, run in kernels.items():
            samples[name].append(run())
            line.append(f"{name} {samples[name][-1]:8.2f} us")
        print("  ".join(line), flush=True)
        time.sleep(args.every)
    print(f"\n{len(samples['sync'])} samples over {time.time() - start:.0f} s (us)\n")
    print("| kernel | min | median | p90 | max | max / min |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, values in samples.items():
        q = np.quantile(values, [0.0, 0.5, 0.9, 1.0])
        print(f"| {name} | {q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} | {q[3]:.2f} | {q[3] / q[0]:.2f} |")
    sync = samples["sync"]
    switches = sum(1 for a, b in itertools.pairwise(sync) if b > 1.5 * a or b < a / 1.5)
    print(f"\n`sync` changed spell {switches} times in {len(sync)} samples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
