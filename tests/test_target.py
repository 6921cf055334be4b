"""Target resolution: this machine's CPU by default, TVM's JSON dicts, clear errors otherwise."""

from __future__ import annotations

import json

import pytest
import tvm
from fastsearch import FastsearchError, InvalidTarget
from fastsearch.ir.target import device_type, host_cpu, physical_cores, resolve_target


def _attrs(target: tvm.target.Target) -> dict:
    return dict(target.export())


@pytest.mark.parametrize("spec", [None, "llvm", " llvm "])
def test_default_is_this_cpu(spec):
    t = resolve_target(spec)
    attrs = _attrs(t)
    assert attrs["kind"] == "llvm"
    assert attrs["mcpu"] == host_cpu() != ""
    assert int(attrs["num-cores"]) == physical_cores() >= 1


def test_llvm_dict_without_cpu_gets_the_host_cpu():
    attrs = _attrs(resolve_target({"kind": "llvm", "num-cores": 1}))
    assert attrs["mcpu"] == host_cpu()
    assert int(attrs["num-cores"]) == 1  # what the user wrote wins


def test_explicit_cpu_and_cross_triple_are_kept():
    attrs = _attrs(resolve_target({"kind": "llvm", "mcpu": "skylake"}))
    assert attrs["mcpu"] == "skylake"
    cross = _attrs(resolve_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}))
    assert "mcpu" not in cross  # a cross target is not this machine


def test_json_text_and_target_objects():
    text = json.dumps({"kind": "llvm", "mcpu": "znver3", "num-cores": 4})
    attrs = _attrs(resolve_target(text))
    assert (attrs["mcpu"], int(attrs["num-cores"])) == ("znver3", 4)
    ready = tvm.target.Target({"kind": "llvm"})
    assert resolve_target(ready) is ready
    assert _attrs(resolve_target("c"))["kind"] == "c"


def test_device_type():
    assert device_type(resolve_target(None)) == "cpu"


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("foo", "foo"),
        ("llvm -mcpu=skylake", "llvm -mcpu=skylake"),
        ({"kind": "nope"}, "nope"),
        ({"kind": "llvm", "bogus": 1}, "bogus"),
        ({"mcpu": "skylake"}, "skylake"),
        ("", "''"),
        ("{not json", "{not json"),
        ('["llvm"]', "llvm"),
        (42, "42"),
    ],
)
def test_invalid_targets_raise_invalid_target_naming_them(spec, named):
    with pytest.raises(InvalidTarget) as info:
        resolve_target(spec)
    assert named in str(info.value)
    assert isinstance(info.value, FastsearchError)
