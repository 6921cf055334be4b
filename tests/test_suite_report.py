"""Lines of the suite report (``benches.suite``). Same lowering: where MetaSchedule's best was also
timed built with fastsearch's TIR pipeline, the report gives that ratio per workload and the
geometric mean with it in place of the workload's headline ratio. Batch size: named only where a
run set ``--batch-size``."""

from __future__ import annotations

import math

from benches.suite import _batch_size_lines, _same_lowering_lines


def _run(workload: str, n: int, same: float | None) -> dict:
    cp = {"retimed_ratio": 0.2, "fastsearch_retimed_us": 1.0, "metaschedule_retimed_us": 5.0}
    if same is not None:
        cp["same_lowering_ratio"] = same
    return {"workload": workload, "checkpoints": {str(n): cp}}


def test_the_line_swaps_in_the_same_lowering_ratios():
    runs = [_run("SFM:0", 64, 0.81), _run("SFM:0", 64, 1.0), _run("GMM:2", 64, None)]
    lines = _same_lowering_lines(runs, 64, {"SFM:0": 0.2, "GMM:2": 0.9})
    sfm = math.sqrt(0.81 * 1.0)
    assert f"SFM:0 {sfm:.3f};" in lines[0]
    assert f"{math.sqrt(sfm * 0.9):.3f}." in lines[0]
    assert "GMM:2" not in lines[0]


def test_no_line_without_same_lowering_timings():
    runs = [_run("GMM:2", 64, None)]
    assert _same_lowering_lines(runs, 64, {"GMM:2": 0.9}) == []
    assert _same_lowering_lines([_run("SFM:0", 256, 0.9)], 64, {"SFM:0": 0.2}) == []


def test_batch_size_line_only_where_a_run_set_one():
    default = {"fastsearch": {"batch_size": None}}
    older = {"fastsearch": {}}  # runs from before the option
    assert _batch_size_lines([default, older]) == []
    line = _batch_size_lines([default, {"fastsearch": {"batch_size": 8}}])[0]
    assert line == "fastsearch's candidates per batch: the default, 8 (`--batch-size`)."
