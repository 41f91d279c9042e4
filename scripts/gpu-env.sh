# Sourced by every scripts/gpu-*.sh on the GPU machine (carry [".deps"]; see
# ../shared/DEVICE.md): the repository root as the working directory, $OUT,
# the Debian packages of .deps/debs unpacked into $pfx (CMake's prefix; their
# libraries on LD_LIBRARY_PATH), $bin, and gpu_configure: the one CMake
# configuration of build-gpu every script shares (CUDA for sm_90, the PATH's
# python3 named so CMake cannot pick another; at most 60 s), extra arguments appended.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/kvsim-out}"
mkdir -p "$OUT"
pfx=/tmp/pfx
mkdir -p "$pfx"
for f in .deps/debs/*.deb; do dpkg -x "$f" "$pfx"; done
export LD_LIBRARY_PATH="$pfx/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=build-gpu/bin
gpu_configure() {
  timeout 60 cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$pfx/usr" -DKVSIM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DPython3_EXECUTABLE="$(command -v python3)" "$@"
}
