"""Per-store features computed by fastsearch's engine against MetaSchedule's PerStoreFeature.

The candidates are MetaSchedule's own CPU design spaces with random decisions and TVM's
postprocessors applied, and fastsearch's own sketches (``sample_candidates``, postprocessed by
TVM). Both sides see the same trace: TVM extracts from the scheduled module, we replay the
trace JSON through our engine. Row counts must be equal, values within 1e-3 (log scale).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import tvm
from fastsearch.costmodel.feature_parity import (
    FAMILIES,
    family_rng,
    feature_difference,
    ours_per_candidate,
    random_workload,
    space_candidates,
    tune_context,
    tvm_features,
)
from fastsearch.costmodel.feature_parity import feature_target as target
from fastsearch.costmodel.features import (
    N_FEATURES,
    extract_features,
    extract_features_json,
)
from fastsearch.errors import FastsearchError
from fastsearch.ir import loop_nest
from fastsearch.ir.loop_nest import trace_json
from fastsearch.ir.tir_import import imported_program, program_json
from fastsearch.search.sample import sample_candidates
from tvm.s_tir.meta_schedule.testing import te_workload

SPACE_CANDIDATES = 40
SKETCH_CANDIDATES = 40


def first_difference(ours: np.ndarray, theirs: np.ndarray, same_names: bool) -> str | None:
    """None when equal; otherwise the first differing row and feature, by name (a tied buffer
    pair may come in either order, see ``fastsearch.costmodel.feature_parity.untied``)."""
    d = feature_difference(ours, theirs, same_names)
    if d is None:
        return None
    if d.column < 0:
        return f"shape {ours.shape} != {theirs.shape}"
    return f"row {d.row} {d.feature}: ours {d.ours:.4f}, TVM {d.tvm:.4f} ({d.count} values differ)"


def compare(family: str, kind: str, func, schs) -> list[str]:
    ctx = tune_context(func)
    theirs = tvm_features(ctx, func, schs)
    ours = ours_per_candidate(program_json(func), [trace_json(s.trace) for s in schs])
    names = [str(b.name) for b in func.params]
    same_names = len(names) != len(set(names))
    failures = []
    unsupported = []
    for i, (o, t) in enumerate(zip(ours, theirs)):
        if isinstance(o, str):
            unsupported.append(f"{family} {kind} candidate {i}: {o}")
            continue
        d = first_difference(o, t, same_names)
        if d is not None:
            failures.append(f"{family} {kind} candidate {i}: {d}")
    print(f"{family} {kind}: {len(schs) - len(unsupported)} compared, {len(failures)} differ")
    # A candidate the engine cannot replay yet is reported, not compared; most must replay.
    if unsupported:
        warnings.warn("engine cannot replay: " + "; ".join(unsupported), stacklevel=2)
    assert len(unsupported) <= len(schs) // 4, "\n".join(unsupported)
    return failures


# Grouped convolution: TVM compacts the padding buffer from the consumer's read region, which
# its region analysis bounds with max/min offsets (an 80-channel buffer where 16 are read); not
# modelled yet. Its channel division is in TVM's normal form, so the sketches' candidates match.
KNOWN_GAPS = {"GRP"}
KNOWN_GAP_REASON = "TVM compaction of grouped padding not modelled"


def family_param(family: str):
    if family in KNOWN_GAPS:
        return pytest.param(
            family,
            marks=pytest.mark.xfail(reason=KNOWN_GAP_REASON, strict=False),
        )
    return family


@pytest.mark.slow
@pytest.mark.parametrize("family", [family_param(f) for f in FAMILIES])
def test_matches_per_store_feature_on_design_spaces(family: str) -> None:
    func = te_workload.create_te_workload(family, 0)
    schs = space_candidates(func, SPACE_CANDIDATES)
    assert len(schs) >= SPACE_CANDIDATES // 2
    failures = compare(family, "design space", func, schs)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_per_store_feature_on_sketches(family: str) -> None:
    func = te_workload.create_te_workload(family, 0)
    cands = sample_candidates(func, target(), SKETCH_CANDIDATES, seed=7)
    assert cands
    failures = compare(family, "sketch", func, [c.schedule for c in cands])
    assert not failures, "\n".join(failures)


# Random shapes (odd and prime extents, strides, paddings, groups, dilations): each family on the
# shape ``fastsearch.costmodel.feature_parity.random_workload`` draws for a seed, 16 design-space and 16
# sketch candidates. The full run is ``python -m benches.features_random_shapes --seed S``.
RANDOM_SEEDS = (0, 1)
RANDOM_CANDIDATES = 16
# (family, seed) whose candidates the engine cannot yet replay or whose features differ.
RANDOM_SHAPE_GAPS: dict[tuple[str, int], str] = {
    ("GRP", 1): KNOWN_GAP_REASON,
    ("T2D", 1): "one design-space candidate of 16: the padding's region compacted under a "
    "floordiv index one row larger than TVM's (alloc_size)",
}


def random_shape_param(family: str, seed: int):
    if (family, seed) not in RANDOM_SHAPE_GAPS:
        return pytest.param(family, seed, id=f"{family}-{seed}")
    reason = RANDOM_SHAPE_GAPS[(family, seed)]
    return pytest.param(
        family, seed, id=f"{family}-{seed}", marks=pytest.mark.xfail(reason=reason, strict=False)
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "seed"), [random_shape_param(f, s) for s in RANDOM_SEEDS for f in FAMILIES]
)
def test_matches_per_store_feature_on_random_shapes(family: str, seed: int) -> None:
    func, shape = random_workload(family, family_rng(seed, family))
    print(shape)
    schs = space_candidates(func, RANDOM_CANDIDATES)
    assert len(schs) >= RANDOM_CANDIDATES // 2, shape
    failures = compare(family, "design space", func, schs)
    cands = sample_candidates(func, target(), RANDOM_CANDIDATES, seed=seed)
    assert cands, shape
    failures += compare(family, "sketch", func, [c.schedule for c in cands])
    assert not failures, "\n".join([shape, *failures])


def test_trace_objects_and_json_agree() -> None:
    # More traces than one conversion chunk: the chunks come back in order.
    func = te_workload.create_te_workload("GMM", 0)
    schs = [c.schedule for c in sample_candidates(func, target(), 20, seed=1)]
    assert len(schs) > 8
    from_objects = extract_features(func, [s.trace for s in schs], target())
    from_json = extract_features_json(program_json(func), [trace_json(s.trace) for s in schs])
    for a, b in zip(from_objects, from_json):
        assert a.dtype == np.float32 and a.shape[1] == N_FEATURES
        np.testing.assert_array_equal(a, b)


def test_imported_programs_are_cached_by_structure() -> None:
    func = te_workload.create_te_workload("GMM", 0)
    program = imported_program(func)
    assert imported_program(tvm.IRModule({"main": func})) is program
    assert imported_program(te_workload.create_te_workload("GMM", 0)) is program  # an equal copy
    assert imported_program(te_workload.create_te_workload("GMM", 1)) is not program


def test_same_output_on_any_thread_count() -> None:
    import os
    import subprocess
    import sys

    script = (
        "import numpy as np, sys\n"
        "from tvm.s_tir.meta_schedule.testing import te_workload\n"
        "from fastsearch.search.sample import sample_candidates\n"
        "from fastsearch.costmodel.features import extract_features\n"
        "sys.path.insert(0, 'tests')\n"
        "from test_features import target\n"
        "func = te_workload.create_te_workload('C2D', 0)\n"
        "cands = sample_candidates(func, target(), 16, seed=3)\n"
        "rows = extract_features(func, [c.trace for c in cands])\n"
        "sys.stdout.buffer.write(np.concatenate(rows).tobytes())\n"
    )
    outs = []
    for threads in ("1", "2"):
        env = dict(os.environ, RAYON_NUM_THREADS=threads)
        outs.append(
            subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, check=True).stdout
        )
    assert outs[0] and outs[0] == outs[1]


def test_bad_trace_is_a_typed_error() -> None:
    func = te_workload.create_te_workload("GMM", 0)
    with pytest.raises(FastsearchError):
        extract_features_json(program_json(func), ['[[["Split", ["l0"], [], []]], []]'])
    with pytest.raises(FastsearchError):
        extract_features_json(program_json(func), ["not json"])


@pytest.mark.parametrize("family", ["C2D", "SFM", "TBG", "DEP"])
def test_traces_read_from_tvm_objects_equal_tvm_writer(family: str) -> None:
    # The extension reads TraceAsJSON's objects itself; TVM's database writer is the reference.
    func = te_workload.create_te_workload(family, 0)
    traces = [s.trace for s in space_candidates(func, 12)]
    assert loop_nest._READER is not None, "tvm-ffi's layout is not the one the extension reads"
    ours = loop_nest.traces_text(traces)
    theirs = loop_nest._records_text(traces)
    assert [json.loads(t) for t in ours] == [json.loads(t)[1][0] for t in theirs]


def test_a_trace_the_reader_leaves_to_tvm_is_written_by_tvm(monkeypatch) -> None:
    # An index map (transform_layout) is not read by the extension: that trace goes through TVM's
    # writer, the others do not. (The engine cannot replay TransformLayout, so it has no features.)
    func = te_workload.create_te_workload("GMM", 0)
    schs = [c.schedule for c in sample_candidates(func, target(), 4, seed=3)]
    odd = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    odd.transform_layout(odd.get_sblock("Z"), ("write", 0), lambda b, i, j: (b, j, i))
    traces = [s.trace for s in schs[:2]] + [odd.trace] + [s.trace for s in schs[2:]]
    direct = loop_nest.features_of_traces(imported_program(func), traces)
    assert direct is not None
    assert [d is None for d in direct] == [i == 2 for i in range(len(traces))]
    texts = loop_nest.traces_text(traces)
    assert json.loads(texts[2]) == json.loads(loop_nest._records_text([odd.trace])[0])
    # Without the reader, every trace goes through TVM's writer: the same features.
    fast = extract_features(func, [s.trace for s in schs])
    monkeypatch.setattr(loop_nest, "_READER", None)
    slow = extract_features(func, [s.trace for s in schs])
    assert len(fast) == len(slow) == len(schs)
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)
