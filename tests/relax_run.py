"""Running a Relax model on the CPU and comparing its output, for the layout and Winograd tests."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    """The first output of ``mod["main"]`` on ``inputs``, compiled for :data:`TARGET`."""
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    while not hasattr(out, "numpy"):
        out = out[0]
    return out.numpy()


def close(got: np.ndarray, ref: np.ndarray) -> None:
    """Equal up to float32 rounding, relative to the reference's largest magnitude."""
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max())))
