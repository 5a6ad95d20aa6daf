#!/usr/bin/env bash
# kvbench's GPU checks on a lent H100 (issue 39), in one run of at most 8 minutes: see
# scripts/gpu_check.py for the steps. Run from the repository root with the `cuda` binary carried:
#
#   scripts/build_cuda.sh                      # here: builds target/cuda/kvbench(.xz)
#   device run, carry target/cuda/kvbench.xz:  scripts/gpu_check.sh
#
# Results: $OUT/gpu_check.json (and the perf JSON files beside it). The CUDA libraries kvbench links
# (cuBLAS, cuRAND, NVRTC, the runtime) are taken from the machine's PyTorch installation, whose
# CUDA 13 wheels carry them; the driver's libcuda.so.1 is the machine's own.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
kv=${KVBENCH_BIN:-target/cuda/kvbench}
# The binary may travel compressed (scripts/build_cuda.sh writes target/cuda/kvbench.xz).
if [ ! -x "$kv" ] && [ -f "$kv.xz" ]; then
    xz -dc "$kv.xz" > /tmp/kvbench-cuda && chmod +x /tmp/kvbench-cuda
    kv=/tmp/kvbench-cuda
fi
libs=$(python3 - <<'PY'
import glob, os, sys
dirs = set()
for p in sys.path:
    for lib in glob.glob(os.path.join(p, "nvidia", "*", "lib")) + glob.glob(os.path.join(p, "nvidia", "*", "*", "lib")):
        dirs.add(lib)
print(":".join(sorted(dirs)))
PY
)
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$kv" | grep -q "not found"; then
    echo "kvbench cannot find these libraries:" >&2
    ldd "$kv" | grep "not found" >&2
fi
export PYTHONUNBUFFERED=1
exec python3 scripts/gpu_check.py --kvbench "$kv" --out "$OUT" "$@"
