"""The cubin suite (issue 27): for every te_workload family and shape, K of fastsearch's GPU
sketch candidates for the H100 tag are drawn, verified, built to CUDA source and compiled by
nvcc to cubins, and each family's valid share, registers, spills and shared memory summarized.
No GPU is needed; nvcc comes with the ``cuda`` extra (``pip install '.[cuda]'``).

    python -m benches.gpu_cubins --per-shape 16 --out-dir ~/fastsearch-runs/gpu_cubins \\
        --summary-dir benches/results/gpu_cubins

``--out-dir`` receives every candidate (trace, verdicts, kernels' resources, failures) in
``candidates.json``, and the summary (``summary.json``, ``summary.md``); ``--summary-dir`` gets
the summary alone; ``--report`` summarizes ``candidates.json`` again without compiling. The H100 tag's arch is ``sm_90a``; the cubins are compiled for ``--arch``
(``sm_90`` by default, as the issue asks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import tvm
from fastsearch.measure.cubin import find_nvcc
from fastsearch.tuning.build_only import build_gpu_space
from tvm.s_tir.meta_schedule.testing import te_workload

from benches.run_meta import run_metadata

FAMILIES = ["C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM", "SFM", "CBR", "TBG"]
TARGET = "nvidia/nvidia-h100"


def _spread(values: list[float]) -> list[float] | None:
    return [min(values), statistics.median(values), max(values)] if values else None


def _registers(c: dict[str, Any]) -> int:
    return max(k["registers"] for k in c["kernels"])


def _spills(c: dict[str, Any]) -> bool:
    return any(k["spill_store_bytes"] or k["spill_load_bytes"] for k in c["kernels"])


def family_summary(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """One family's figures over all its shapes' candidates (``TaskBuildReport.to_json()`` each)."""
    cands = [c for t in tasks for c in t["candidates"]]
    compiled = [c for c in cands if c["kernels"]]
    failures: dict[str, int] = {}
    for c in cands:
        if c["failure"] is not None:
            failures[c["failure"]] = failures.get(c["failure"], 0) + 1
    return {
        "shapes": len(tasks),
        "candidates": len(cands),
        "valid": sum(c["engine_error"] is None for c in cands),
        "tvm_valid": sum(c["tvm_rejected_by"] is None for c in cands),
        "disagreements": sum((c["engine_error"] is None) != (c["tvm_rejected_by"] is None) for c in cands),
        "built": sum(c["built"] for c in cands),
        "compiled": len(compiled),
        "failures": failures,
        "registers": _spread([float(_registers(c)) for c in compiled]),
        "spilled": sum(_spills(c) for c in compiled),
        "shared_kib": _spread([max(k["shared_bytes"] for k in c["kernels"]) / 1024 for c in compiled]),
        "kernels_max": max((len(c["kernels"]) for c in compiled), default=0),
        "nvcc_s": _spread([c["nvcc_s"] for c in compiled if c["nvcc_s"] is not None]),
    }


def notes(tasks: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The first failed build of each family and kind, and every candidate the engine's
    VerifyGPUCode and TVM's postprocessors judge differently, with what ptxas said of it."""
    examples, disagreements = [], []
    seen = set()
    for name, t in tasks.items():
        family = name.split("_")[0]
        for i, c in enumerate(t["candidates"]):
            if c["failure"] is not None and (family, c["failure"]) not in seen:
                seen.add((family, c["failure"]))
                examples.append(f"{family} {c['failure']}: {' '.join(c['message'].split())[:300]}")
            if (c["engine_error"] is None) != (c["tvm_rejected_by"] is None):
                ptxas = (
                    f"ptxas: {max(k['shared_bytes'] for k in c['kernels'])} bytes shared memory, "
                    f"{_registers(c)} registers{', spills' if _spills(c) else ''}"
                    if c["kernels"]
                    else f"not compiled ({c['failure']})"
                )
                disagreements.append(
                    f"{name} #{i}: engine: {c['engine_error'] or 'valid'}; TVM: "
                    f"{'refused by ' + c['tvm_rejected_by'] if c['tvm_rejected_by'] else 'valid'}; {ptxas}"
                )
    return examples, disagreements


def _row(family: str, s: dict[str, Any]) -> str:
    def trio(x: list[float] | None, fmt: str) -> str:
        return "-" if x is None else "/".join(format(v, fmt) for v in x)

    failed = ", ".join(f"{k} {n}" for k, n in sorted(s["failures"].items())) or "-"
    spill = f"{s['spilled']} ({100 * s['spilled'] / s['compiled']:.1f}%)" if s["compiled"] else "-"
    return (
        f"| {family} | {s['candidates']} | {s['valid']} | {s['tvm_valid']} | {s['compiled']} | "
        f"{trio(s['registers'], '.0f')} | {spill} | {trio(s['shared_kib'], '.1f')} | "
        f"{trio(s['nvcc_s'], '.2f')} | {failed} |"
    )


def markdown(summary: dict[str, Any]) -> str:
    meta, total = summary["meta"], summary["total"]
    lines = [
        "# GPU sketch candidates compiled to cubins",
        "",
        (
            f"{summary['per_shape']} candidates per shape (seed {summary['seed']}) of fastsearch's GPU "
            "sketches "
            f"for `{TARGET}` ({summary['target']}), every one TVM's postprocessors accept built with `tvm.compile` to CUDA "
            f"source and compiled by nvcc ({summary['nvcc']}) to a cubin for `{summary['arch']}`; "
            "registers, spills and static shared memory from ptxas (a candidate with several kernels "
            "counts its largest). Nothing is measured; no GPU."
        ),
        "",
        f"Command: `{meta['command']}`; {meta['host']}, {meta['date']}, {summary['seconds']:.0f} s wall.",
        "",
        (
            "valid: the engine's VerifyGPUCode; TVM: MetaSchedule's CUDA postprocessors (VerifyGPUCode "
            "last) on the same candidates; registers per thread, shared KiB and nvcc seconds are "
            "min/median/max over the compiled candidates."
        ),
        "",
        "| family | candidates | valid | TVM | compiled | registers | spills | shared KiB | nvcc s | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(f, s) for f, s in summary["families"].items()]
    lines.append(_row("all", total))
    if summary["disagreements"]:
        lines += [
            "",
            "Judged differently by the engine's VerifyGPUCode and TVM's (built and compiled all the same):",
            "",
        ]
        lines += [f"- {e}" for e in summary["disagreements"]]
    if summary["failed_examples"]:
        lines += ["", "Failed builds (first of each family and kind):", ""]
        lines += [f"- {e}" for e in summary["failed_examples"]]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Draws, builds and compiles every family's candidates; returns the run's fields and every
    task's candidates (``tasks``)."""
    target = tvm.target.Target(TARGET)
    nvcc = find_nvcc()
    if nvcc is None:
        raise SystemExit("no nvcc: pip install '.[cuda]' (nvidia-cuda-nvcc)")
    start = time.perf_counter()
    tasks: dict[str, Any] = {}
    target_text = ""
    for family in args.families:
        for idx in range(len(te_workload.CONFIGS[family][1])):
            func = te_workload.create_te_workload(family, idx)
            report = build_gpu_space(
                func, target, args.per_shape, args.seed, name=f"{family}_{idx}", arch=args.arch
            )
            target_text = report.target
            task = report.tasks[f"{family}_{idx}"]
            tasks[task.name] = task.to_json()
            print(f"{task.name}: {task.compiled}/{task.built} compiled, failures {task.failures}", flush=True)
    meta = run_metadata("gpu_cubins.py", TARGET, None)
    meta["command"] = "python -m benches.gpu_cubins " + " ".join(args.argv)
    return {
        "target": target_text,
        "arch": args.arch,
        "nvcc": nvcc.split("/site-packages/")[-1],
        "per_shape": args.per_shape,
        "seed": args.seed,
        "seconds": time.perf_counter() - start,
        "meta": meta,
        "tasks": tasks,
    }


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """The summary of a run (:func:`run`'s output): per family, in total, and the notes."""
    families: dict[str, list[dict[str, Any]]] = {}
    for name, task in raw["tasks"].items():
        families.setdefault(name.split("_")[0], []).append(task)
    examples, disagreements = notes(raw["tasks"])
    return {
        **{k: v for k, v in raw.items() if k != "tasks"},
        "families": {f: family_summary(ts) for f, ts in families.items()},
        "total": family_summary(list(raw["tasks"].values())),
        "failed_examples": examples,
        "disagreements": disagreements,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-shape", type=int, default=16, help="candidates drawn per shape (K)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arch", default="sm_90", help="the cubins' arch (the H100 tag says sm_90a)")
    parser.add_argument("--families", nargs="+", default=FAMILIES, choices=FAMILIES)
    parser.add_argument("--out-dir", required=True, help="raw data (every candidate), outside the repository")
    parser.add_argument("--summary-dir", default=None, help="also write the summary here")
    parser.add_argument(
        "--report", action="store_true", help="summarize the raw data in --out-dir again, compiling nothing"
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    out = Path(args.out_dir).expanduser()
    if args.report:
        raw = json.loads((out / "candidates.json").read_text())
    else:
        raw = run(args)
        out.mkdir(parents=True, exist_ok=True)
        (out / "candidates.json").write_text(json.dumps(raw))
    summary = summarize(raw)
    for folder in [out] + ([Path(args.summary_dir)] if args.summary_dir else []):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        (folder / "summary.md").write_text(markdown(summary))
    print(markdown(summary))


if __name__ == "__main__":
    main()
