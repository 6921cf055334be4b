"""Bad input: each case raises a typed fastsearch error (under FastsearchError) whose message names
the culprit, before anything is written where that is possible."""

from __future__ import annotations

import json

import pytest
import tvm
from fastsearch import (
    DatabaseError,
    FastsearchError,
    InvalidTarget,
    InvalidTrace,
    MalformedInput,
    ScheduleError,
    UnsupportedWorkload,
    tune,
)
from fastsearch.costmodel.features import extract_features
from fastsearch.database import RECORD_FILE, WORKLOAD_FILE, TuningDatabase
from fastsearch.ir.loop_nest import loop_nest_from_trace
from fastsearch.ir.target import resolve_target
from tvm import te
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from workloads import small

TARGET = resolve_target({"kind": "llvm", "num-cores": 1})


def _raises(kind: type[Exception], call, *named: str) -> str:
    with pytest.raises(kind) as info:
        call()
    assert isinstance(info.value, FastsearchError)
    message = str(info.value)
    for word in named:
        assert word in message, f"{word!r} not named in: {message}"
    return message


# -- workloads ------------------------------------------------------------------------------------


def test_extern_operator_is_unsupported_and_named(tmp_path):
    a = te.placeholder((16,), name="A")
    sort = te.extern(
        (16,),
        [a],
        lambda ins, outs: tvm.tirx.call_extern("int32", "my_sort", ins[0].data, outs[0].data, 16),
        name="sort",
    )
    func = te.create_prim_func([a, sort])
    work = tmp_path / "w"
    _raises(UnsupportedWorkload, lambda: tune(func, TARGET, trials=1, work_dir=work), "'sort'", "'my_sort'")
    assert not work.exists()  # rejected before the database is created


def test_dynamic_shape_names_the_buffer_and_dimension(tmp_path):
    n = tvm.tirx.Var("n", "int32")
    a = te.placeholder((n, 16), name="Xin")
    func = te.create_prim_func([a, te.compute((n, 16), lambda i, j: a[i, j] + 1.0, name="Y")])
    work = tmp_path / "w"
    _raises(UnsupportedWorkload, lambda: tune(func, TARGET, trials=1, work_dir=work), "Xin", "[n, 16]")
    assert not work.exists()


# -- targets --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "named"),
    [
        ("nosuchkind", ["nosuchkind"]),
        ({"kind": "llvm", "num-cores": "x"}, ["num-cores", '"x"']),
        ({"kind": "llvm", "num-cores": 0}, ["num-cores", "0"]),
        ({"kind": "nosuchkind"}, ["nosuchkind"]),
    ],
)
def test_unknown_or_malformed_target(target, named, tmp_path):
    work = tmp_path / "w"
    _raises(InvalidTarget, lambda: tune(small("GMM"), target, trials=1, work_dir=work), *named)
    assert not work.exists()


def test_feature_extraction_refuses_an_unknown_target():
    func = small("GMM")
    _raises(InvalidTarget, lambda: extract_features(func, [], target="nosuchkind"), "nosuchkind")


# -- traces ---------------------------------------------------------------------------------------


def test_invalid_trace_json_names_the_trace():
    func = small("GMM")
    good = Schedule(_normalize_mod(func)).trace
    _raises(InvalidTrace, lambda: extract_features(func, [good, "not json"]), "trace 1 of 2", "not json")
    bad_block = '[[["GetSBlock", [], ["NOPE", "main"], ["b0"]]], []]'
    _raises(ScheduleError, lambda: extract_features(func, [bad_block]), "trace 0 of 1", "NOPE")
    _raises(InvalidTrace, lambda: loop_nest_from_trace(func, '{"insts": 3}'), "invalid trace")


def test_a_failing_trace_in_a_later_chunk_is_named_by_its_place():
    # TVM Traces are converted and replayed a chunk at a time: the failing one is still named by
    # its place in the whole list. A trace of another function fails on this one's blocks.
    func = small("GMM")
    good = Schedule(_normalize_mod(func)).trace
    conv = Schedule(_normalize_mod(small("C1D")))
    conv.get_sblock("conv1d_nlc")
    traces = [good] * 11 + [conv.trace]
    _raises(ScheduleError, lambda: extract_features(func, traces), "trace 11 of 12")


def test_sampler_returning_garbage_is_malformed_input(tmp_path):
    _raises(
        MalformedInput,
        lambda: tune(small("GMM"), TARGET, trials=1, work_dir=tmp_path, strategy=lambda *a: ["junk"]),
        "str",
        "junk",
    )


# -- databases ------------------------------------------------------------------------------------


@pytest.fixture
def database(tmp_path):
    """A database with one record (the untuned schedule) of the small GMM."""
    mod = _normalize_mod(small("GMM"))
    db = TuningDatabase(tmp_path)
    workload = db.commit_workload(mod)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    db.commit(workload, Schedule(mod).trace, [1e-5], TARGET, args)
    return tmp_path


def test_database_with_binary_garbage(database):
    path = database / RECORD_FILE
    path.write_bytes(path.read_bytes() + b"\xff\xfe\x00garbage\n")
    _raises(DatabaseError, lambda: TuningDatabase(database), str(path), "not UTF-8")


def test_database_with_json_garbage_line(database):
    path = database / RECORD_FILE
    path.write_text(path.read_text() + "{oops}\n")
    _raises(
        DatabaseError, lambda: tune(small("GMM"), TARGET, trials=2, work_dir=database), str(path), "line 2"
    )


def test_database_record_with_an_invalid_trace(database):
    path = database / RECORD_FILE
    row = json.loads(path.read_text().splitlines()[0])
    row[1][0] = [[["NoSuchInstruction", [], [], []]], []]
    path.write_text(path.read_text() + json.dumps(row) + "\n")
    _raises(DatabaseError, lambda: TuningDatabase(database), f"line 2 of {path}", "not a valid tuning record")


def test_database_workload_that_is_not_a_workload(database):
    path = database / WORKLOAD_FILE
    path.write_text(path.read_text() + '["0x1", "not a module"]\n')
    _raises(DatabaseError, lambda: TuningDatabase(database), f"line 2 of {path}", "not a valid workload")
