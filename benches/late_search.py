"""What the measurements after the 64th went to, in a suite's runs (``suite.py --out-dir``).

For fastsearch (its database and genomes, in each run's ``work_dir`` or the suite's kept copy): the share of late
measurements given to a structure (the genome's rules: what is inlined, cached, computed where)
measured fewer than ``--tries`` times before that batch, the share given to a coarse shape
(rules and outer tile extents) not measured before it, how many structures the run measured, and
every improvement of the best after the 64th trial, marked by kind (R: rare structure, N: new
coarse shape, E: neither) with its speedup. For MetaSchedule (its database in the out-dir or the
run's ``work_dir``): the share of late records whose trace differs from the best so far in its
instructions (not only in its decisions), and its improvements (S: other instructions, else how many
decisions differ). Writes ``late_search.md`` into the out-dir:

    python -m benches.late_search --out-dir ~/fastsearch-runs/suite256
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from fastsearch.database import mean_run_secs
from fastsearch.search.state import state_file

from benches.runs import fastsearch_dir, metaschedule_dir

#: fastsearch proposes and measures in batches of this size in the suite (tune's default).
BATCH = 16


def _records(path: Path, limit: int) -> list[list[Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()[:limit] if line.strip()]


def _latency(record: list[Any]) -> float:
    return mean_run_secs(record[1][1])


def _rules(genome: dict[str, Any]) -> str:
    return json.dumps(genome["rules"], sort_keys=True)


def _coarse_shape(genome: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """As the Rust search's ``coarse_shape``: rules and, per loop split in more than two, the extent
    of its outer two tile levels."""
    outer = tuple(
        sorted((b, tuple(f[0] * f[1] for f in loops if len(f) > 2)) for b, loops in genome["tiles"].items())
    )
    return _rules(genome), outer


def _genomes(work: Path, records: list[list[Any]]) -> list[dict[str, Any] | None]:
    """Each record's genome: the proposal whose key (trace before postprocessing) the record's
    trace starts with and whose decisions it has."""
    by_decisions: dict[str, list[tuple[list[Any], dict[str, Any]]]] = {}
    for line in state_file(work, "main", "genomes.jsonl").read_text().splitlines():
        row = json.loads(line)
        insts, decisions = json.loads(row["key"])
        by_decisions.setdefault(json.dumps(decisions), []).append((insts, json.loads(row["genome"])))
    out = []
    for rec in records:
        insts, decisions = rec[1][0]
        match = [g for head, g in by_decisions.get(json.dumps(decisions), []) if insts[: len(head)] == head]
        out.append(match[0] if len(match) == 1 else None)
    return out


def fastsearch_late(work: Path, trials: int, start: int, tries: int) -> dict[str, Any]:
    records = _records(work / "database_tuning_record.json", trials)
    genomes = _genomes(work, records)
    lat = [_latency(r) for r in records]
    late = rare = new = 0
    improvements = []
    for i in range(start, len(records)):
        g = genomes[i]
        if g is None:
            continue
        first = (i // BATCH) * BATCH  # the batch's proposals saw the records before it
        before = [x for x in genomes[:first] if x is not None]
        is_rare = Counter(map(_rules, before))[_rules(g)] < tries
        is_new = _coarse_shape(g) not in set(map(_coarse_shape, before))
        late += 1
        rare += is_rare
        new += is_new
        best = min(lat[:i])
        if lat[i] < best:
            improvements.append(("R" if is_rare else "N" if is_new else "E") + f"{best / lat[i]:.3f}")
    return {
        "late": late,
        "unmatched": sum(g is None for g in genomes),
        "rare": rare,
        "new": new,
        "structures": len({_rules(g) for g in genomes if g is not None}),
        "improvements": improvements,
    }


def metaschedule_late(db: Path, trials: int, start: int) -> dict[str, Any]:
    records = _records(db, trials)
    lat = [_latency(r) for r in records]

    def instructions(r: list[Any]) -> list[str]:
        return [inst[0] for inst in r[1][0][0]]

    def decisions(r: list[Any]) -> dict[int, str]:
        return {d[0]: json.dumps(d[1]) for d in r[1][0][1]}

    other = 0
    improvements = []
    for i in range(start, len(records)):
        inc = records[min(range(i), key=lambda j: lat[j])]
        structural = instructions(records[i]) != instructions(inc)
        other += structural
        if lat[i] < min(lat[:i]):
            a, b = decisions(records[i]), decisions(inc)
            kind = "S" if structural else f"{sum(a.get(k) != b.get(k) for k in set(a) | set(b))}d"
            improvements.append(f"{kind}{min(lat[:i]) / lat[i]:.3f}")
    return {"late": len(records) - start, "other": other, "improvements": improvements}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True, help="a suite.py out-dir")
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--start", type=int, default=64, help="first late trial")
    parser.add_argument("--tries", type=int, default=3, help="a structure measured fewer times is rare")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    lines = [
        f"Measurements {args.start + 1}-{args.trials} of each run (`{' '.join(sys.argv)}`).",
        "",
        (
            "| run | fastsearch: rare structure | new coarse shape | structures measured | improvements "
            "| MetaSchedule: other instructions than its best | improvements |"
        ),
        "|---|---:|---:|---:|---|---:|---|",
    ]
    total = Counter()
    for path in sorted(out.glob(f"run_*_t{args.trials}.json")):
        run = json.loads(path.read_text())
        work = Path(run["work_dir"])
        fs_dir = fastsearch_dir(run, out, path.stem)
        if fs_dir is None:
            print(f"{path.name}: {work} is gone and was not kept, skipped", file=sys.stderr)
            continue
        fs = fastsearch_late(fs_dir, args.trials, args.start, args.tries)
        ms_db = metaschedule_dir(run, out, path.stem) / "database_tuning_record.json"
        msl = metaschedule_late(ms_db, args.trials, args.start)
        for k in ("late", "rare", "new", "unmatched"):
            total[k] += fs[k]
        total["ms_late"] += msl["late"]
        total["ms_other"] += msl["other"]
        name = f"{run['workload']} s{run['seed']}"
        lines.append(
            f"| {name} | {fs['rare'] / fs['late']:.2f} | {fs['new'] / fs['late']:.2f} | {fs['structures']} "
            f"| {' '.join(fs['improvements']) or '-'} | {msl['other'] / msl['late']:.2f} "
            f"| {' '.join(msl['improvements']) or '-'} |"
        )
    lines += [
        "",
        (
            f"Over all runs: fastsearch {total['rare'] / max(total['late'], 1):.3f} to rare structures "
            f"(fewer than {args.tries} measured before the batch), {total['new'] / max(total['late'], 1):.3f} "
            f"to new coarse shapes ({total['unmatched']} records without a matching genome left out); "
            f"MetaSchedule {total['ms_other'] / max(total['ms_late'], 1):.3f} to traces with other "
            "instructions than its best so far."
        ),
    ]
    text = "\n".join(lines) + "\n"
    (out / "late_search.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
