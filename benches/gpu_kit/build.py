"""Build the kit that runs ``benches.gpu_suite`` on a lent H200 (no TVM, no network there).

The device machine has Python 3.12, CUDA 13, numpy, scipy, psutil, cloudpickle, ml_dtypes,
typing_extensions, cuda-bindings and PyTorch (the device README's KINDS.md), and takes at most
64 MiB of files per call, the repository's own files included. TVM's compiler library alone
(``tvm/lib/libtvm_compiler.so``, 259 MB, LLVM linked in) is about 58 MiB under xz, so the kit
comes in two parts, each carried by one call, the second made while the machine is still warm:

- ``part1/``: the first half of ``libtvm_compiler.so.xz`` (split at a byte offset);
- ``part2/``: the rest of it, ``site.tar.xz`` (apache-tvm's Python package without that
  library, CUTLASS and the web runtime; apache-tvm-ffi's cp312 wheel; xgboost-cpu; the
  fastsearch abi3 wheel), the suite's ``benches/*.py`` at build time;
- both: ``run_on_h200.sh``, ``unpack.py`` (stdlib only) and ``MANIFEST.json`` (sizes, sha256).

Run with any Python that has pip (the wheels are downloaded for CPython 3.12, manylinux x86-64):

    python benches/gpu_kit/build.py --out /tmp/fastsearch_gpu_kit [--fastsearch-wheel W.whl]

Without ``--fastsearch-wheel`` the fastsearch wheel is built with maturin and zig as
``scripts/build-wheel`` builds it (both must be importable or on PATH: ``pip install maturin
ziglang``), into the cache folder, with ``CARGO_TARGET_DIR`` this checkout's ``target/``.
The xz of the compiler library (about 10 minutes on 2 cores) is cached by its sha256.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

#: The pins of pyproject.toml; xgboost-cpu is the version tested here.
TVM = "apache-tvm==0.27.0.post1"
TVM_FFI = "apache-tvm-ffi==0.1.14.post0"
XGBOOST = "xgboost-cpu==3.2.0"

#: What the H200 image already has (KINDS.md, "Python packages already there"), not carried.
ASSUMED_THERE = ["numpy", "scipy", "ml-dtypes", "typing-extensions", "psutil", "cloudpickle", "cuda-bindings"]

#: apache-tvm's files the suite never loads: CUTLASS's sources, the web runtime, bytecode.
PRUNED = ["tvm/3rdparty", "tvm/web"]

COMPILER = "tvm/lib/libtvm_compiler.so"
MIB = 1 << 20
#: The device tool's limit on what one call carries, the repository's own files included.
CALL_LIMIT = 64 * MIB

PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def download(spec: str, dest: Path) -> Path:
    """The wheel of ``spec`` for CPython 3.12 on x86-64 Linux, in ``dest`` (downloaded once)."""
    name = spec.split("==")[0].replace("-", "_")
    version = spec.split("==")[1]
    found = sorted(dest.glob(f"{name}-{version}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(dest), spec]
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        subprocess.run(cmd, check=True)
        found = sorted(dest.glob(f"{name}-{version}-*.whl"))
    if len(found) != 1:
        raise SystemExit(f"expected one wheel of {spec} in {dest}, found {[p.name for p in found]}")
    return found[0]


def build_fastsearch_wheel(dest: Path) -> Path:
    """fastsearch's manylinux2014 abi3 wheel, linked by zig (as scripts/build-wheel does)."""
    import importlib.util

    env = dict(os.environ, CARGO_TARGET_DIR=str(REPO / "target"))
    if importlib.util.find_spec("ziglang") is None:
        raise SystemExit(
            "building the fastsearch wheel needs ziglang and maturin: pip install maturin ziglang"
        )
    import ziglang  # type: ignore[import-not-found]

    zig_dir = Path(ziglang.__file__).parent
    (zig_dir / "zig").chmod(0o755)
    env["PATH"] = f"{zig_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    out = dest / "fastsearch-wheel"
    shutil.rmtree(out, ignore_errors=True)
    maturin = shutil.which("maturin", path=env["PATH"])
    if maturin is None:
        raise SystemExit("building the fastsearch wheel needs maturin: pip install maturin ziglang")
    cmd = [maturin, "build", "--release", "--zig", "--compatibility", "manylinux2014", "--out", str(out)]
    subprocess.run(cmd, cwd=REPO, env=env, check=True)
    (wheel,) = out.glob("fastsearch-*.whl")
    return wheel


def xz_file(src: Path, cache: Path, preset: int, extreme: bool) -> Path:
    """``src`` compressed with xz (one thread, the best ratio), cached by its sha256 and preset."""
    tag = f"{preset}{'e' if extreme else ''}"
    out = cache / f"{src.name}.{sha256(src)[:16]}.{tag}.xz"
    if out.exists():
        return out
    tmp = out.with_suffix(".tmp")
    t0 = time.perf_counter()
    level = preset | (lzma.PRESET_EXTREME if extreme else 0)
    with src.open("rb") as fin, lzma.open(tmp, "wb", preset=level) as fout:
        shutil.copyfileobj(fin, fout, 1 << 22)
    tmp.rename(out)
    print(f"  xz -{tag} {src.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def repo_bytes() -> int:
    """Bytes of this checkout's tracked files: what every device call carries besides the kit."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return sum(
        (REPO / p).stat().st_size for p in out.stdout.decode().split("\0") if p and (REPO / p).is_file()
    )


def _ignored(path: Path) -> bool:
    out = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO, check=False)
    return out.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/fastsearch_gpu_kit", help="the kit's folder (replaced)")
    parser.add_argument("--cache", default="/tmp/fastsearch_gpu_kit_cache", help="downloads and the xz cache")
    parser.add_argument("--fastsearch-wheel", default=None, help="a built fastsearch wheel (else built here)")
    parser.add_argument("--preset", type=int, default=9, help="xz preset of the compiler library (extreme)")
    args = parser.parse_args(argv)
    out, cache = Path(args.out), Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    if out.resolve() == REPO or (REPO in out.resolve().parents and not _ignored(out)):
        # inside a checkout only where git ignores it (the device README's excluded folder)
        raise SystemExit(f"--out {out}: build the kit outside the repository, or in a folder git ignores")

    wheels = [download(spec, cache) for spec in (TVM, TVM_FFI, XGBOOST)]
    fs_wheel = Path(args.fastsearch_wheel) if args.fastsearch_wheel else build_fastsearch_wheel(cache)
    wheels.append(fs_wheel)

    stage = cache / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    site = stage / "site"
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    for folder in PRUNED:
        shutil.rmtree(site / folder)
    for pyc in list(site.rglob("__pycache__")):
        shutil.rmtree(pyc)
    # Extracting a zip drops the executable bits; the shared libraries keep theirs as pip sets them.
    for so in site.rglob("*.so*"):
        so.chmod(0o755)
    compiler = site / COMPILER
    compiler_sha = sha256(compiler)
    compiler_size = compiler.stat().st_size
    compressed = xz_file(compiler, cache, args.preset, extreme=True)
    compiler.unlink()

    shutil.rmtree(out, ignore_errors=True)
    part1, part2 = out / "part1", out / "part2"
    for part in (part1, part2):
        part.mkdir(parents=True)
        shutil.copy(HERE / "run_on_h200.sh", part / "run_on_h200.sh")
        shutil.copy(HERE / "unpack.py", part / "unpack.py")
    t0 = time.perf_counter()
    with (
        lzma.open(part2 / "site.tar.xz", "wb", preset=9 | lzma.PRESET_EXTREME) as xz,
        tarfile.open(fileobj=xz, mode="w") as tar,
    ):
        tar.add(site, arcname="site")
    site_s = time.perf_counter() - t0
    bench_dir = part2 / "benches"
    bench_dir.mkdir()
    for py in sorted((REPO / "benches").glob("*.py")):
        shutil.copy(py, bench_dir / py.name)

    # The compiler's xz split so that the two parts weigh about the same.
    data = compressed.read_bytes()
    rest = sum(p.stat().st_size for p in part2.rglob("*") if p.is_file())
    cut = max(0, min(len(data), (len(data) + rest) // 2))
    (part1 / "libtvm_compiler.so.xz.0").write_bytes(data[:cut])
    (part2 / "libtvm_compiler.so.xz.1").write_bytes(data[cut:])

    def folder_bytes(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())

    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    manifest: dict[str, Any] = {
        "built": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "commit": git.stdout.strip(),
        "wheels": [w.name for w in wheels],
        "assumed_on_device": ASSUMED_THERE,
        "pruned": PRUNED,
        "compiler": {
            "path": COMPILER,
            "bytes": compiler_size,
            "sha256": compiler_sha,
            "xz_bytes": len(data),
            "xz_sha256": hashlib.sha256(data).hexdigest(),
            "xz_preset": f"{args.preset}e",
            "chunks": ["part1/libtvm_compiler.so.xz.0", "part2/libtvm_compiler.so.xz.1"],
            "chunk_sha256": [hashlib.sha256(data[:cut]).hexdigest(), hashlib.sha256(data[cut:]).hexdigest()],
        },
        "site_tar_xz_bytes": (part2 / "site.tar.xz").stat().st_size,
        "site_bytes_unpacked": folder_bytes(site),
        "site_tar_xz_seconds": round(site_s, 1),
    }
    for part in (part1, part2):
        (part / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    manifest["parts"] = {p.name: folder_bytes(p) for p in (part1, part2)}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))

    repo = repo_bytes()
    print(f"kit in {out} (commit {manifest['commit']}):")
    for w in wheels:
        print(f"  wheel {w.name}: {w.stat().st_size / MIB:.1f} MiB")
    print(
        f"  libtvm_compiler.so {compiler_size / MIB:.1f} MiB -> xz -{args.preset}e {len(data) / MIB:.1f} MiB"
    )
    print(
        f"  site.tar.xz (the rest, {manifest['site_bytes_unpacked'] / MIB:.1f} MiB unpacked): "
        f"{manifest['site_tar_xz_bytes'] / MIB:.1f} MiB"
    )
    ok = True
    for name, size in manifest["parts"].items():
        fits = size + repo <= CALL_LIMIT
        ok &= fits
        print(
            f"  {name}: {size / MIB:.1f} MiB, with the repository's {repo / MIB:.1f} MiB "
            f"{(size + repo) / MIB:.1f} of 64 MiB{'' if fits else ' -- TOO BIG for one call'}"
        )
    print(f"  total {sum(manifest['parts'].values()) / MIB:.1f} MiB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
