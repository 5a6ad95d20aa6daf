#!/usr/bin/env bash
# Builds kvbench with its `cuda` feature (candle's CUDA backend) on a machine with no CUDA toolkit,
# no GPU and no driver: nvcc, the CUDA headers and libraries come from NVIDIA's PyPI wheels
# (scripts/cuda-wheels.txt, every wheel checked by sha256), and a stub libcuda.so stands in for the
# driver at link time only. The binary is target/cuda/release/kvbench; at run time it needs the
# driver's libcuda.so.1 and libcublas.so.13, libcublasLt.so.13, libcurand.so.10, libnvrtc.so.13 and
# libcudart.so.13 (a PyTorch 2.11+cu130 installation has them, or the wheels' lib/ folder printed
# below).
#
# Usage: scripts/build_cuda.sh            (CUDA_COMPUTE_CAP=90, Hopper: H100/H200; 80 for A100)
# On a machine with a CUDA 13 toolkit installed, `cargo build --release --features cuda` is enough.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
toolkit=${KVBENCH_CUDA_TOOLKIT:-$root/target/cuda-toolkit}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}

# 1. The wheels, once (a stamp records the pinned list they came from).
stamp="$toolkit/wheels.sha256"
want=$(sha256sum scripts/cuda-wheels.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "== fetching the CUDA 13.0 wheels (about 680 MB, checked by sha256)"
    rm -rf "$toolkit/site"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --require-hashes --target "$toolkit/site" -r scripts/cuda-wheels.txt
    echo "$want" > "$stamp"
fi
cu="$toolkit/site/nvidia/cu13"
[ -x "$cu/bin/nvcc" ] || { echo "error: $cu/bin/nvcc missing after the install" >&2; exit 1; }

# 2. A CUDA_HOME laid out as the build scripts expect: bin, include, nvvm, and lib64 with the
#    unversioned library names the linker asks for.
home="$toolkit/cuda"
rm -rf "$home"
mkdir -p "$home/lib64"
for d in bin include nvvm; do ln -s "$cu/$d" "$home/$d"; done
for lib in "$cu"/lib/lib*.so.*; do
    base=$(basename "$lib")
    ln -sf "$lib" "$home/lib64/$base"
    ln -sf "$lib" "$home/lib64/${base%%.so.*}.so"
done

# 3. A stub of the driver library for the link only: every cu* function the cudarc crate declares,
#    returning an error. It is never shipped nor found at run time (its directory is not on any
#    runtime path): the real libcuda.so.1 comes with the driver.
cargo fetch --locked --quiet
sys=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -path '*/cudarc-0.19.*/src/driver/sys/mod.rs' | sort | tail -1)
[ -n "$sys" ] || { echo "error: cudarc's driver bindings not found in the cargo registry" >&2; exit 1; }
grep -o '^ *fn cu[A-Za-z0-9_]*(' "$sys" | sed 's/^ *fn \(.*\)(/\1/' | sort -u |
    awk '{ printf "int %s(void) { return 999; }\n", $1 }' > "$home/libcuda_stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$home/lib64/libcuda.so" "$home/libcuda_stub.c"

# 4. The build, in its own target directory (the CPU build stays as it is).
export CUDA_HOME="$home" CUDA_PATH="$home" CUDA_ROOT="$home"
export PATH="$home/bin:$PATH"
export LIBRARY_PATH="$home/lib64${LIBRARY_PATH:+:$LIBRARY_PATH}"
echo "== building kvbench --features cuda for sm_${CUDA_COMPUTE_CAP} (about 17 minutes on 2 cores the first time)"
cargo build --release --locked --features cuda --target-dir target/cuda --bin kvbench
bin=target/cuda/release/kvbench
strip -o target/cuda/kvbench "$bin"
# Compressed for carrying to a GPU machine (the device tool carries 64 MiB per call in all).
xz -T0 -6 -k -f target/cuda/kvbench
echo "== built target/cuda/kvbench ($(du -h target/cuda/kvbench | cut -f1); target/cuda/kvbench.xz $(du -h target/cuda/kvbench.xz | cut -f1)); it needs at run time:"
objdump -p target/cuda/kvbench | awk '/NEEDED/ {print "   ", $2}'
echo "   (LD_LIBRARY_PATH=$cu/lib supplies all but libcuda.so.1, which comes with the driver)"
