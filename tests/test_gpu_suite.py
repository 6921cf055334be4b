"""The GPU suite and its kit, off the GPU: the suite refuses at once without a CUDA device, its
target check and report, and the kit's two-part unpacking (on a small stand-in library)."""

from __future__ import annotations

import hashlib
import json
import lzma
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import tvm

from benches import gpu_suite

REPO = Path(__file__).resolve().parent.parent
UNPACK = REPO / "benches" / "gpu_kit" / "unpack.py"

no_gpu = pytest.mark.skipif(gpu_suite.cuda_device()[0] is not None, reason="a CUDA device is present")


@no_gpu
def test_suite_refuses_at_once_without_a_cuda_device(tmp_path):
    out = tmp_path / "runs"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "benches.gpu_suite",
            "--workloads",
            "GMM:0",
            "--trials",
            "4",
            "--out-dir",
            str(out),
        ],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == gpu_suite.NO_DEVICE, res.stderr
    assert "no CUDA device" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()  # nothing tuned, nothing written


@no_gpu
def test_check_reports_the_missing_device(tmp_path):
    assert gpu_suite.check(gpu_suite.DEFAULT_TARGET, tmp_path) == gpu_suite.NO_DEVICE
    results = json.loads((tmp_path / "check.json").read_text())
    assert results["versions"]["ok"]
    assert results["versions"]["value"]["tvm"] == tvm.__version__
    assert results["device"]["ok"] is False and results["device"]["error"]


def test_target_must_match_the_device():
    h200 = {"name": "NVIDIA H200", "compute_version": "9.0"}
    target = gpu_suite.gpu_target("nvidia/nvidia-h100", h200)
    assert str(target.attrs["arch"]) == "sm_90a"
    with pytest.raises(SystemExit, match="compute capability 8.0"):
        gpu_suite.gpu_target("nvidia/nvidia-h100", {"name": "A100", "compute_version": "8.0"})
    with pytest.raises(SystemExit, match="not a CUDA target"):
        gpu_suite.gpu_target("llvm", h200)


def _run(workload: str, seed: int, fs_us: float, ms_us: float, cublas_us: float | None) -> dict:
    run = {
        "workload": workload,
        "seed": seed,
        "target": "cuda",
        "date": "2026-12-06 00:00 UTC",
        "device": {"name": "NVIDIA H200", "compute_version": "9.0", "multi_processor_count": 132},
        "fastsearch": {"wall_s": 10.0, "measured": 32, "failed": 1},
        "metaschedule": {"wall_s": 20.0, "measured": 32, "failed": 0},
        "checkpoints": {
            "32": {
                "fastsearch_retimed_us": fs_us,
                "metaschedule_retimed_us": ms_us,
                "retimed_ratio": fs_us / ms_us,
            }
        },
    }
    if cublas_us is not None:
        run["cublas"] = {"library": "torch", "cublas_us": cublas_us}
    return run


def test_report_aggregates_ratios_by_geometric_mean(tmp_path):
    runs = [
        _run("GMM:3", 0, 50.0, 100.0, 40.0),
        _run("GMM:3", 1, 100.0, 50.0, 40.0),
        _run("C2D:1", 0, 30.0, 10.0, None),
    ]
    for i, run in enumerate(runs):
        (tmp_path / f"run_{i}.json").write_text(json.dumps(run))
    (tmp_path / "not_run.json").write_text(json.dumps(["SFM:0 seed 0"]))
    text = gpu_suite.report(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = summary["checkpoints"]["32"]["workloads"]
    assert rows["GMM:3"]["ratio_geomean"] == pytest.approx(1.0)  # 0.5 and 2.0
    assert rows["GMM:3"]["cublas_us"] == pytest.approx(40.0)
    assert rows["C2D:1"]["ratio_geomean"] == pytest.approx(3.0)
    assert summary["checkpoints"]["32"]["ratio_geomean"] == pytest.approx(3.0**0.5)
    assert summary["not_run"] == ["SFM:0 seed 0"]
    assert "**1.732**" in text and "SFM:0 seed 0" in text
    assert (tmp_path / "summary.md").read_text() == text


def _kit(tmp_path: Path, lib: bytes) -> tuple[Path, Path]:
    """A kit of two parts as build.py lays it out, with ``lib`` as the compiler library."""
    data = lzma.compress(lib)
    cut = len(data) // 2
    site = tmp_path / "stage" / "site"
    (site / "tvm" / "lib").mkdir(parents=True)
    (site / "tvm" / "__init__.py").write_text("")
    part1, part2 = tmp_path / "kit" / "part1", tmp_path / "kit" / "part2"
    manifest = {
        "compiler": {
            "path": "tvm/lib/libtvm_compiler.so",
            "sha256": hashlib.sha256(lib).hexdigest(),
            "xz_sha256": hashlib.sha256(data).hexdigest(),
            "chunk_sha256": [hashlib.sha256(data[:cut]).hexdigest(), hashlib.sha256(data[cut:]).hexdigest()],
        }
    }
    for part in (part1, part2):
        part.mkdir(parents=True)
        (part / "MANIFEST.json").write_text(json.dumps(manifest))
    (part1 / "libtvm_compiler.so.xz.0").write_bytes(data[:cut])
    (part2 / "libtvm_compiler.so.xz.1").write_bytes(data[cut:])
    with tarfile.open(part2 / "site.tar.xz", "w:xz") as tar:
        tar.add(site, arcname="site")
    return part1, part2


def _unpack(*args: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(UNPACK), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_kit_unpacks_from_two_calls(tmp_path):
    lib = bytes(range(256)) * 4096
    part1, part2 = _kit(tmp_path, lib)
    dest = tmp_path / "device"
    # Call 2 on a fresh machine: part 1 was never kept there.
    alone = tmp_path / "alone"
    alone.mkdir()
    for f in part2.iterdir():
        (alone / f.name).write_bytes(f.read_bytes())
    res = _unpack("unpack", alone, dest)
    assert res.returncode == 3 and "part 1 of the kit is not on this machine" in res.stderr
    # Call 1 keeps its chunk; call 2 (from another folder) finds it and unpacks.
    assert _unpack("stash", part1, dest).returncode == 0
    res = _unpack("unpack", alone, dest)
    assert res.returncode == 0, res.stderr
    assert (dest / "site" / "tvm" / "lib" / "libtvm_compiler.so").read_bytes() == lib
    assert (dest / "site" / "tvm" / "__init__.py").exists()
    assert json.loads(res.stdout)["total_s"] >= 0
    assert "already_unpacked" in _unpack("unpack", alone, dest).stdout


def test_kit_refuses_a_chunk_of_another_build(tmp_path):
    part1, _ = _kit(tmp_path / "a", b"one library" * 1000)
    _, other2 = _kit(tmp_path / "b", b"another library" * 1000)
    alone = tmp_path / "alone"  # part 2 of build b without its part 1 beside it
    alone.mkdir()
    for f in other2.iterdir():
        (alone / f.name).write_bytes(f.read_bytes())
    dest = tmp_path / "device"
    assert _unpack("stash", part1, dest).returncode == 0
    res = _unpack("unpack", alone, dest)
    assert res.returncode == 1 and "do not match" in res.stderr
    assert not (dest / "site" / "tvm" / "lib" / "libtvm_compiler.so").exists()
