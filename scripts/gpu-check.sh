#!/usr/bin/env bash
# On the GPU machine (see ../shared/DEVICE.md): unpack the Debian packages
# carried in .deps/debs, build with CUDA for sm_90, run the whole test suite
# (the differential CPU-vs-CUDA tests included), run compute-sanitizer on the
# differential tests, and print a short summary last. Logs go to $OUT.
#   usage: scripts/gpu-check.sh            (carry [".deps"])
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/kvsim-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-check.log") 2>&1
summary=()
note() { summary+=("$1"); }

pfx=/tmp/pfx
mkdir -p "$pfx"
for f in .deps/debs/*.deb; do dpkg -x "$f" "$pfx"; done
export LD_LIBRARY_PATH="$pfx/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

t0=$(date +%s)
if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$pfx/usr" \
     -DKVSIM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 &&
   cmake --build build-gpu -j"$(nproc)" > "$OUT/build.log" 2>&1; then
  note "build: ok ($(( $(date +%s) - t0 )) s)"
else
  note "build: FAILED (see build.log / configure.log)"
  tail -40 "$OUT/build.log" "$OUT/configure.log"
  printf '%s\n' "== summary ==" "${summary[@]}"
  exit 1
fi

t0=$(date +%s)
timeout 420 ctest --test-dir build-gpu --output-on-failure -j4 > "$OUT/ctest.log" 2>&1
rc=$?
note "ctest: rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
grep -E "Skipped|Failed|\*\*\*" "$OUT/ctest.log" | head -20 > "$OUT/ctest-problems.txt"
cuda_lines=$(grep -E "cuda\." "$OUT/ctest.log" | head -10)
note "cuda tests: ${cuda_lines//$'\n'/ | }"

# compute-sanitizer: the differential tests' offset / nvfp4 / RoPE kernels
# (the exhaustive 2^32 codec sweep is skipped under the sanitizer for time).
if command -v compute-sanitizer >/dev/null 2>&1; then
  for t in build-gpu/bin/core_device_test; do
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$t" \
      --test-case-exclude='*every fp32 input*' > "$OUT/sanitizer-$(basename "$t").log" 2>&1
    note "compute-sanitizer memcheck $(basename "$t"): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer-$(basename "$t").log" | tail -1)"
  done
else
  note "compute-sanitizer: not found"
fi

printf '%s\n' "== summary ==" "${summary[@]}"
