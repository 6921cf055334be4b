"""Fresh-process timers for :mod:`benches.limits`: numpy's matmul (its BLAS) and, where it is
installed, PyTorch, on a given number of threads.

``python -m benches.limits_child SPEC.json`` (what
:func:`fastsearch.graph.model_timing.run_in_fresh_process` runs) writes its results as JSON to
the spec's ``out``. Each library runs in a process of its own: BLAS and PyTorch size their
thread pools at start, and TVM's pool in the harness's process would take their cores. Nothing
here imports TVM, and nothing sets ``OPENBLAS_CORETYPE`` or ``OPENBLAS_L2_SIZE``: which kernel
OpenBLAS picks is the caller's environment's to say, and this process only reports it.

A job is a dict: ``{"name", "kind": "matmul", "a": shape, "b": shape, "a_perm", "b_perm"}``
(``matmul(a.transpose(a_perm), b.transpose(b_perm))``, a permutation None for none),
``{"kind": "conv", "x": NCHW shape, "w": OIHW shape, "bias", "stride", "padding", "dilation",
"groups", "bn_relu"}`` or ``{"kind": "softmax", "x": shape}`` (last axis); PyTorch takes all
three, numpy matmuls only.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: threadpoolctl's fields that say which BLAS, which of its kernels and how many threads.
_BLAS_FIELDS = ("user_api", "internal_api", "version", "architecture", "threading_layer", "num_threads")


def time_call(fn: Callable[[], Any], rounds: int, min_repeat_ms: float) -> list[float]:
    """Seconds per call of ``fn``: ``rounds`` rounds, each calling it for at least
    ``min_repeat_ms``, after one warm-up call."""
    fn()
    out = []
    for _ in range(rounds):
        count, t0 = 0, time.perf_counter()
        while True:
            fn()
            count += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_repeat_ms / 1e3:
                break
        out.append(elapsed / count)
    return out


def _operands(job: dict[str, Any], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A matmul job's operands, as views in the shapes the product takes (no copy)."""
    a = rng.uniform(-1, 1, job["a"]).astype("float32")
    b = rng.uniform(-1, 1, job["b"]).astype("float32")
    if job.get("a_perm"):
        a = a.transpose(job["a_perm"])
    if job.get("b_perm"):
        b = b.transpose(job["b_perm"])
    return a, b


def _numpy(spec: dict[str, Any]) -> dict[str, Any]:
    """numpy's matmul jobs, within threadpoolctl's limit of ``threads`` BLAS threads where it is
    installed (else only the ``*_NUM_THREADS`` variables the caller set hold them)."""
    rng = np.random.default_rng(0)
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        threadpool_info = threadpool_limits = None  # type: ignore[assignment]
    times: dict[str, list[float]] = {}
    blas: list[dict[str, Any]] | None = None
    limit = threadpool_limits(limits=spec["threads"], user_api="blas") if threadpool_limits else None
    try:
        if threadpool_info is not None:
            blas = [
                {k: v for k, v in lib.items() if k in _BLAS_FIELDS}
                for lib in threadpool_info()
                if lib.get("user_api") == "blas"
            ]
        for job in spec["jobs"]:
            a, b = _operands(job, rng)
            out = np.empty(
                np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), "float32"
            )
            call = functools.partial(np.matmul, a, b, out=out)
            times[job["name"]] = time_call(call, spec["rounds"], spec["min_repeat_ms"])
    finally:
        if limit is not None:
            limit.restore_original_limits()
    return {"times": times, "blas": blas, "numpy": np.__version__}


def _torch_job(torch: Any, job: dict[str, Any], rng: np.random.Generator) -> Callable[[], Any]:
    """One job as a PyTorch call on CPU tensors (random values; only the time is kept)."""
    if job["kind"] == "matmul":
        a, b = (torch.from_numpy(np.ascontiguousarray(x)) for x in _operands(job, rng))
        return lambda: torch.matmul(a, b)
    x = torch.from_numpy(rng.uniform(-1, 1, job["x"]).astype("float32"))
    if job["kind"] == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    w = torch.from_numpy(rng.uniform(-1, 1, job["w"]).astype("float32"))
    bias = torch.from_numpy(rng.uniform(-1, 1, job["w"][0]).astype("float32")) if job["bias"] else None
    conv = getattr(torch.nn.functional, f"conv{len(job['w']) - 2}d")
    scale = torch.from_numpy(rng.uniform(-1, 1, [job["w"][0]] + [1] * (len(job["w"]) - 2)).astype("float32"))

    def call() -> Any:
        y = conv(x, w, bias, job["stride"], job["padding"], job["dilation"], job["groups"])
        return torch.relu(y * scale + scale) if job["bn_relu"] else y

    return call


def _torch(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(spec["threads"])
    rng = np.random.default_rng(0)
    times = {}
    with torch.no_grad():
        for job in spec["jobs"]:
            times[job["name"]] = time_call(_torch_job(torch, job, rng), spec["rounds"], spec["min_repeat_ms"])
    return {"times": times, "torch": torch.__version__, "threads": torch.get_num_threads()}


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = _numpy(spec) if spec["library"] == "numpy" else _torch(spec)
    Path(spec["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
