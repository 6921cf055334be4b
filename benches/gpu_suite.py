"""GPU suite: fastsearch vs MetaSchedule's ``tune_tir`` on a CUDA device, and cuBLAS for GMM.

The CPU suite (:mod:`benches.suite`) on a CUDA target: each (workload, seed) is one run, both
tuners one after the other in this process with the same target, number of measured trials and
seed, each in a fresh work directory; fastsearch through its public ``fastsearch.tune``,
MetaSchedule through ``tune_tir`` with its defaults (and fastsearch's build function, as in the
CPU suite). For every checkpoint in ``--trials``, the best record of each tuner among its first
N measured is compiled from its database and the two kernels are re-timed together, interleaved,
in ``--retime-processes`` fresh processes on the GPU (:mod:`benches.kernel_retime` with
``device="cuda"``); the figure is the median of the per-process ratios. For GMM, cuBLAS (through
PyTorch, else CuPy, whichever is installed; float32 with TF32 off, the arithmetic the tuned
kernels do) is timed on the same shape with CUDA events, in as many fresh processes.

The target is ``--target`` (default the ``nvidia/nvidia-h100`` tag: sm_90a and the per-block
limits the H100 and the H200 share; ``cuda`` is the detected GPU). A target whose ``arch`` is
not the device's compute capability is refused. Without a CUDA device the suite exits at once
(status 2) saying why; ``--check`` checks the environment instead (device, TVM's CUDA build chain
on a small kernel, a re-timing process, cuBLAS, a 4-trial run of each tuner) and writes
``check.json``.

One JSON per run goes to ``--out-dir`` (keep it outside the repository), with MetaSchedule's
database of the run under ``metaschedule/<run>/`` and fastsearch's (gzipped) under
``fastsearch/<run>/``; runs already there are skipped. ``--budget-s`` starts no run that the
longest run so far says would end past it (for a lent device's time). ``summary.json`` and
``summary.md`` aggregate every run found (``--report`` alone re-writes them, no device needed):

    python -m benches.gpu_suite --check --out-dir /tmp/gpu_check
    python -m benches.gpu_suite --workloads GMM:3 C2D:1 --seeds 0 --trials 32 --out-dir /tmp/gpu32
    python -m benches.gpu_suite --out-dir /tmp/gpu32 --report
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Exit status when there is no CUDA device (or its runtime does not load).
NO_DEVICE = 2

#: GMM:3 (1024^3) first: GMM:2 (512^3) runs in microseconds on an H100-class GPU.
DEFAULT_WORKLOADS = ["GMM:3", "C2D:1", "DEP:1", "SFM:0", "GMM:2", "C1D:2", "CBR:1", "TBG:0"]
DEFAULT_TARGET = "nvidia/nvidia-h100"


# ----------------------------------------------------------------------------- the device


def cuda_device() -> tuple[dict[str, Any] | None, str]:
    """This machine's CUDA device 0 as TVM's runtime sees it, or None and the reason."""
    import tvm

    loaded = "tvm_runtime_cuda" in getattr(tvm.base, "_LOADED_LIBS", {})
    try:
        dev = tvm.cuda(0)
        exists = bool(dev.exist)
    except Exception as exc:  # noqa: BLE001  (no runtime, no driver: any error means no device)
        return None, f"TVM's CUDA runtime failed: {exc}"
    if not exists:
        if not loaded:
            return None, (
                "TVM's CUDA runtime (tvm/lib/libtvm_runtime_cuda.so) did not load: no CUDA runtime "
                "(libcudart.so.13) on the library path, or no NVIDIA driver (libcuda.so.1)"
            )
        return None, "TVM's CUDA runtime loaded but sees no CUDA device (no GPU, or the driver refused it)"
    info = {
        "name": str(dev.device_name),
        "compute_version": str(dev.compute_version),
        "multi_processor_count": int(dev.multi_processor_count),
        "max_threads_per_block": int(dev.max_threads_per_block),
        "max_shared_memory_per_block": int(dev.max_shared_memory_per_block),
        "total_global_memory": int(dev.total_global_memory or 0),
        "driver": _nvidia_smi("driver_version"),
        "clocks_sm_max_mhz": _nvidia_smi("clocks.max.sm"),
    }
    return info, ""


def _nvidia_smi(field: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def require_device() -> dict[str, Any]:
    """The CUDA device, or exit at once (status :data:`NO_DEVICE`) with the reason."""
    info, why = cuda_device()
    if info is None:
        print(
            f"gpu_suite: no CUDA device: {why}. This suite tunes and times kernels on a CUDA GPU; "
            "run it on a machine with one (benches/gpu_kit/README.md: the kit for a lent H200).",
            file=sys.stderr,
        )
        raise SystemExit(NO_DEVICE)
    return info


def gpu_target(spec: str, device: dict[str, Any]) -> Any:
    """``spec`` resolved as fastsearch resolves targets; refused (SystemExit) when its arch is not
    the device's compute capability (sm_90a serves a 9.0 device)."""
    from fastsearch.ir.target import resolve_target, target_kind

    target = resolve_target(spec)
    if target_kind(target) != "cuda":
        raise SystemExit(f"gpu_suite: --target {spec!r} is not a CUDA target: {target}")
    arch = str(target.attrs.get("arch", ""))
    match = re.fullmatch(r"sm_(\d+)a?", arch)
    want = device["compute_version"].replace(".", "")
    if match is None or match.group(1) != want:
        raise SystemExit(
            f"gpu_suite: --target {spec!r} has arch {arch!r}, but the device ({device['name']}) is "
            f"compute capability {device['compute_version']}; pass --target cuda for the detected GPU"
        )
    return target


# ----------------------------------------------------------------------------- cuBLAS

_CUBLAS_TIMER = """
import json, statistics, sys
b, n, m, k, repeat, seed, min_ms = json.loads(sys.argv[1])
try:
    import torch
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"  # torch >= 2.9: no TF32
    except (AttributeError, RuntimeError):
        torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand((b, n, k), device="cuda", generator=gen) * 2 - 1
    y = torch.rand((b, k, m), device="cuda", generator=gen) * 2 - 1
    out = torch.empty((b, n, m), device="cuda")
    call = lambda: torch.matmul(x, y, out=out)
    event = lambda: torch.cuda.Event(enable_timing=True)
    sync = torch.cuda.synchronize
    library = f"torch {torch.__version__} (cuBLAS)"
except ImportError:
    import cupy
    rng = cupy.random.default_rng(seed)
    x = rng.uniform(-1, 1, (b, n, k), dtype=cupy.float32)
    y = rng.uniform(-1, 1, (b, k, m), dtype=cupy.float32)
    out = cupy.empty((b, n, m), cupy.float32)
    call = lambda: cupy.matmul(x, y, out=out)
    class _Event:
        def __init__(self):
            self.e = cupy.cuda.Event()
        def record(self):
            self.e.record()
        def elapsed_time(self, other):
            return cupy.cuda.get_elapsed_time(self.e, other.e)
    event = _Event
    sync = cupy.cuda.Device().synchronize
    library = f"cupy {cupy.__version__} (cuBLAS)"

def timed(number):
    start, end = event(), event()
    start.record()
    for _ in range(number):
        call()
    end.record()
    sync()
    return start.elapsed_time(end) / 1e3 / number

for _ in range(10):
    call()
sync()
number = max(1, int(min_ms / 1e3 / max(timed(10), 1e-7)))
secs = [timed(number) for _ in range(repeat)]
print(json.dumps({"library": library, "median_s": statistics.median(secs), "secs": secs}))
"""


def time_cublas(shape: tuple, repeat: int, processes: int, min_repeat_ms: int = 100) -> dict[str, Any] | None:
    """cuBLAS on a GMM shape (b, n, m, k), float32: seconds per call in each of ``processes``
    fresh processes (median of ``repeat`` event-timed repeats of at least ``min_repeat_ms``);
    None (with the reason on stderr) when neither PyTorch nor CuPy runs."""
    per_process = []
    library = None
    for p in range(processes):
        out = subprocess.run(
            [sys.executable, "-c", _CUBLAS_TIMER, json.dumps([*shape, repeat, p, min_repeat_ms])],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            print(f"  cuBLAS not timed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return None
        res = json.loads(out.stdout.strip().splitlines()[-1])
        library = res["library"]
        per_process.append(float(res["median_s"]))
    return {
        "library": library,
        "cublas_us": statistics.median(per_process) * 1e6,
        "cublas_us_per_process": [s * 1e6 for s in per_process],
    }


# ----------------------------------------------------------------------------- one run


def run_one(
    workload: str,
    seed: int,
    checkpoints: list[int],
    target: Any,
    device: dict[str, Any],
    work: Path,
    keep: Path,
    repeat: int,
    processes: int,
    cublas: bool,
) -> dict[str, Any]:
    """Both tuners on one workload and seed; both bests re-timed at every checkpoint."""
    import fastsearch
    from fastsearch.cli.main import load_workload, workload_flops

    from benches.runs import best_within, mean_us, records_in_order
    from benches.suite import _curve, _retime_pair, _tune_metaschedule

    wl = load_workload(workload)
    func = wl.func
    trials = max(checkpoints)

    t0 = time.perf_counter()
    fs = fastsearch.tune(
        func,
        target=target,
        trials=trials,
        seed=seed,
        work_dir=work / "fastsearch",
        name="main",
        progress=False,
    )
    fs_wall = time.perf_counter() - t0
    fs_points = [(h.trial, h.elapsed_s, h.latency_us) for h in fs.history]

    ms_dir = work / "metaschedule"
    ms_wall, profile, ms_points = _tune_metaschedule(func, target, trials, seed, ms_dir)
    keep.mkdir(parents=True, exist_ok=True)
    for name in ("database_workload.json", "database_tuning_record.json"):
        shutil.copy(ms_dir / name, keep / name)

    fs_records = records_in_order(work / "fastsearch", func)
    ms_records = records_in_order(ms_dir, func)
    result: dict[str, Any] = {
        "workload": workload,
        "shape": list(wl.shape),
        "flops": workload_flops(func),
        "seed": seed,
        "trials": trials,
        "target": str(target),
        "device": device,
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "fastsearch": {
            "wall_s": fs_wall,
            "timing": dict(fs.timing),
            "measured": fs.trials_measured,
            "failed": fs.failed,
            "curve": _curve(fs_points),
        },
        "metaschedule": {
            "wall_s": ms_wall,
            "profile": profile,
            "measured": len(ms_records),
            "failed": sum(1 for r in ms_records if not math.isfinite(mean_us(r))),
            "curve": _curve(ms_points),
        },
        "checkpoints": {},
    }
    for n in checkpoints:
        fs_best, ms_best = best_within(fs_records, n, n == trials), best_within(ms_records, n)
        entry: dict[str, Any] = {
            "fastsearch_tuned_us": mean_us(fs_best) if fs_best else None,
            "metaschedule_tuned_us": mean_us(ms_best) if ms_best else None,
        }
        if fs_best and ms_best:
            entry.update(_retime_pair(fs_best, ms_best, func, target, repeat, processes, device="cuda"))
        result["checkpoints"][str(n)] = entry
    if cublas and wl.family == "GMM":
        result["cublas"] = time_cublas(tuple(wl.shape), repeat, processes)
    return result


def _ratio(entry: dict[str, Any]) -> float | None:
    return float(entry["retimed_ratio"]) if entry.get("retimed_ratio") else None


# ----------------------------------------------------------------------------- report


def report(out_dir: Path) -> str:
    """``summary.json`` and ``summary.md`` from every run JSON in ``out_dir``; returns the markdown."""
    from benches.suite import _geomean

    runs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("run_*.json"))]
    skipped = (
        json.loads((out_dir / "not_run.json").read_text()) if (out_dir / "not_run.json").exists() else []
    )
    if not runs:
        text = (
            f"No GPU suite runs in {out_dir}"
            + (f" (not run: {', '.join(skipped)})" if skipped else "")
            + ".\n"
        )
        (out_dir / "summary.md").write_text(text)
        (out_dir / "summary.json").write_text(json.dumps({"runs": 0, "not_run": skipped}, indent=1))
        return text
    dev = runs[0]["device"]
    checkpoints = sorted({int(n) for r in runs for n in r["checkpoints"]})
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    summary: dict[str, Any] = {
        "device": dev,
        "target": runs[0]["target"],
        "dates": [min(r["date"] for r in runs), max(r["date"] for r in runs)],
        "seeds": sorted({r["seed"] for r in runs}),
        "not_run": skipped,
        "checkpoints": {},
    }
    lines = [
        (
            f"GPU suite: {len(runs)} runs ({len(workloads)} workloads x seeds {summary['seeds']}) on "
            f"{dev['name']} (compute {dev['compute_version']}, {dev['multi_processor_count']} SMs, "
            f"driver {dev.get('driver')}); target `{runs[0]['target']}`; {summary['dates'][0]} to "
            f"{summary['dates'][1]}."
        ),
        "",
    ]
    if skipped:
        lines += [f"Not run (device-time budget): {', '.join(skipped)}.", ""]
    for n in checkpoints:
        lines += [
            f"### {n} trials",
            "",
            (
                "| workload | seeds | latency ratio fastsearch / MetaSchedule (re-timed, geomean) | per seed | "
                "fastsearch us | MetaSchedule us | cuBLAS us | wall fastsearch / MetaSchedule (s) | "
                "measured (failed) fastsearch, MetaSchedule |"
            ),
            "|---|---:|---:|---|---:|---:|---:|---|---|",
        ]
        rows = {}
        for wl in workloads:
            rs = [r for r in runs if r["workload"] == wl and _ratio(r["checkpoints"].get(str(n), {}))]
            if not rs:
                continue
            cps = [r["checkpoints"][str(n)] for r in rs]
            ratios = [float(c["retimed_ratio"]) for c in cps]
            cub = [r["cublas"]["cublas_us"] for r in rs if r.get("cublas")]
            row = {
                "seeds": [r["seed"] for r in rs],
                "ratio_geomean": _geomean(ratios),
                "ratios": ratios,
                "fastsearch_us": statistics.median(c["fastsearch_retimed_us"] for c in cps),
                "metaschedule_us": statistics.median(c["metaschedule_retimed_us"] for c in cps),
                "cublas_us": statistics.median(cub) if cub else None,
                "wall_s": [[r["fastsearch"]["wall_s"], r["metaschedule"]["wall_s"]] for r in rs],
            }
            rows[wl] = row
            cub_text = "-" if row["cublas_us"] is None else f"{row['cublas_us']:.1f}"
            lines.append(
                f"| {wl} | {len(rs)} | {row['ratio_geomean']:.3f} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                f"{row['fastsearch_us']:.1f} | {row['metaschedule_us']:.1f} | "
                f"{cub_text} | "
                f"{', '.join(f'{a:.0f} / {b:.0f}' for a, b in row['wall_s'])} | "
                + ", ".join(
                    f"{r['fastsearch']['measured']} ({r['fastsearch']['failed']}), "
                    f"{r['metaschedule']['measured']} ({r['metaschedule']['failed']})"
                    for r in rs
                )
                + " |"
            )
        overall = _geomean([row["ratio_geomean"] for row in rows.values()])
        summary["checkpoints"][str(n)] = {"workloads": rows, "ratio_geomean": overall}
        lines += [
            "",
            f"Geometric mean of the latency ratio over {len(rows)} workloads: **{overall:.3f}**",
            "",
        ]
    libs = sorted({r["cublas"]["library"] for r in runs if r.get("cublas")})
    if libs:
        lines += [f"cuBLAS through {', '.join(libs)}, float32, TF32 off; timed with CUDA events.", ""]
    lines += [
        (
            "Re-timed: both bests in fresh processes on the GPU (TVM's time_evaluator, at least 100 ms "
            "per repeat, interleaved rounds), the median of the per-process ratios; below 1 fastsearch "
            "is faster."
        ),
        "",
    ]
    text = "\n".join(lines)
    (out_dir / "summary.md").write_text(text)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return text


# ----------------------------------------------------------------------------- --check


def _step(results: dict[str, Any], name: str, fn: Any) -> Any:
    t0 = time.perf_counter()
    try:
        value = fn()
        results[name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2), "value": value}
        print(f"  ok   {name} ({results[name]['seconds']} s): {value}", file=sys.stderr, flush=True)
        return value
    except BaseException as exc:  # every failure is reported, and the check goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        msg = f"{type(exc).__name__}: {exc}"
        results[name] = {"ok": False, "seconds": round(time.perf_counter() - t0, 2), "error": msg[-3000:]}
        print(f"  FAIL {name}: {msg[-1500:]}", file=sys.stderr, flush=True)
        return None


def _scale_kernel(target: Any) -> tuple[Any, Any]:
    """A small CUDA kernel (B = 2 A + 1 over 2^20 floats, 256 threads a block) and its PrimFunc."""
    import tvm
    from tvm import te

    a = te.placeholder((1 << 20,), name="A")
    b = te.compute(a.shape, lambda i: a[i] * 2.0 + 1.0, name="B")
    func = te.create_prim_func([a, b])
    sch = tvm.s_tir.Schedule(func)
    (i,) = sch.get_loops(sch.get_sblock("B"))
    bx, tx = sch.split(i, [None, 256])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return tvm.compile(sch.mod, target=target), func


def check(target_spec: str, out_dir: Path | None) -> int:
    """The environment the suite needs, step by step; 0 when every step passed."""
    import numpy as np

    results: dict[str, Any] = {}
    print("gpu_suite --check", file=sys.stderr, flush=True)

    def versions() -> dict[str, str]:
        import fastsearch
        import tvm
        import tvm_ffi

        out = {
            "python": platform.python_version(),
            "tvm": tvm.__version__,
            "tvm_ffi": getattr(tvm_ffi, "__version__", "?"),
            "fastsearch": fastsearch.__version__,
            "numpy": np.__version__,
        }
        for mod in (
            "xgboost",
            "scipy",
            "psutil",
            "cloudpickle",
            "ml_dtypes",
            "cuda.bindings",
            "torch",
            "cupy",
        ):
            try:
                out[mod] = importlib.import_module(mod).__version__
            except Exception as exc:  # noqa: BLE001
                out[mod] = f"missing ({type(exc).__name__})"
        out["nvcc"] = shutil.which("nvcc") or "not on PATH"
        out["compile_mode"] = os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc")
        return out

    _step(results, "versions", versions)
    info, why = cuda_device()
    results["device"] = {"ok": info is not None, "value": info, "error": why or None}
    print(f"  {'ok  ' if info else 'FAIL'} device: {info or why}", file=sys.stderr, flush=True)
    if info is None:
        _write_check(results, out_dir)
        return NO_DEVICE
    target = _step(results, "target", lambda: gpu_target(target_spec, info))
    if target is None:
        _write_check(results, out_dir)
        return 1

    def build_and_run() -> str:
        import tvm

        lib, _ = _scale_kernel(target)
        dev = tvm.cuda(0)
        a = np.random.default_rng(0).uniform(-1, 1, 1 << 20).astype("float32")
        ta, tb = tvm.runtime.tensor(a, dev), tvm.runtime.tensor(np.full_like(a, np.nan), dev)
        lib["main"](ta, tb)
        err = float(np.max(np.abs(tb.numpy() - (2 * a + 1))))
        if not err < 1e-6:
            raise RuntimeError(f"wrong result: max error {err}")
        return f"compiled and ran, max error {err}"

    _step(results, "tvm_cuda_build_and_run", build_and_run)

    def retime_process() -> str:
        from benches.kernel_retime import retime_in_processes

        lib, func = _scale_kernel(target)
        per = retime_in_processes([lib, lib], func, repeat=2, processes=1, min_repeat_ms=20, device="cuda")
        return f"exported, timed in a fresh process: {per[0][0] * 1e6:.2f} us, {per[0][1] * 1e6:.2f} us"

    _step(results, "retime_in_fresh_process", retime_process)
    _step(results, "cublas", lambda: time_cublas((1, 1024, 1024, 1024), repeat=3, processes=1) or "not timed")

    def tiny_runs() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
            res = run_one(
                "GMM:0",
                0,
                [4],
                target,
                info,
                Path(tmp),
                Path(tmp) / "kept",
                repeat=2,
                processes=1,
                cublas=False,
            )
        cp = res["checkpoints"]["4"]
        return {
            "fastsearch": [
                res["fastsearch"]["measured"],
                res["fastsearch"]["failed"],
                round(res["fastsearch"]["wall_s"], 1),
            ],
            "metaschedule": [
                res["metaschedule"]["measured"],
                res["metaschedule"]["failed"],
                round(res["metaschedule"]["wall_s"], 1),
            ],
            "retimed_us": [cp.get("fastsearch_retimed_us"), cp.get("metaschedule_retimed_us")],
        }

    _step(results, "tune_4_trials_each_GMM0", tiny_runs)
    _write_check(results, out_dir)
    failed = [k for k, v in results.items() if not v["ok"]]
    print(f"check: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}", file=sys.stderr)
    return 0 if not failed else 1


def _write_check(results: dict[str, Any], out_dir: Path | None) -> None:
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "check.json").write_text(json.dumps(results, indent=1, default=str))


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument(
        "--trials", nargs="+", type=int, default=[64], help="checkpoints; one run of the largest"
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="a CUDA target; 'cuda' is the detected GPU")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds per re-timing process")
    parser.add_argument("--retime-processes", type=int, default=3, help="fresh processes re-timing each pair")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no run the longest run so far says would end past this many seconds",
    )
    parser.add_argument("--no-cublas", dest="cublas", action="store_false", help="do not time cuBLAS for GMM")
    parser.add_argument(
        "--out-dir", default=None, help="where the runs and the summary go (outside the repo)"
    )
    parser.add_argument("--report", action="store_true", help="only aggregate the runs in --out-dir")
    parser.add_argument("--check", action="store_true", help="check the environment, then exit")
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir) if args.out_dir else None
    if args.report:
        if out_dir is None:
            parser.error("--report needs --out-dir")
        print(report(out_dir))
        return 0
    if args.check:
        return check(args.target, out_dir)
    if out_dir is None:
        parser.error("--out-dir is required")
    device = require_device()  # before anything is written
    target = gpu_target(args.target, device)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    longest = 0.0
    not_run: list[str] = []
    for seed in args.seeds:
        for wl in args.workloads:
            stem = f"run_{wl.replace(':', '_')}_s{seed}_t{max(args.trials)}"
            path = out_dir / f"{stem}.json"
            if path.exists():
                continue
            elapsed = time.perf_counter() - start
            if args.budget_s is not None and elapsed + longest > args.budget_s:
                not_run.append(f"{wl} seed {seed}")
                continue
            print(f"{wl} seed {seed}, {max(args.trials)} trials ...", file=sys.stderr, flush=True)
            work = Path(tempfile.mkdtemp(prefix=f"gpu_suite_{stem}_"))
            t0 = time.perf_counter()
            res = run_one(
                wl,
                seed,
                sorted(args.trials),
                target,
                device,
                work,
                out_dir / "metaschedule" / stem,
                args.repeat,
                args.retime_processes,
                args.cublas,
            )
            longest = max(longest, time.perf_counter() - t0)
            res["work_dir"] = str(work)
            from benches.runs import keep_fastsearch

            keep_fastsearch(work / "fastsearch", out_dir / "fastsearch" / stem)
            path.write_text(json.dumps(res, indent=1))
            cp = res["checkpoints"][str(max(args.trials))]
            cub = res.get("cublas") or {}
            print(
                f"  ratio {_ratio(cp) or float('nan'):.3f} ({cp.get('fastsearch_retimed_us') or math.nan:.1f} us "
                f"vs {cp.get('metaschedule_retimed_us') or math.nan:.1f} us"
                + (f", cuBLAS {cub['cublas_us']:.1f} us" if cub else "")
                + f"), wall {res['fastsearch']['wall_s']:.0f} s vs {res['metaschedule']['wall_s']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    (out_dir / "not_run.json").write_text(json.dumps(not_run))
    print(report(out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
