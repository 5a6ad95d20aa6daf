#!/usr/bin/env bash
# kvbench's GPU checks on a lent H100 or H200 (issue 39), in one run of at most 8 minutes: see
# scripts/gpu_check.py for the steps. Run from the repository root with the `cuda` binary carried:
#
#   scripts/build_cuda.sh                      # here: builds target/cuda/kvbench(.xz)
#   device run, carry target/cuda/kvbench.xz and kvbench-linked.xz:  scripts/gpu_check.sh
#
# Results: $OUT/gpu_check.json (and the perf JSON files beside it). The CUDA libraries kvbench loads
# when it opens the GPU (cuBLAS, cuBLASLt, cuRAND; the runtime is linked in) are taken from the
# machine's PyTorch installation, whose CUDA 13 wheels carry them; the driver's libcuda.so.1 is the
# machine's own.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
kv=${KVBENCH_BIN:-target/cuda/kvbench}
# The binary may travel compressed (scripts/build_cuda.sh writes target/cuda/kvbench.xz), and so may
# the same build linked to the CUDA libraries as usual (kvbench-linked.xz).
unpack() {  # unpack PATH NAME: the binary at PATH, or PATH.xz unpacked to /tmp/NAME
    if [ ! -x "$1" ] && [ -f "$1.xz" ]; then
        xz -dc "$1.xz" > "/tmp/$2" && chmod +x "/tmp/$2" && echo "/tmp/$2"
    else
        echo "$1"
    fi
}
kv=$(unpack "$kv" kvbench-cuda)
linked=$(unpack "$(dirname "$kv")/kvbench-linked" kvbench-cuda-linked)
if [ -z "${KVBENCH_BIN:-}" ] && [ ! -x "$linked" ] && [ -f target/cuda/kvbench-linked.xz ]; then
    linked=$(unpack target/cuda/kvbench-linked kvbench-cuda-linked)
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
# The binary loads the CUDA libraries when it opens the GPU: a first forward pass on a tiny random
# model says whether that works here; if not, and the linked build does, the check runs that one.
if [ "${KVBENCH_SMOKE:-1}" = 1 ] && [[ " $* " != *" --device cpu "* ]]; then
    smoke() { timeout 120 "$1" forward --device cuda:0 --model random:tiny --tokens 4 > /dev/null; }
    if ! smoke "$kv" 2> /tmp/kvbench-smoke.txt; then
        echo "kvbench ($kv) failed its first GPU pass: $(tail -c 600 /tmp/kvbench-smoke.txt)" >&2
        if [ -x "$linked" ] && smoke "$linked"; then
            echo "using $linked (the CUDA libraries linked as needed ones) instead" >&2
            kv=$linked
        fi
    fi
fi
if ldd "$kv" | grep -q "not found"; then
    echo "kvbench cannot find these libraries:" >&2
    ldd "$kv" | grep "not found" >&2
fi
export PYTHONUNBUFFERED=1
exec python3 scripts/gpu_check.py --kvbench "$kv" --out "$OUT" "$@"
