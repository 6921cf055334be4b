"""``fusion="search"`` against the rule-based grouping, end to end, at equal trials.

Each model (built in code, random weights) is tuned twice by ``fastsearch.tune`` with the same
target, seed and total trials: once with FuseOps' grouping (``fusion="rules"``), once with
``fusion="search"`` (the rules' grouping with 1 - share of the trials, then the changes the
rules never make). Both are compiled from their databases, checked against the untuned model's
output, and timed here in interleaved rounds. A run directory already tuned to the trials is
not tuned again (its recorded wall time is kept): delete ``OUT/MODEL/search`` to re-run only the
search against the same rule-based run.

    python -m benches.fusion_search --models bert-layer resnet-18 --trials 300 \\
        --out-dir ~/fastsearch-runs/fusion_search
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from fastsearch.graph.model_timing import model_inputs, paired_ratios, time_interleaved
from fastsearch.graph.partition import partition
from fastsearch.ir.target import resolve_target
from fastsearch.testing.relax_models import load_model
from fastsearch.tuning.options import FusionSearch
from fastsearch.tuning.tune import tune

from benches.run_meta import run_metadata


def run(model: str, target: tvm.target.Target, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    mod = load_model(model)
    res: dict[str, Any] = {"model": model, "groups_rules": len(partition(mod))}
    exes = {}
    for fusion in ("rules", "search"):
        print(f"{model}: fusion={fusion}, {args.trials} trials ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        result = tune(
            mod,
            target,
            trials=args.trials,
            seed=args.seed,
            work_dir=out / model / fusion,
            fusion=FusionSearch(share=args.share) if fusion == "search" else "rules",
            progress=False,
        )
        # A run directory tuned before (its trials all stored) keeps the wall time it took then.
        record = out / model / fusion / "bench_wall.json"
        if record.is_file() and result.trials_measured == 0:
            wall = json.loads(record.read_text())["wall_s"]
        else:
            wall = time.perf_counter() - t0
            record.write_text(json.dumps({"wall_s": wall}))
        entry: dict[str, Any] = {
            "wall_s": wall,
            "trials": result.trials_measured,
            "estimate_us": result.best_latency_us,
            "timing": result.timing,
        }
        if result.fusion is not None:
            report = result.fusion
            entry["fusion"] = {
                "base_ms": report.base_ms,
                "final_ms": report.final_ms,
                "rounds": report.rounds,
                "trials_rules": report.trials_rules,
                "trials_changes": report.trials_changes,
                "groups": len(report.groups),
                "changes": [
                    {
                        "kind": c.kind,
                        "functions": c.functions,
                        "sites": len(c.sites),
                        "removed_us": c.removed_us,
                        "trials": c.trials,
                        "ratio": c.ratio,
                        "kept": c.kept,
                        "reason": c.reason,
                    }
                    for c in report.changes
                ],
            }
        res[fusion] = entry
        exes[fusion] = result.compile()
    untuned = tvm.compile(mod, target=target)
    times, outputs = time_interleaved([untuned, exes["rules"], exes["search"]], model_inputs(mod, seed=1), 1)
    ref = outputs[0]
    scale = float(np.abs(ref).max()) or 1.0
    for fusion, out_ in zip(("rules", "search"), outputs[1:]):
        res[fusion]["matches"] = bool(np.allclose(out_, ref, rtol=1e-3, atol=1e-3 * scale))
    res["untuned_ms"] = times[0][0] * 1e3
    # The untuned model is slow: time the two tuned ones alone, in many rounds.
    times, _ = time_interleaved([exes["rules"], exes["search"]], model_inputs(mod, seed=1), args.rounds)
    for fusion, t in zip(("rules", "search"), times):
        res[fusion]["times_s"] = t
        res[fusion]["median_ms"] = statistics.median(t) * 1e3
    ratios = paired_ratios(times[1], times[0])
    res["ratio"] = statistics.median(ratios)
    res["ratio_quartiles"] = [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]]
    return res


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        (
            f"{meta['trials']} trials per run, seed {meta['seed']}, share {meta['share']}; target "
            f"`{meta['target']}`; host {meta['host']}; {meta['date']}. Command: `{meta['command']}`."
        ),
        "",
        (
            "| model | rules (ms) | search (ms) | search / rules (median of paired rounds; quartiles) "
            "| changes kept / tried / proposed | outputs match untuned | tuning wall rules / search (s) |"
        ),
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        changes = r["search"]["fusion"]["changes"]
        kept = sum(c["kept"] for c in changes)
        tried = sum(c["ratio"] is not None for c in changes)
        q1, q3 = r["ratio_quartiles"]
        match = "yes" if r["rules"]["matches"] and r["search"]["matches"] else "NO"
        lines.append(
            f"| {r['model']} | {r['rules']['median_ms']:.3f} | {r['search']['median_ms']:.3f} | "
            f"**{r['ratio']:.3f}** ({q1:.3f}-{q3:.3f}) | {kept} / {tried} / {len(changes)} | {match} | "
            f"{r['rules']['wall_s']:.0f} / {r['search']['wall_s']:.0f} |"
        )
    for r in results:
        f = r["search"]["fusion"]
        lines += [
            "",
            (
                f"`{r['model']}`: {f['trials_rules']} trials on the rule grouping ({r['groups_rules']} groups), "
                f"{f['trials_changes']} on changes; during the search the rule grouping timed "
                f"{f['base_ms']:.3f} ms and the chosen one {f['final_ms']:.3f} ms ({f['rounds']} rounds)."
            ),
            "",
            "| change | functions | sites | removes (us) | trials | end to end with / without | verdict |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        for c in f["changes"]:
            what = " + ".join("/".join(fn) for fn in c["functions"])
            removed = f"{c['removed_us']:.1f}" if c["removed_us"] is not None else "-"
            ratio = f"{c['ratio']:.3f}" if c["ratio"] is not None else "-"
            lines.append(
                f"| {c['kind']} | {what} | {c['sites']} | {removed} | {c['trials']} | {ratio} | {c['reason']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert-layer", "resnet-18"])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--share", type=float, default=0.25, help="fusion_share: trials for changes")
    parser.add_argument(
        "--rounds", type=int, default=30, help="interleaved timing rounds of the tuned models"
    )
    parser.add_argument("--target", default=None, help="default: this CPU, with mcpu and num-cores")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = resolve_target(args.target)
    meta = {
        "trials": args.trials,
        "seed": args.seed,
        "share": args.share,
        **run_metadata("fusion_search.py", target, argv),
    }
    results = []
    for model in args.models:
        results.append(run(model, target, args, out))
        (out / "result.json").write_text(
            json.dumps({"meta": meta, "results": results}, indent=1, default=float)
        )
    text = report(results, meta)
    (out / "fusion_search.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
