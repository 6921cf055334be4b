"""End-to-end timing of compiled Relax models, interleaved so that drift hits all alike.

:func:`time_interleaved` times executables in this process. A process that has just tuned
reads a model up to 3x slower than a fresh one (its memory and thread pool are in another
state), so what is reported to users is timed by :func:`time_in_fresh_processes`: each of
several fresh processes loads the exported models (and, optionally, an ONNX file run by
onnxruntime on the same threads) and times them in interleaved rounds. :func:`profile_model`
times every call the VM makes (each kernel, and the VM's own builtins), the kernels back to back
in the model's order without the VM, and, given the model with every kernel emptied
(:func:`hollow_kernels`), the VM's own time directly.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from fastsearch.errors import MeasurementError, UnsupportedWorkload
from fastsearch.ir.threads import kernel_threads, target_threads
from fastsearch.ir.vector_math import TIR_PIPELINE

__all__ = [
    "ORT_LEVELS",
    "FreshTiming",
    "ProfileRow",
    "VMProfile",
    "describe_end_to_end",
    "end_to_end",
    "hollow_kernels",
    "kernel_calls",
    "model_inputs",
    "paired_ratios",
    "profile_model",
    "run_in_fresh_process",
    "time_in_fresh_processes",
    "time_interleaved",
]


#: onnxruntime's graph optimization levels by name. ``all`` adds the layout passes, which turn a
#: convolution into MLAS's NCHWc one between reorders of its input and output: faster on some
#: convolutions than ``extended``'s plain NCHW kernel, slower on others (a single 1x1 conv).
ORT_LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


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


# Fresh processes ----------------------------------------------------------------------------


@dataclass
class FreshTiming:
    """Seconds per inference of each timed model, every round of every process
    (``times[name]``), and each model's output on the inputs (from the first process)."""

    times: dict[str, list[float]]
    outputs: dict[str, np.ndarray]
    threads: int
    processes: int
    profile: VMProfile | None = None  # the profiled model's calls, from the first process

    def median_us(self, name: str) -> float:
        return statistics.median(self.times[name]) * 1e6

    def ratio(self, name: str, base: str) -> float:
        """Median of the per-round ratios ``name / base`` (rounds share the machine's state)."""
        return statistics.median(paired_ratios(self.times[name], self.times[base]))


def time_in_fresh_processes(
    libraries: dict[str, str | os.PathLike[str]],
    inputs: Sequence[np.ndarray],
    threads: int,
    onnx_file: str | os.PathLike[str] | None = None,
    processes: int = 3,
    rounds: int = 5,
    min_repeat_ms: int = 200,
    timeout_s: float = 600.0,
    profile: str | None = None,
    hollow: str | os.PathLike[str] | None = None,
    ort_optimization: str = "all",
) -> FreshTiming:
    """Time exported Relax VM libraries (``name -> path`` of ``exe.export_library``) and, when
    given and installed, ``onnx_file`` under onnxruntime (as ``"onnxruntime"``), ``processes``
    times in fresh processes of ``rounds`` interleaved rounds each, every one on ``threads``
    threads (``TVM_NUM_THREADS``; onnxruntime's intra-op threads). ``profile`` names a library
    whose every VM call the first process also times (:func:`profile_model`); ``hollow``, that
    library built from :func:`hollow_kernels`, gives the profile the VM's own time.
    ``ort_optimization`` is onnxruntime's graph optimization level (:data:`ORT_LEVELS`).

    onnxruntime runs in processes of its own, each right before or after (alternately) one of
    the TVM libraries' processes, and its round ``r`` pairs with their round ``r``: each
    runtime's thread pool keeps its threads spinning between calls, and in one process the two
    pools took each other's cores (a tuned model read 1.7x slower beside onnxruntime than
    alone on a 2-core machine, onnxruntime about 1.3x)."""
    if ort_optimization not in ORT_LEVELS:
        raise ValueError(f"ort_optimization {ort_optimization!r}: expected one of {', '.join(ORT_LEVELS)}")
    use_ort = onnx_file is not None and _has_onnxruntime()
    names = list(libraries) + (["onnxruntime"] if use_ort else [])
    env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    times: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, np.ndarray] = {}
    found: VMProfile | None = None
    with tempfile.TemporaryDirectory(prefix="fastsearch_timing_") as tmp:
        np.savez(Path(tmp) / "inputs.npz", *inputs)
        base = {
            "inputs": str(Path(tmp) / "inputs.npz"),
            "threads": threads,
            "rounds": rounds,
            "min_repeat_ms": min_repeat_ms,
            "hollow": str(hollow) if hollow is not None else None,
        }
        for p in range(processes):
            tvm_spec: dict[str, Any] = {
                **base,
                "libraries": {n: str(path) for n, path in libraries.items()},
                "onnx": None,
                "first": p,  # which model each process's first round starts with
                "profile": profile if p == 0 else None,
            }
            ort_spec: dict[str, Any] = {
                **base,
                "libraries": {},
                "onnx": str(onnx_file),
                "ort_optimization": ort_optimization,
                "first": 0,
                "profile": None,
            }
            # no TVM process where there is no library to time (onnxruntime alone)
            specs: list[dict[str, Any]] = ([tvm_spec] if libraries else []) + ([ort_spec] if use_ort else [])
            for spec in specs if p % 2 == 0 else reversed(specs):
                data = _run_child(spec, Path(tmp), f"{p}_{len(spec['libraries'])}", env, timeout_s)
                for n in [*spec["libraries"], *(["onnxruntime"] if spec["onnx"] else [])]:
                    times[n].extend(float(x) for x in data[f"times/{n}"])
                    outputs.setdefault(n, data[f"output/{n}"])
                if "profile" in data:
                    rows = json.loads(str(data["profile"]))
                    found = VMProfile(rows=[ProfileRow(**r) for r in rows.pop("rows")], **rows)
    return FreshTiming(times=times, outputs=outputs, threads=threads, processes=processes, profile=found)


def run_in_fresh_process(
    module: str, spec: dict, spec_path: Path, env: dict[str, str], timeout_s: float, what: str
) -> None:
    """Run ``python -m module spec_path`` (``spec`` written there as JSON) in a fresh interpreter
    with ``env``; raises :class:`MeasurementError` naming ``what`` if it fails."""
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, "-m", module, str(spec_path)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise MeasurementError(f"{what} in a fresh process failed: {proc.stderr.strip()[-2000:]}")


def kernel_calls(vm: Any, args: Sequence[Any]) -> tuple[list[tuple[str, Any, tuple]], Any]:
    """Every kernel call of one inference of ``vm["main"](*args)`` in order (name, function,
    arguments; the VM's own builtins left out), and what it returned."""
    calls: list[tuple[str, Any, tuple]] = []

    def capture(func: Any, name: str, before: bool, ret: Any, *rest: Any) -> int:
        if before and not name.startswith("vm."):
            calls.append((name, func, rest))
        return 0

    vm.set_instrument(capture)
    out = vm["main"](*args)
    return calls, out


def _run_child(spec: dict, tmp: Path, tag: str, env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """Run :func:`_child` on ``spec`` in a fresh interpreter; its arrays by name."""
    spec = {**spec, "out": str(tmp / f"out{tag}.npz")}
    run_in_fresh_process(
        "fastsearch.graph.model_timing", spec, tmp / f"spec{tag}.json", env, timeout_s, "timing the models"
    )
    with np.load(spec["out"]) as data:
        return {k: data[k] for k in data.files}


def _has_onnxruntime() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _ort_runner(path: str, feeds: dict[str, np.ndarray], threads: int, optimization: str = "all") -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, ORT_LEVELS[optimization])
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)[0]


def _child(spec_path: str) -> None:
    """One fresh process: load every model, check outputs, time interleaved rounds."""
    spec = json.loads(Path(spec_path).read_text())
    with np.load(spec["inputs"]) as data:
        inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    runners: dict[str, Any] = {}
    for name, path in spec["libraries"].items():
        vm = relax.VirtualMachine(tvm.runtime.load_module(path), dev)
        runners[name] = lambda vm=vm: _as_numpy(vm["main"](*args))
    if spec["onnx"]:
        import onnx

        model = onnx.load(spec["onnx"], load_external_data=False)
        feeds = {v.name: a for v, a in zip(model.graph.input, inputs)}
        runners["onnxruntime"] = _ort_runner(
            spec["onnx"], feeds, int(spec["threads"]), spec.get("ort_optimization", "all")
        )
    names = list(runners)
    out: dict[str, np.ndarray] = {}
    for n in names:
        out[f"output/{n}"] = np.asarray(runners[n]())
    times: dict[str, list[float]] = {n: [] for n in names}
    budget = spec["min_repeat_ms"] / 1e3
    for n in names:  # warm-up
        runners[n]()
    for r in range(int(spec["rounds"])):
        for k in range(len(names)):
            name = names[(r + k + int(spec["first"])) % len(names)]
            run = runners[name]
            count, t0 = 0, time.perf_counter()
            while True:
                run()
                count += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= budget:
                    break
            times[name].append(elapsed / count)
    for n in names:
        out[f"times/{n}"] = np.asarray(times[n])
    if spec.get("profile"):
        exe = tvm.runtime.load_module(spec["libraries"][spec["profile"]])
        hollow = tvm.runtime.load_module(spec["hollow"]) if spec.get("hollow") else None
        prof = profile_model(exe, inputs, hollow=hollow)
        out["profile"] = np.asarray(
            json.dumps(
                {
                    "rows": [r.__dict__ for r in prof.rows],
                    "total_us": prof.total_us,
                    "sequence_us": prof.sequence_us,
                    "hollow_us": prof.hollow_us,
                }
            )
        )
    # numpy's stub reads a keyword array as its allow_pickle flag
    np.savez(spec["out"], **out)  # type: ignore[arg-type]


def end_to_end(
    result: Any,
    source: tvm.IRModule,
    onnx_file: str | os.PathLike[str] | None = None,
    processes: int = 3,
    rounds: int = 5,
    profile: bool = False,
) -> FreshTiming:
    """A tuned model's latency before and after tuning, in fresh processes.

    ``result`` is a :class:`fastsearch.TuneResult` of a Relax model and ``source`` the
    model as it was given to ``tune`` (before the inference pipeline). ``"untuned"`` is
    ``source`` as ``tvm.compile`` builds it with TVM's default schedules, ``"tuned"`` is
    ``result.compile()``; with ``onnx_file`` (and onnxruntime installed) ``"onnxruntime"`` runs
    the same model. Both libraries are written to the run's work directory. Every model runs on
    the target's ``num-cores`` threads (``TVM_NUM_THREADS`` where the user set it, as in
    tuning), on the same random inputs (:func:`model_inputs`);
    ``profile`` also times every VM call of the tuned model (``FreshTiming.profile``)."""

    threads = kernel_threads(result.target) or target_threads(result.target)
    inputs = model_inputs(source, seed=1)
    work = Path(result.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    libraries = {"untuned": work / "model_untuned.so", "tuned": work / "model_tuned.so"}
    tvm.compile(source, target=result.target).export_library(str(libraries["untuned"]))
    tuned = result.best_module()
    tvm.compile(tuned, target=result.target, tir_pipeline=TIR_PIPELINE).export_library(
        str(libraries["tuned"])
    )
    hollow = None
    if profile:
        hollow = work / "model_tuned_hollow.so"
        tvm.compile(hollow_kernels(tuned), target=result.target, tir_pipeline=TIR_PIPELINE).export_library(
            str(hollow)
        )
    return time_in_fresh_processes(
        {n: str(p) for n, p in libraries.items()},
        inputs,
        threads,
        onnx_file=onnx_file,
        processes=processes,
        rounds=rounds,
        profile="tuned" if profile else None,
        hollow=hollow,
    )


def describe_end_to_end(timing: FreshTiming) -> list[str]:
    """The CLI's lines for :func:`end_to_end`: latencies, ratios, and whether outputs agree."""
    before, after = timing.median_us("untuned"), timing.median_us("tuned")
    line = (
        f"end to end   untuned {before:.1f} us, tuned {after:.1f} us "
        f"({timing.ratio('untuned', 'tuned'):.2f}x faster)"
    )
    if "onnxruntime" in timing.times:
        line += (
            f", onnxruntime {timing.median_us('onnxruntime'):.1f} us "
            f"(tuned / onnxruntime {timing.ratio('tuned', 'onnxruntime'):.2f})"
        )
    line += (
        f"; {timing.threads} threads, medians of {timing.processes} fresh processes x "
        f"{len(timing.times['tuned']) // timing.processes} interleaved rounds"
    )
    tuned = timing.outputs["tuned"]
    checks = []
    for other in ("untuned", "onnxruntime"):
        if other in timing.outputs:
            ref = timing.outputs[other]
            diff = (
                float(np.abs(tuned.astype("float64") - ref).max()) if tuned.shape == ref.shape else math.inf
            )
            ok = tuned.shape == ref.shape and np.allclose(
                tuned, ref, rtol=1e-3, atol=1e-4 * (float(np.abs(ref).max()) or 1.0)
            )
            checks.append(f"{'matches' if ok else 'DIFFERS FROM'} {other} (max diff {diff:.1e})")
    return [line, "outputs      tuned " + ", ".join(checks)]


# Profiling ----------------------------------------------------------------------------------


@dataclass
class ProfileRow:
    """One function the VM calls: how many calls per inference, microseconds per inference
    (timed around each call), and whether it is a kernel or one of the VM's builtins."""

    name: str
    calls: float
    us: float
    kind: str  # "kernel" or "vm"


@dataclass
class VMProfile:
    """Where a model's inference time goes.

    ``rows``: every called function, slowest first (a kernel's figure is the kernel alone in a
    tight loop). ``total_us``: one uninstrumented inference. ``sequence_us``: the model's kernel
    calls made back to back, in order, on the model's own buffers, without the VM: what the
    kernels cost in the model, where each reads what the last one wrote (with several threads,
    often written by another core). ``hollow_us``: the same model with every kernel emptied
    (:func:`hollow_kernels`), so its VM program alone: allocations, builtins, instruction
    dispatch and the calls themselves (``None`` when not measured)."""

    rows: list[ProfileRow] = field(default_factory=list)
    total_us: float = 0.0
    sequence_us: float = 0.0
    hollow_us: float | None = None

    @property
    def kernel_us(self) -> float:
        """The kernels' time, each timed alone in a loop (warm caches, threads spinning)."""
        return sum(r.us for r in self.rows if r.kind == "kernel")

    @property
    def vm_us(self) -> float:
        """The VM's own time: the hollow model's time when measured, else the total less the
        kernels back to back."""
        if self.hollow_us is not None:
            return self.hollow_us
        return max(0.0, self.total_us - self.sequence_us)

    def table(self) -> str:
        width = max([len("kernels back to back, no VM")] + [len(r.name) for r in self.rows])
        lines = [f"{'function':<{width}}  {'kind':<6}  {'calls':>5}  {'us':>9}  {'share':>6}"]
        for r in self.rows:
            # A builtin's figure is mostly the instrumentation's callback: no share of the total.
            share = (
                f"{100 * r.us / self.total_us:5.1f}%" if self.total_us and r.kind == "kernel" else "     -"
            )
            lines.append(f"{r.name:<{width}}  {r.kind:<6}  {r.calls:>5.0f}  {r.us:>9.1f}  {share:>6}")
        how = "the model with empty kernels" if self.hollow_us is not None else "total - back to back"
        lines += [
            "(vm rows: timed through the instrumentation callback, which dominates them)",
            f"{'total (uninstrumented)':<{width}}  {'':<6}  {'':>5}  {self.total_us:>9.1f}",
            f"{'kernels, each alone':<{width}}  {'':<6}  {'':>5}  {self.kernel_us:>9.1f}",
            f"{'kernels back to back, no VM':<{width}}  {'':<6}  {'':>5}  {self.sequence_us:>9.1f}",
            f"{'VM own time':<{width}}  {'':<6}  {'':>5}  {self.vm_us:>9.1f}  ({how})",
        ]
        return "\n".join(lines)


def hollow_kernels(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (a fused Relax model) with the body of every PrimFunc replaced by a no-op: the
    same VM program, with its allocations, builtins and calls, and no kernel work. Its time is
    the VM's own time; its outputs are meaningless."""
    funcs = {}
    for gvar, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            func = func.with_body(tvm.tirx.Evaluate(0))
        funcs[gvar] = func
    return tvm.IRModule(funcs, attrs=mod.attrs)


def profile_model(
    exe: Any, inputs: Sequence[np.ndarray], runs: int = 20, hollow: Any | None = None
) -> VMProfile:
    """Time every call of ``main`` of a Relax VM executable on ``inputs`` over ``runs``
    inferences (VM instrumentation), one inference without instrumentation, and the model's
    kernel calls back to back without the VM. ``hollow``, the same model built from
    :func:`hollow_kernels`, is timed too, for the VM's own time.

    A kernel's row is that kernel called alone in a tight loop on the arguments the model gives
    it (calls timed inside the instrumented model carry the callback and the thread pool waking
    up after it); a VM builtin's is timed around each call, through the instrumentation's
    callback (about a microsecond of which is the callback's)."""
    dev = tvm.cpu(0)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    plain = relax.VirtualMachine(exe, dev)
    total = _loop_us(plain["main"], tuple(args), min_s=0.1)  # timed as the kernels are below
    hollow_us = None
    if hollow is not None:
        hollow_us = _loop_us(relax.VirtualMachine(hollow, dev)["main"], tuple(args), min_s=0.1)
    vm = relax.VirtualMachine(exe, dev)
    spent: dict[str, float] = {}
    calls: dict[str, int] = {}
    started: list[float] = []

    def instrument(func: Any, name: str, before: bool, ret: Any, *rest: Any) -> int:
        now = time.perf_counter()
        if before:
            started.append(now)
        else:
            spent[name] = spent.get(name, 0.0) + now - started.pop()
            calls[name] = calls.get(name, 0) + 1
        return 0

    sequence, _ = kernel_calls(vm, args)  # the kernels and the arguments each is called with
    kernels = {name: (func, fargs) for name, func, fargs in reversed(sequence)}  # first call each
    vm.set_instrument(instrument)
    vm["main"](*args)  # warm-up
    spent.clear()
    calls.clear()
    for _ in range(runs):
        vm["main"](*args)
    rows = []
    for n, secs in spent.items():
        us = secs / runs * 1e6
        if n in kernels:  # a kernel alone, in a tight loop: no callback between it and the last
            func, fargs = kernels[n]
            us = _loop_us(func, fargs) * calls[n] / runs
        rows.append(ProfileRow(name=n, calls=calls[n] / runs, us=us, kind="kernel" if n in kernels else "vm"))
    rows.sort(key=lambda r: -r.us)

    def back_to_back() -> None:
        for _, func, fargs in sequence:
            func(*fargs)

    sequence_us = _loop_us(back_to_back, (), min_s=0.1)
    return VMProfile(rows=rows, total_us=total, sequence_us=sequence_us, hollow_us=hollow_us)


def _loop_us(func: Any, args: tuple, min_s: float = 0.02, repeats: int = 3) -> float:
    """Microseconds per call of ``func(*args)``: the best of ``repeats`` loops of ``min_s``."""
    func(*args)
    best = float("inf")
    for _ in range(repeats):
        count, t0 = 0, time.perf_counter()
        while True:
            func(*args)
            count += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_s:
                break
        best = min(best, elapsed / count)
    return best * 1e6


def model_inputs(mod: tvm.IRModule, seed: int = 0) -> list[np.ndarray]:
    """Random inputs for ``mod["main"]`` (static shapes; floats in [-1, 1), integers in [0, 8))."""
    rng = np.random.default_rng(seed)
    out = []
    for param in mod["main"].params:
        ty = param.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise UnsupportedWorkload(f"input {param.name} is not a tensor of known shape")
        try:
            shape = [int(d) for d in ty.shape]
        except TypeError:
            raise UnsupportedWorkload(f"input {param.name} has a dynamic shape {ty.shape}") from None
        dtype = str(ty.dtype)
        if dtype.startswith("float"):
            out.append(rng.uniform(-1, 1, shape).astype(dtype))
        else:
            out.append(rng.integers(0, 8, shape).astype(dtype))
    return out


if __name__ == "__main__":
    _child(sys.argv[1])
