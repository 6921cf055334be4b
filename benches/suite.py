"""Suite comparison: fastsearch vs MetaSchedule's ``tune_tir`` over workloads and seeds.

Each (workload, seed) is one run: both tuners, one after the other in this process, with the same
target (host CPU with ``mcpu`` and ``num-cores``), the same number of measured trials and the same
seed, each in a fresh work directory. For every checkpoint in ``--trials`` (e.g. 64 and 256, read
off one run of the largest), the best record of each tuner among its first N measured is compiled
from its database and the two kernels are re-timed together, interleaved, with one
``time_evaluator`` setting, so the ratio does not depend on how either tuner measured while
tuning. The re-timing runs in ``--retime-processes`` fresh processes (:mod:`kernel_retime`):
one process's memory placement alone can move a kernel by 2x, so the figure is the median of
the per-process ratios. ``--retime`` re-times the runs already in ``--out-dir`` this way.
Both tuners' kernels run on ``TVM_NUM_THREADS`` threads, every physical core unless the caller
sets it, while tuning and re-timed; each run records it and the report states it.

Also recorded per run: both tuning curves (best latency against trials and against wall time),
wall times, fastsearch's time breakdown, MetaSchedule's profiler scopes (its EvoSearch scopes are
its search time), and time to parity (wall time until fastsearch's best during tuning is at least
as fast as MetaSchedule's final best during tuning).

One JSON per run goes to ``--out-dir``, MetaSchedule's database of the run to
``--out-dir/metaschedule/<run>/`` (for ``--reuse-metaschedule``), and fastsearch's database and
genomes, gzipped, to ``--out-dir/fastsearch/<run>/`` (``--retime`` and ``late_search.py`` read
them once the run's temporary work directory is gone); runs already there are
skipped, so an interrupted suite resumes. ``--report`` aggregates every run found into ``suite.md`` and PNG curves:

    python -m benches.suite --workloads GMM:2 C2D:1 --seeds 0 1 2 --trials 64 --out-dir suite64
    python -m benches.suite --out-dir suite64 --report
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tvm
from fastsearch.cli.main import load_workload
from fastsearch.ir.target import physical_cores, resolve_target
from fastsearch.ir.vector_math import TIR_PIPELINE
from fastsearch.measure.measurer import build_module, build_module_tvm_lowering
from fastsearch.tuning import loop
from fastsearch.tuning.options import TuningPlan
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from benches.compare_gmm import run_metaschedule
from benches.kernel_retime import pair, retime_in_processes, summarize
from benches.runs import (
    best_within,
    compile_module,
    compile_record,
    fastsearch_dir,
    keep_fastsearch,
    lowering_differs,
    mean_us,
    metaschedule_dir,
    records_in_order,
    replay_record,
)

#: Eight workloads from seven te_workload families, shapes of the MetaSchedule paper's CPU suite.
DEFAULT_WORKLOADS = ["GMM:2", "C1D:2", "C2D:1", "C2D:3", "DEP:1", "CBR:1", "TBG:0", "SFM:0"]


class _Curve(ms.measure_callback.PyMeasureCallback):
    """Timestamps every measured batch of MetaSchedule with its run times: its tuning curve."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.points: list[tuple[float, float | None]] = []  # (elapsed s, mean us or None)

    def apply(
        self,
        task_scheduler: Any,
        task_id: int,
        measure_candidates: Any,
        builder_results: Any,
        runner_results: Any,
    ) -> None:
        now = time.perf_counter() - self.start
        for res in runner_results:
            secs = [float(s) for s in res.run_secs] if res.run_secs is not None else []
            ok = res.error_msg is None and secs and max(secs) < 1e9
            self.points.append((now, statistics.fmean(secs) * 1e6 if ok else None))


_Curve = derived_object(_Curve)


def _curve(points: list[tuple[int, float, float | None]]) -> list[list[float | None]]:
    """[trial, elapsed s, best us so far] from (trial, elapsed, latency) points."""
    best = math.inf
    out: list[list[float | None]] = []
    for trial, elapsed, lat in points:
        if lat is not None:
            best = min(best, lat)
        out.append([trial, elapsed, best if math.isfinite(best) else None])
    return out


def run_one(
    workload: str,
    seed: int,
    checkpoints: list[int],
    repeat: int,
    work: Path,
    earlier: dict[str, Any] | None = None,
    keep: Path | None = None,
    earlier_db: Path | None = None,
    processes: int = 4,
    rerank: bool = True,
    ms_lowering: str = "tvm",
    batch_size: int | None = None,
) -> dict[str, Any]:
    """One run (``rerank=False``: fastsearch without its re-ranking by per-store features); with ``earlier`` (a run JSON of the same workload, seed and trials), MetaSchedule
    is not tuned again: its curve and profile are taken from that run, and its database from
    ``earlier_db`` (or the earlier run's work directory). MetaSchedule's database files are
    copied to ``keep``, so that a later suite can reuse them."""
    wl = load_workload(workload)
    func = wl.func
    target = resolve_target(None)
    trials = max(checkpoints)
    load_start = os.getloadavg()[0]

    t0 = time.perf_counter()
    # The loop itself, with the late re-ranking on or off (tune() has no such option).
    plan = TuningPlan(
        target,
        trials,
        seed,
        work / "fastsearch",
        "main",
        progress=False,
        rerank=rerank,
        batch_size=batch_size,
    )
    fs = loop.run(func, plan)
    fs_wall = time.perf_counter() - t0
    fs_points = [(h.trial, h.elapsed_s, h.latency_us) for h in fs.history]

    if earlier is not None:
        ms_dir = earlier_db if earlier_db is not None else Path(earlier["work_dir"]) / "metaschedule"
        ms_wall = earlier["metaschedule"]["wall_s"]
        profile = earlier["metaschedule"]["profile"]
        # best-so-far points redraw the same curve when no per-trial points were kept
        kept = earlier["metaschedule"].get("points") or earlier["metaschedule"]["curve"]
        ms_points = [(int(p[0]), p[1], p[2]) for p in kept]
        # the run's folder shows both databases, as for a full run
        (work / "metaschedule").symlink_to(ms_dir.resolve(), target_is_directory=True)
    else:
        ms_dir = work / "metaschedule"
        ms_wall, profile, ms_points = _tune_metaschedule(func, target, trials, seed, ms_dir, ms_lowering)
    if keep is not None and not keep.exists():
        keep.mkdir(parents=True)
        for name in ("database_workload.json", "database_tuning_record.json"):
            shutil.copy(ms_dir / name, keep / name)
    fs_records = records_in_order(work / "fastsearch", func)
    ms_records = records_in_order(ms_dir, func)
    result: dict[str, Any] = {
        "workload": workload,
        "shape": list(wl.shape),
        "seed": seed,
        "trials": trials,
        "target": str(target),
        # the threads both tuners' kernels ran on, while tuning and re-timed
        "kernel_threads": os.environ.get("TVM_NUM_THREADS"),
        # the TIR pipeline MetaSchedule's candidates were built with: "tvm" (its own) or "fastsearch"
        "metaschedule_lowering": ms_lowering,
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "fastsearch": {
            "wall_s": fs_wall,
            "timing": dict(fs.timing),
            "measured": fs.trials_measured,
            "failed": fs.failed,
            "rerank": rerank,
            # candidates per batch (None: the loop's default, 16 for a kernel of 64 trials or more)
            "batch_size": batch_size,
            "curve": _curve(fs_points),
        },
        "metaschedule": {
            "wall_s": ms_wall,
            "profile": profile,
            "measured": len(ms_records),
            "failed": sum(1 for r in ms_records if not math.isfinite(mean_us(r))),
            "curve": _curve(ms_points),
            "points": [list(p) for p in ms_points],
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
            entry.update(
                _retime_pair(fs_best, ms_best, func, target, repeat, processes, ms_lowering=ms_lowering)
            )
        # parity: fastsearch's best during tuning reaches MetaSchedule's final (at n) best
        target_us = entry["metaschedule_tuned_us"]
        entry["parity"] = None
        if target_us is not None:
            for trial, elapsed, best in result["fastsearch"]["curve"]:
                if trial <= n and best is not None and best <= target_us:
                    entry["parity"] = {"trial": trial, "elapsed_s": elapsed}
                    break
            ms_at_n = [p for p in result["metaschedule"]["curve"] if p[0] <= n]
            entry["metaschedule_wall_at_n_s"] = ms_at_n[-1][1] if ms_at_n else None
        result["checkpoints"][str(n)] = entry
    result["load"] = [load_start, os.getloadavg()[0]]
    return result


def _retime_pair(
    fs_best: ms.database.TuningRecord,
    ms_best: ms.database.TuningRecord,
    func: Any,
    target: tvm.target.Target,
    repeat: int,
    processes: int,
    device: str = "cpu",
    ms_lowering: str = "tvm",
) -> dict[str, Any]:
    """Both bests compiled, each as its tuner builds it (fastsearch's with its TIR pipeline,
    MetaSchedule's with TVM's default), then timed together in ``processes`` fresh processes
    (:mod:`kernel_retime`) on ``device``: medians over processes and the median per-process
    ratio. Where the two pipelines can build MetaSchedule's best differently (a kernel with
    ``exp``, ``sigmoid`` or ``tanh``), that build is timed beside them too: ``same_lowering_ratio`` compares the two
    schedules with one lowering. ``ms_lowering="fastsearch"``: MetaSchedule was tuned with
    fastsearch's lowering, and its best is built with it."""
    ms_pipeline = TIR_PIPELINE if ms_lowering == "fastsearch" else "default"
    ms_mod = replay_record(ms_best)
    libs = [
        compile_record(fs_best, target, TIR_PIPELINE),
        compile_module(ms_mod, target, ms_pipeline),
    ]
    same_lowering = device == "cpu" and ms_pipeline == "default" and lowering_differs(ms_mod)
    if same_lowering:
        libs.append(compile_module(ms_mod, target, TIR_PIPELINE))
    per_process = retime_in_processes(libs, func, repeat, processes, device=device)
    out = summarize(per_process)
    if same_lowering:
        _, ms_us, ratios = pair(per_process, 0, 2)
        out["metaschedule_same_lowering_us"] = ms_us
        out["same_lowering_ratio"] = statistics.median(ratios)
    out["retime_processes"] = processes
    out["retime_rounds"] = repeat
    return out


def retime_runs(out_dir: Path, repeat: int, processes: int) -> None:
    """Re-time every run JSON in ``out_dir`` from its two databases (still in its ``work_dir``, or
    MetaSchedule's kept copy), in fresh processes; earlier figures stay under
    ``single_process``."""
    target = resolve_target(None)
    for path in sorted(out_dir.glob("run_*.json")):
        run = json.loads(path.read_text())
        if all(c.get("retime_processes") == processes for c in run["checkpoints"].values()):
            continue
        work = Path(run["work_dir"])
        ms_dir = metaschedule_dir(run, out_dir, path.stem)
        fs_dir = fastsearch_dir(run, out_dir, path.stem)
        if fs_dir is None:
            print(
                f"{path.name}: {work / 'fastsearch'} is gone and was not kept; not re-timed", file=sys.stderr
            )
            continue
        func = load_workload(run["workload"]).func
        fs_records = records_in_order(fs_dir, func)
        ms_records = records_in_order(ms_dir, func)
        for n, entry in run["checkpoints"].items():
            last = int(n) == max(int(x) for x in run["checkpoints"])
            fs_best, ms_best = best_within(fs_records, int(n), last), best_within(ms_records, int(n))
            if not (fs_best and ms_best):
                continue
            if "retime_processes" not in entry:
                entry["single_process"] = {
                    k: entry.get(k) for k in ("fastsearch_retimed_us", "metaschedule_retimed_us")
                }
            lowering = run.get("metaschedule_lowering", "tvm")
            entry.update(
                _retime_pair(fs_best, ms_best, func, target, repeat, processes, ms_lowering=lowering)
            )
        path.write_text(json.dumps(run, indent=1))
        cp = run["checkpoints"][max(run["checkpoints"], key=int)]
        print(f"{path.name}: ratio {_ratio(cp):.3f}", file=sys.stderr, flush=True)


def _ratio(entry: dict[str, Any]) -> float:
    """A checkpoint's latency ratio: the median per-process ratio when re-timed in several
    processes (older runs: the one process's ratio of medians)."""
    if entry.get("retimed_ratio"):
        return float(entry["retimed_ratio"])
    return entry["fastsearch_retimed_us"] / entry["metaschedule_retimed_us"]


def _tune_metaschedule(
    func: Any, target: tvm.target.Target, trials: int, seed: int, ms_dir: Path, lowering: str = "tvm"
) -> tuple[float, dict[str, float], list[tuple[int, float, float | None]]]:
    t0 = time.perf_counter()
    curve_cb = _Curve(t0)
    with ms.Profiler() as profiler:
        run_metaschedule(
            func,
            target,
            trials,
            seed,
            ms_dir,
            default_builder=False,
            measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), curve_cb],
            f_build=build_module if lowering == "fastsearch" else build_module_tvm_lowering,
        )
    ms_wall = time.perf_counter() - t0
    profile = {k: float(v) for k, v in profiler.get().items()}
    ms_points = [(i + 1, el, lat) for i, (el, lat) in enumerate(curve_cb.points)]
    return ms_wall, profile, ms_points


# ----------------------------------------------------------------------------- report


def _geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def _evo_search_s(profile: dict[str, float]) -> float:
    """MetaSchedule's search time: its EvoSearch scopes (sampling, evolution, scoring, picking),
    each counted once (a scope nested in another recorded scope is inside its parent's time)."""
    keys = [k for k in profile if k.startswith("EvoSearch/")]
    return sum(profile[k] for k in keys if not any(k.startswith(p + "/") for p in keys if p != k))


def _threads_of(runs: list[dict[str, Any]]) -> str:
    """The kernel threads the runs name (runs from before they were recorded: unknown)."""
    seen = sorted({str(r.get("kernel_threads") or "unknown") for r in runs})
    return ", ".join(seen)


def _batch_size_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The report's line on fastsearch's candidates per batch, where a run set ``--batch-size``."""
    batches = sorted({r["fastsearch"].get("batch_size") or 0 for r in runs})
    if batches == [0]:
        return []
    sizes = ", ".join(str(b) if b else "the default" for b in batches)
    return [f"fastsearch's candidates per batch: {sizes} (`--batch-size`).", ""]


def _same_lowering_lines(runs: list[dict[str, Any]], n: int, wl_ratios: dict[str, float]) -> list[str]:
    """Workloads whose kernels call ``exp``, ``sigmoid`` or ``tanh``: their ratio with
    MetaSchedule's best also built with fastsearch's TIR pipeline (vector ``exp``), and the
    geometric mean with those ratios."""
    same: dict[str, float] = {}
    for wl in wl_ratios:
        cps = [r["checkpoints"].get(str(n), {}) for r in runs if r["workload"] == wl]
        ratios = [float(c["same_lowering_ratio"]) for c in cps if c.get("same_lowering_ratio")]
        if ratios:
            same[wl] = _geomean(ratios)
    if not same:
        return []
    # the geometric mean with the same-lowering ratios in place of those workloads' ratios
    swapped = [same.get(wl, ratio) for wl, ratio in wl_ratios.items()]
    return [
        (
            "MetaSchedule's best (tuned on TVM's lowering) rebuilt with fastsearch's TIR pipeline "
            f"(vector `exp`): {', '.join(f'{wl} {r:.3f}' for wl, r in same.items())}; geometric mean over "
            f"{len(swapped)} workloads with these: {_geomean(swapped):.3f}. A schedule chosen on libm's "
            "`exp` need not vectorize it: `--metaschedule-lowering fastsearch` tunes MetaSchedule on "
            "fastsearch's lowering too."
        ),
        "",
    ]


def report(out_dir: Path) -> str:
    runs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("run_*.json"))]
    if not runs:
        raise SystemExit(f"no runs in {out_dir}")
    checkpoints = sorted({int(n) for r in runs for n in r["checkpoints"]})
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    lines = [
        (
            f"Runs: {len(runs)} ({len(workloads)} workloads x seeds {sorted({r['seed'] for r in runs})}); "
            f"target `{runs[0]['target']}`; host {platform.processor() or platform.machine()}, "
            f"{physical_cores()} physical cores; kernels of both tuners on "
            f"{_threads_of(runs)} thread(s) (`TVM_NUM_THREADS`); dates {min(r['date'] for r in runs)} to "
            f"{max(r['date'] for r in runs)}."
        ),
        "",
    ]
    lowerings = sorted({r.get("metaschedule_lowering", "tvm") for r in runs})
    if lowerings != ["tvm"]:
        lines += [
            (
                f"MetaSchedule's candidates and bests built with: {', '.join(lowerings)} lowering "
                "(`--metaschedule-lowering`; fastsearch's: vector `exp`)."
            ),
            "",
        ]
    lines += _batch_size_lines(runs)
    reused = sorted({r["metaschedule_from"] for r in runs if r.get("metaschedule_from")})
    if reused:
        lines += [
            (
                f"MetaSchedule's runs were taken from {', '.join(reused)} (tuned there once, same "
                "machine); fastsearch was tuned anew and both bests re-timed side by side here."
            ),
            "",
        ]
    for n in checkpoints:
        lines += [
            f"### {n} trials",
            "",
            (
                "| workload | seeds | latency ratio (re-timed, geomean over seeds) | per seed | "
                "fastsearch re-timed us (median) | MetaSchedule re-timed us (median) | wall-time ratio | "
                "time to parity / MetaSchedule wall |"
            ),
            "|---|---:|---:|---|---:|---:|---:|---|",
        ]
        all_ratios: list[float] = []
        wl_ratios: dict[str, float] = {}
        for wl in workloads:
            rs = [r for r in runs if r["workload"] == wl and str(n) in r["checkpoints"]]
            cps = [r["checkpoints"][str(n)] for r in rs]
            ok = [
                (r, c)
                for r, c in zip(rs, cps)
                if c.get("fastsearch_retimed_us") and c.get("metaschedule_retimed_us")
            ]
            if not ok:
                continue
            ratios = [_ratio(c) for _, c in ok]
            wl_ratio = _geomean(ratios)
            all_ratios.append(wl_ratio)
            wl_ratios[wl] = wl_ratio
            walls = []
            parity = []
            for r, c in ok:
                ms_wall = c.get("metaschedule_wall_at_n_s") or r["metaschedule"]["wall_s"]
                fs_curve = [p for p in r["fastsearch"]["curve"] if p[0] <= n]
                walls.append(fs_curve[-1][1] / ms_wall if fs_curve else math.nan)
                parity.append(f"{c['parity']['elapsed_s'] / ms_wall:.2f}" if c["parity"] else "not reached")
            lines.append(
                f"| {wl} | {len(ok)} | {wl_ratio:.3f} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                f"{statistics.median(c['fastsearch_retimed_us'] for _, c in ok):.1f} | "
                f"{statistics.median(c['metaschedule_retimed_us'] for _, c in ok):.1f} | "
                f"{_geomean(walls):.2f} | {', '.join(parity)} |"
            )
        lines += [
            "",
            f"Geometric mean of the latency ratio over {len(all_ratios)} workloads: **{_geomean(all_ratios):.3f}**",
            "",
        ]
        lines += _same_lowering_lines(runs, n, wl_ratios)

    # search time per measured candidate
    fs_search = [r["fastsearch"]["timing"]["search"] / max(1, r["fastsearch"]["measured"]) for r in runs]
    ms_search = [
        _evo_search_s(r["metaschedule"]["profile"]) / max(1, r["metaschedule"]["measured"]) for r in runs
    ]
    lines += [
        "### Search time per measured candidate",
        "",
        "| workload | fastsearch (ms) | MetaSchedule EvoSearch scopes (ms) | ratio |",
        "|---|---:|---:|---:|",
    ]
    for wl in workloads:
        idx = [i for i, r in enumerate(runs) if r["workload"] == wl]
        f = statistics.fmean(fs_search[i] for i in idx) * 1e3
        m = statistics.fmean(ms_search[i] for i in idx) * 1e3
        lines.append(f"| {wl} | {f:.2f} | {m:.2f} | {f / m:.3f} |")
    lines += [
        "",
        (
            f"Over all runs: fastsearch {statistics.fmean(fs_search) * 1e3:.2f} ms, MetaSchedule "
            f"{statistics.fmean(ms_search) * 1e3:.2f} ms per measured candidate, ratio "
            f"**{statistics.fmean(fs_search) / statistics.fmean(ms_search):.3f}**."
        ),
        "",
    ]
    scopes: dict[str, list[float]] = {}
    for r in runs:
        for k, v in r["metaschedule"]["profile"].items():
            scopes.setdefault(k, []).append(v)
    lines += [
        "MetaSchedule profiler scopes, mean seconds per run: "
        + ", ".join(
            f"{k} {statistics.fmean(v):.1f}"
            for k, v in sorted(scopes.items(), key=lambda kv: -statistics.fmean(kv[1]))[:12]
        ),
        "",
    ]
    t_keys = ("search", "apply", "build", "run", "verify", "database", "model", "final", "total")
    lines += [
        "fastsearch time breakdown, mean seconds per run: "
        + ", ".join(
            f"{k} {statistics.fmean(r['fastsearch']['timing'].get(k, 0.0) for r in runs):.1f}" for k in t_keys
        ),
        "",
    ]
    _plot(runs, workloads, out_dir)
    lines.append("Curves, beside this file: `curves_trials.png`, `curves_time.png`.")
    text = "\n".join(lines) + "\n"
    (out_dir / "suite.md").write_text(text)
    return text


def _plot(runs: list[dict[str, Any]], workloads: list[str], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = math.ceil(len(workloads) / cols)
    for axis, fname, label in (
        (0, "curves_trials.png", "measured trials"),
        (1, "curves_time.png", "wall time (s)"),
    ):
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
        for ax, wl in zip(axes.flat, workloads):
            for r in (r for r in runs if r["workload"] == wl):
                for who, color in (("fastsearch", "tab:blue"), ("metaschedule", "tab:orange")):
                    pts = [(p[axis], p[2]) for p in r[who]["curve"] if p[2] is not None]
                    if pts:
                        xs, ys = zip(*pts)
                        ax.step(
                            xs,
                            ys,
                            where="post",
                            color=color,
                            alpha=0.8,
                            label=who if r["seed"] == min(x["seed"] for x in runs) else None,
                        )
            ax.set_title(wl)
            ax.set_xlabel(label)
            ax.set_ylabel("best latency (us)")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(workloads) :]:
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=90)
        plt.close(fig)


def _stored_run(folder: Path, name: str, trials: int) -> Path:
    """The run ``name`` in ``folder``, or else the shortest run there of the same workload and
    seed with more trials: its checkpoints are read off MetaSchedule's first ``trials`` records
    and its curve (wall time at ``trials``), as a shorter run's are."""
    exact = folder / name
    if exact.exists():
        return exact
    stem = name.rsplit("_t", 1)[0]
    longer = sorted(
        (int(p.stem.rsplit("_t", 1)[1]), p)
        for p in folder.glob(f"{stem}_t*.json")
        if p.stem.rsplit("_t", 1)[1].isdigit() and int(p.stem.rsplit("_t", 1)[1]) > trials
    )
    return longer[0][1] if longer else exact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--trials", nargs="+", type=int, default=[64], help="checkpoints; one run of the largest"
    )
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds per re-timing process")
    parser.add_argument(
        "--retime-processes", type=int, default=4, help="fresh processes re-timing each pair of bests"
    )
    parser.add_argument(
        "--retime",
        action="store_true",
        help="re-time the runs already in --out-dir from their databases in fresh processes, then report",
    )
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--report", action="store_true", help="only aggregate the runs in --out-dir")
    parser.add_argument(
        "--reuse-metaschedule",
        default=None,
        help="an earlier --out-dir: MetaSchedule's runs (databases, curves, profiles) are taken from "
        "there instead of tuning again (a run with more trials serves, read off its first records; "
        "runs it lacks are tuned anew); fastsearch is tuned anew and both bests are re-timed together",
    )
    parser.add_argument(
        "--metaschedule-lowering",
        choices=["tvm", "fastsearch"],
        default="tvm",
        help="the TIR pipeline MetaSchedule's candidates and best are built with: TVM's default (what "
        "its users get), or fastsearch's (vector exp), to compare the two searches on one lowering",
    )
    parser.add_argument(
        "--no-rerank",
        dest="rerank",
        action="store_false",
        help="turn off fastsearch's re-ranking of proposals by the task's store-feature model",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="fastsearch's candidates per batch (default: the tuning loop's, 16 for 64 trials or more)",
    )
    args = parser.parse_args(argv)
    # Both tuners' kernels run on every core, while tuning and re-timed (TVM's runtime alone would
    # use half the logical CPUs); a TVM_NUM_THREADS set by the caller wins.
    os.environ.setdefault("TVM_NUM_THREADS", str(physical_cores()))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.retime:
        retime_runs(out_dir, args.repeat, args.retime_processes)
    elif not args.report:
        here = str(resolve_target(None))  # the target every run of this suite is tuned for
        for seed in args.seeds:
            for wl in args.workloads:
                path = out_dir / f"run_{wl.replace(':', '_')}_s{seed}_t{max(args.trials)}.json"
                if path.exists():
                    continue
                print(f"{wl} seed {seed}, {max(args.trials)} trials ...", file=sys.stderr, flush=True)
                work = Path(tempfile.mkdtemp(prefix=f"suite_{wl.replace(':', '_')}_s{seed}_"))
                earlier = None
                earlier_db = None
                if args.reuse_metaschedule:
                    old = _stored_run(Path(args.reuse_metaschedule), path.name, max(args.trials))
                    stored = json.loads(old.read_text()) if old.exists() else None
                    if stored is not None and stored.get("target") != here:
                        # Bests tuned for another CPU are no comparison: tune MetaSchedule here.
                        print(
                            f"  {old} was tuned for another target: MetaSchedule is tuned anew",
                            file=sys.stderr,
                        )
                    elif (
                        stored is not None
                        and stored.get("metaschedule_lowering", "tvm") != args.metaschedule_lowering
                    ):
                        print(
                            f"  {old} was built with another lowering: MetaSchedule is tuned anew",
                            file=sys.stderr,
                        )
                    elif stored is not None:
                        earlier = stored
                        kept = Path(args.reuse_metaschedule) / "metaschedule" / old.stem
                        earlier_db = kept if kept.exists() else None
                    else:
                        print(f"  no {old}: MetaSchedule is tuned anew", file=sys.stderr, flush=True)
                keep = out_dir / "metaschedule" / path.stem
                res = run_one(
                    wl,
                    seed,
                    sorted(args.trials),
                    args.repeat,
                    work,
                    earlier,
                    keep,
                    earlier_db,
                    args.retime_processes,
                    args.rerank,
                    args.metaschedule_lowering,
                    args.batch_size,
                )
                res["metaschedule_from"] = str(args.reuse_metaschedule) if earlier else None
                res["work_dir"] = str(work)
                keep_fastsearch(work / "fastsearch", out_dir / "fastsearch" / path.stem)
                path.write_text(json.dumps(res, indent=1))
                cp = res["checkpoints"][str(max(args.trials))]
                if cp.get("fastsearch_retimed_us"):
                    print(
                        f"  ratio {_ratio(cp):.3f}, wall "
                        f"{res['fastsearch']['wall_s']:.0f} s vs {res['metaschedule']['wall_s']:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    print(report(out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
