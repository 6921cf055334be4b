"""Re-time a ``model_e2e.py`` run's two tuned models in several fresh processes.

One process's timing of a compiled model carries that process's memory placement: on this
2-core machine, four separately compiled copies of the same tuned ResNet-18 timed 54.3-57.1 ms
side by side in one process, and the same two databases gave a fastsearch / MetaSchedule ratio
of 1.115 in one process and 0.963 in another. So each of ``--processes`` fresh processes
compiles both databases again (TVM's pipeline with ``MetaScheduleApplyDatabase``, in
alternating order) and times them in ``--repeat`` interleaved rounds
(:func:`fastsearch.graph.model_timing.time_interleaved`); the report gives every process's ratio, the
median over processes, and the median of all per-round ratios pooled.

    python -m benches.model_retime /tmp/e2e_r18 --processes 5 --repeat 20

(the ``--out-dir`` of a ``model_e2e.py`` run, which holds its databases; the repository keeps
only runs' summaries)

Writes ``retime.json`` and ``retime.md`` into the run's directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benches.run_meta import run_metadata

TUNERS = ("fastsearch", "metaschedule")


def worker(e2e: Path, model: str, repeat: int, first: int, out: Path) -> None:
    """One process: compile both databases (``first`` first) and time them interleaved."""
    import shutil

    import tvm
    from fastsearch.graph.model_timing import _as_numpy, model_inputs, time_interleaved
    from fastsearch.ir.target import resolve_target
    from fastsearch.testing.relax_models import load_model
    from tvm.s_tir import meta_schedule as ms

    target = resolve_target(None)
    mod = load_model(model)
    inputs = model_inputs(mod, seed=1)
    exes: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in (first, 1 - first):
            name = TUNERS[k]
            shutil.copytree(e2e / f"{name}_work", Path(tmp) / name)  # the database is not written
            db = ms.database.JSONDatabase(work_dir=str(Path(tmp) / name))
            exes[name] = ms.relax_integration.compile_relax(db, mod, target, None)
    times, outputs = time_interleaved([exes[n] for n in TUNERS], inputs, repeat, min_repeat_ms=200)
    untuned = tvm.relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu(0))
    ref = _as_numpy(untuned["main"](*[tvm.runtime.tensor(a, tvm.cpu(0)) for a in inputs]))
    scale = float(np.abs(ref).max()) or 1.0
    out.write_text(
        json.dumps(
            {
                "times_s": {n: times[i] for i, n in enumerate(TUNERS)},
                "matches": {
                    n: bool(np.allclose(outputs[i], ref, rtol=1e-3, atol=1e-3 * scale))
                    for i, n in enumerate(TUNERS)
                },
                "first_compiled": TUNERS[first],
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("e2e_dir", help="a model_e2e.py --out-dir (fastsearch_work and metaschedule_work)")
    parser.add_argument("--model", default=None, help="default: the model named in the run's result.json")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20, help="interleaved rounds per process")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    e2e = Path(args.e2e_dir)
    model = args.model or json.loads((e2e / "result.json").read_text())["model"]
    if args.worker is not None:
        worker(e2e, model, args.repeat, args.worker, Path(args.worker_out))
        return 0

    from fastsearch.graph.model_timing import paired_ratios
    from fastsearch.ir.target import resolve_target

    target = resolve_target(None)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in range(args.processes):
            path = Path(tmp) / f"p{p}.json"
            cmd = [sys.executable, __file__, str(e2e), "--model", model, "--repeat", str(args.repeat)]
            subprocess.run(cmd + ["--worker", str(p % 2), "--worker-out", str(path)], check=True)
            run = json.loads(path.read_text())
            t = run["times_s"]
            med = {n: statistics.median(t[n]) * 1e3 for n in TUNERS}
            paired = paired_ratios(t["fastsearch"], t["metaschedule"])
            run.update(
                median_ms=med,
                ratio=med["fastsearch"] / med["metaschedule"],
                paired_median=statistics.median(paired),
                paired=paired,
            )
            runs.append(run)
            print(
                f"process {p + 1}/{args.processes} (compiled {run['first_compiled']} first): "
                f"fastsearch {med['fastsearch']:.2f} ms, MetaSchedule {med['metaschedule']:.2f} ms, "
                f"ratio {run['ratio']:.3f} (per-round median {run['paired_median']:.3f})",
                flush=True,
            )
    ratios = sorted(r["ratio"] for r in runs)
    pooled = sorted(x for r in runs for x in r["paired"])
    summary = {
        "model": model,
        "processes": args.processes,
        "repeat": args.repeat,
        "median_ratio": statistics.median(ratios),
        "min_ratio": ratios[0],
        "max_ratio": ratios[-1],
        "pooled_paired_median": statistics.median(pooled),
        "pooled_paired_quartiles": [pooled[len(pooled) // 4], pooled[(3 * len(pooled)) // 4]],
        "all_match": all(all(r["matches"].values()) for r in runs),
        "runs": runs,
        **run_metadata("model_retime.py", target, argv),
    }
    (e2e / "retime.json").write_text(json.dumps(summary, indent=1))
    lines = [
        (
            f"Model `{model}`: both databases of `{e2e}` compiled and re-timed in {args.processes} fresh "
            f"processes, {args.repeat} interleaved rounds each; host {summary['host']}; {summary['date']}."
        ),
        "",
        "| process | compiled first | fastsearch (ms) | MetaSchedule (ms) | ratio | per-round median |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for p, r in enumerate(runs, start=1):
        m = r["median_ms"]
        lines.append(
            f"| {p} | {r['first_compiled']} | {m['fastsearch']:.2f} | {m['metaschedule']:.2f} | "
            f"{r['ratio']:.3f} | {r['paired_median']:.3f} |"
        )
    q = summary["pooled_paired_quartiles"]
    lines += [
        "",
        (
            f"**Median over processes of fastsearch / MetaSchedule: {summary['median_ratio']:.3f}** (range "
            f"{summary['min_ratio']:.3f}-{summary['max_ratio']:.3f}); median of all "
            f"{len(pooled)} per-round ratios {summary['pooled_paired_median']:.3f} (quartiles {q[0]:.3f}-{q[1]:.3f}). "
            f"Outputs match the untuned model's in every process: {'yes' if summary['all_match'] else 'NO'}."
        ),
        "",
        f"Command: `python -m benches.model_retime {' '.join(argv if argv is not None else sys.argv[1:])}`",
    ]
    (e2e / "retime.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
