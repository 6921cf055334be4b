"""Unpack the GPU kit on the far side (standard library only; run_on_h200.sh calls it).

    python3 unpack.py stash PART1_DIR DEST    # call 1: keep part 1's chunk in DEST/stash
    python3 unpack.py unpack PART2_DIR DEST   # call 2: DEST/site, with tvm/lib/libtvm_compiler.so

``unpack`` takes part 1's chunk from ``DEST/stash`` (or from ``PART1_DIR`` beside ``PART2_DIR``,
when both parts are on one machine), checks every sha256 the manifest names, and prints its
timings as JSON (also written to ``DEST/unpack.json``). A second ``unpack`` of the same kit does
nothing. Exit status 3: part 1 is missing (the machine was given back between the two calls).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
import sys
import tarfile
import time
from pathlib import Path

MISSING = 3


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stash(part1: Path, dest: Path) -> int:
    manifest = json.loads((part1 / "MANIFEST.json").read_text())
    chunk = part1 / "libtvm_compiler.so.xz.0"
    t0 = time.perf_counter()
    data = chunk.read_bytes()
    if _sha(data) != manifest["compiler"]["chunk_sha256"][0]:
        print(f"unpack: {chunk} does not match the manifest", file=sys.stderr)
        return 1
    (dest / "stash").mkdir(parents=True, exist_ok=True)
    shutil.copy(chunk, dest / "stash" / chunk.name)
    print(json.dumps({"stashed_bytes": len(data), "seconds": round(time.perf_counter() - t0, 2)}))
    return 0


def unpack(part2: Path, dest: Path) -> int:
    manifest = json.loads((part2 / "MANIFEST.json").read_text())
    comp = manifest["compiler"]
    done = dest / "site" / ".unpacked"
    if done.exists() and done.read_text() == comp["xz_sha256"]:
        print(json.dumps({"already_unpacked": str(dest / "site")}))
        return 0
    first = [dest / "stash" / "libtvm_compiler.so.xz.0", part2.parent / "part1" / "libtvm_compiler.so.xz.0"]
    found = [p for p in first if p.exists()]
    if not found:
        print(
            "unpack: part 1 of the kit is not on this machine (no "
            f"{first[0]}): the machine was given back between the two calls. Make both calls "
            "again, the second at once after the first (benches/gpu_kit/README.md).",
            file=sys.stderr,
        )
        return MISSING
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    # the kept chunk of this build (a stale one from another build may lie beside it)
    head = next((b for b in (p.read_bytes() for p in found) if _sha(b) == comp["chunk_sha256"][0]), b"")
    data = head + (part2 / "libtvm_compiler.so.xz.1").read_bytes()
    if _sha(data) != comp["xz_sha256"]:
        print(
            "unpack: the compiler's chunks do not match the manifest (parts of two builds?)", file=sys.stderr
        )
        return 1
    timings["read_and_check_chunks_s"] = time.perf_counter() - t0

    if (dest / "site").exists():
        shutil.rmtree(dest / "site")
    t0 = time.perf_counter()
    with tarfile.open(part2 / "site.tar.xz", "r:xz") as tar:
        tar.extractall(dest, filter="tar" if hasattr(tarfile, "tar_filter") else None)
    timings["site_tar_xz_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    lib = lzma.decompress(data)
    timings["compiler_xz_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if _sha(lib) != comp["sha256"]:
        print("unpack: libtvm_compiler.so does not match the manifest after decompression", file=sys.stderr)
        return 1
    target = dest / "site" / comp["path"]
    target.write_bytes(lib)
    target.chmod(0o755)
    timings["compiler_check_and_write_s"] = time.perf_counter() - t0
    done.write_text(comp["xz_sha256"])
    out = {k: round(v, 2) for k, v in timings.items()}
    out["total_s"] = round(sum(timings.values()), 2)
    (dest / "unpack.json").write_text(json.dumps(out))
    print(json.dumps(out))
    return 0


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] not in ("stash", "unpack"):
        print(__doc__, file=sys.stderr)
        return 2
    part, dest = Path(sys.argv[2]), Path(sys.argv[3])
    dest.mkdir(parents=True, exist_ok=True)
    return stash(part, dest) if sys.argv[1] == "stash" else unpack(part, dest)


if __name__ == "__main__":
    sys.exit(main())
