# A bash script: run it as `bash run_on_h200.sh ...`, as the calls below do.
# The far side of the GPU kit (benches/gpu_kit/README.md). Two device calls, the second made at
# once after the first, while the machine is still warm (it keeps its files for about 30 s):
#
#   call 1, carry .gpukit/part1:  bash .gpukit/part1/run_on_h200.sh part1
#       what the suite relies on, without TVM (GPU, Python packages, libcudart, nvcc, g++), and
#       part 1 of TVM's compiler library kept in $FASTSEARCH_KIT_DEST/stash
#   call 2, carry .gpukit/part2:  bash .gpukit/part2/run_on_h200.sh run
#       unpacks TVM, TVM-FFI, xgboost and fastsearch into $FASTSEARCH_KIT_DEST/site, checks the
#       environment (python -m benches.gpu_suite --check: a CUDA kernel built and run through
#       TVM, a re-timing process, cuBLAS, 4 trials of each tuner), then runs the suite within
#       $GPU_SUITE_BUDGET_S seconds and puts its summary and raw runs in $OUT
#
# Other modes: `check` (call 2 without the suite), `smoke` (a 4-trial CPU tune, no GPU needed:
# for checking the kit off the device). Environment: PYTHON (default python3), FASTSEARCH_KIT_DEST
# (default .gpu_kit_state in the checkout, two folders above this script, a folder git ignores;
# the device keeps ignored files between calls), OUT (what comes back; default
# $FASTSEARCH_KIT_DEST/out), GPU_SUITE_ARGS, GPU_SUITE_BUDGET_S (default 360),
# TVM_CUDA_COMPILE_MODE (nvrtc, TVM's default, or nvcc; when unset and the check fails with
# nvrtc, it is tried again with nvcc).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$(cd "$HERE/../.." && pwd)"  # the script runs from .gpukit/part1 or .gpukit/part2
PY="${PYTHON:-python3}"
DEST="${FASTSEARCH_KIT_DEST:-$CHECKOUT/.gpu_kit_state}"
OUTDIR="${OUT:-$DEST/out}"
BUDGET="${GPU_SUITE_BUDGET_S:-360}"
ARGS="${GPU_SUITE_ARGS:---workloads GMM:3 C2D:1 DEP:1 SFM:0 --seeds 0 --trials 32 --retime-processes 3 --repeat 5}"
mkdir -p "$DEST/runs" "$OUTDIR"
export PYTHONUNBUFFERED=1

env_report() {
  echo "== GPU"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  echo "== Python and packages the kit does not carry"
  "$PY" - <<'EOF'
import importlib, platform, shutil, sys
print("python", platform.python_version(), sys.executable)
for m in ("numpy", "scipy", "psutil", "cloudpickle", "ml_dtypes", "typing_extensions", "cuda.bindings", "torch", "cupy", "matplotlib"):
    try:
        print(f"  {m} {getattr(importlib.import_module(m), '__version__', '?')}")
    except Exception as e:
        print(f"  {m} MISSING ({type(e).__name__}: {e})")
for tool in ("nvcc", "g++", "gcc", "xz"):
    print(f"  {tool}: {shutil.which(tool)}")
try:
    from cuda.bindings import nvrtc
    src = b'extern "C" __global__ void k(float* a) { a[threadIdx.x] += 1.0f; }'
    err, prog = nvrtc.nvrtcCreateProgram(src, b"k.cu", 0, [], [])
    (err,) = nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=sm_90"])
    print("  nvrtc sm_90 compile:", err)
except Exception as e:
    print(f"  nvrtc FAILED ({type(e).__name__}: {e})")
EOF
  echo "== libcudart.so.13: $(find_cudart)"
  df -h "$DEST" | tail -1
}

# The folder holding libcudart.so.13, which TVM's CUDA runtime library links against: the
# CUDA toolkit's (from CUDA_HOME or CUDA_PATH, the nvcc on PATH, or the dynamic linker's cache),
# or the nvidia-cuda-runtime wheel's that PyTorch uses.
find_cudart() {
  "$PY" - <<'EOF'
import glob, os, shutil, site, subprocess, sys
homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
nvcc = shutil.which("nvcc")
if nvcc:
    homes.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
roots = []
for home in filter(None, homes):
    roots += [os.path.join(home, "lib64"), os.path.join(home, "targets", "x86_64-linux", "lib")]
try:
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
except OSError:
    cache = ""
roots += [os.path.dirname(line.split("=>")[-1].strip()) for line in cache.splitlines() if "libcudart.so.13" in line]
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    roots += glob.glob(os.path.join(sp, "nvidia", "*", "lib")) + glob.glob(os.path.join(sp, "nvidia", "*", "*", "lib"))
for root in roots:
    if glob.glob(os.path.join(root, "libcudart.so.13*")):
        print(root)
        sys.exit(0)
EOF
}

setup() {
  "$PY" "$HERE/unpack.py" unpack "$HERE" "$DEST" > "$OUTDIR/unpack.json"
  local rc=$?
  cat "$OUTDIR/unpack.json"
  [ "$rc" -eq 0 ] || exit "$rc"
  local cudart
  cudart="$(find_cudart)"
  [ -n "$cudart" ] && export LD_LIBRARY_PATH="$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$DEST/site:$HERE"
  cd "$DEST/runs" || exit 1
}

run_check() {
  "$PY" -m benches.gpu_suite --check --out-dir "$DEST/check" 2>&1 | tee "$OUTDIR/check.log"
  local rc="${PIPESTATUS[0]}"
  if [ "$rc" -eq 1 ] && [ -z "${TVM_CUDA_COMPILE_MODE:-}" ] && [ -n "$(command -v nvcc)" ]; then
    echo "== the check failed with nvrtc; again with TVM_CUDA_COMPILE_MODE=nvcc"
    export TVM_CUDA_COMPILE_MODE=nvcc
    "$PY" -m benches.gpu_suite --check --out-dir "$DEST/check" 2>&1 | tee -a "$OUTDIR/check.log"
    rc="${PIPESTATUS[0]}"
  fi
  if [ -f "$DEST/check/check.json" ]; then cp "$DEST/check/check.json" "$OUTDIR/"; fi
  return "$rc"
}

case "${1:-}" in
  part1)
    env_report 2>&1 | tee "$OUTDIR/env.txt"
    "$PY" "$HERE/unpack.py" stash "$HERE" "$DEST" || exit $?
    echo "part 1 kept in $DEST/stash: make call 2 now (carry .gpukit/part2, bash .gpukit/part2/run_on_h200.sh run)"
    ;;
  check)
    setup
    run_check
    exit $?
    ;;
  run)
    setup
    run_check || { echo "the check failed (status $?): the suite is not run"; exit 1; }
    # The suite starts no run that would end past the budget; timeout is the backstop.
    # shellcheck disable=SC2086
    timeout $((BUDGET + 90)) "$PY" -m benches.gpu_suite $ARGS --budget-s "$BUDGET" --out-dir "$DEST/suite" 2>&1 \
      | tee "$OUTDIR/suite.log"
    rc="${PIPESTATUS[0]}"
    "$PY" -m benches.gpu_suite --report --out-dir "$DEST/suite" > "$OUTDIR/report.log" 2>&1
    for f in summary.json summary.md; do
      if [ -f "$DEST/suite/$f" ]; then cp "$DEST/suite/$f" "$OUTDIR/"; fi
    done
    tar czf "$OUTDIR/gpu_suite_raw.tar.gz" -C "$DEST" suite
    echo "suite status $rc; summary and raw runs in $OUTDIR"
    exit "$rc"
    ;;
  smoke)
    setup
    "$PY" -m fastsearch.cli tune --workload GMM:0 --trials 4 --work-dir "$DEST/runs/smoke" 2>&1 | tee "$OUTDIR/smoke.log"
    exit "${PIPESTATUS[0]}"
    ;;
  *)
    echo "usage: $0 part1 | run | check | smoke   (benches/gpu_kit/README.md)" >&2
    exit 2
    ;;
esac
