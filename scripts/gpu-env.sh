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
# The short scripts' clock: seconds left of $budget (theirs to set) since this
# file was sourced, less a reserve, at least 5; and a step's header with the
# seconds elapsed.
start=$(date +%s)
left() { local l=$(( budget - ( $(date +%s) - start ) - ${1:-0} )); (( l < 5 )) && l=5; echo "$l"; }
step() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
# The GPU's name and clocks, then gpu_configure and a build of the targets
# named (log: $OUT/build.log) within what is left of $budget less RESERVE
# seconds; prints the rc and, on failure, the errors. usage: gpu_build RESERVE TARGET...
gpu_build() {
  local reserve=$1 rc
  shift
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  step "build"
  gpu_configure > "$OUT/build.log" 2>&1 &&
    timeout "$(left "$reserve")" cmake --build build-gpu -j"$(nproc)" --target "$@" >> "$OUT/build.log" 2>&1
  rc=$?
  echo "build rc=$rc"
  [ $rc -ne 0 ] && grep -E "error|FAILED" "$OUT/build.log" | head -30
  return $rc
}
