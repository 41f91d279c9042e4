#!/usr/bin/env bash
# On the GPU machine (see ../shared/DEVICE.md): unpack the Debian packages
# carried in .deps/debs, build with CUDA for sm_90, run the whole test suite
# (the differential CPU-vs-CUDA tests included), run `kvsim diff` over every
# built-in scenario and over generated op sequences, run compute-sanitizer
# (memcheck, racecheck, initcheck, synccheck) over the differential tests, and
# print a short summary last. Logs go to $OUT. Every program runs under
# `timeout`, cut to what is left of a total budget (KVSIM_GPU_CHECK_SECONDS,
# default 540 s: a fresh machine's build takes ~120 s) so the whole script ends
# inside the device call's limit (600 s).
#   usage: scripts/gpu-check.sh            (carry [".deps"])
#          scripts/gpu-check.sh --real     instead of the suite: scenarios/real/ on cuda with
#            every invariant (KVSIM_REAL_INVARIANTS to choose), kvsim diff on them, and the
#            4.5 GiB-pool replay test (issue 13); KVSIM_GPU_CHECK_SECONDS still bounds it
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
exec > >(tee "$OUT/gpu-check.log") 2>&1
start=$(date +%s)
budget="${KVSIM_GPU_CHECK_SECONDS:-540}"
summary=()
note() { summary+=("$1"); echo "== $1"; }
# Seconds a step may take: its own cap, or what is left of the budget minus a reserve.
allow() {
  local cap=$1 reserve=${2:-10} left
  left=$(( budget - ( $(date +%s) - start ) - reserve ))
  (( left < 5 )) && left=5
  (( cap < left )) && echo "$cap" || echo "$left"
}
# The device call brings back at most 8 files from $OUT: past that, every log but this one's
# goes into logs.tar.gz.
pack_logs() {
  local files=("$OUT"/*)
  (( ${#files[@]} <= 8 )) && return
  ( cd "$OUT" && find . -maxdepth 1 -type f ! -name gpu-check.log ! -name logs.tar.gz -printf '%P\n' |
      tar czf logs.tar.gz -T - --remove-files )
}
finish() {
  printf '%s\n' "" "== summary ($(( $(date +%s) - start )) s) ==" "${summary[@]}"
  pack_logs
  exit "${1:-0}"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
jobs=$(nproc)

t0=$(date +%s)
# The PATH's python3 there is the PyTorch venv's (torch with CUDA, numpy, pytest): gpu_configure names
# it, so that CMake's own choice (the first of /usr/bin/python3 and the PATH's that has numpy and pytest) cannot differ.
if gpu_configure > "$OUT/build.log" 2>&1 &&
   timeout "$(allow 240 200)" cmake --build build-gpu -j"$jobs" >> "$OUT/build.log" 2>&1; then
  note "build: ok ($(( $(date +%s) - t0 )) s)"
else
  note "build: FAILED (see build.log)"
  grep -E "error|FAILED" "$OUT/build.log" | head -30
  tail -20 "$OUT/build.log"
  finish 1
fi

if [ "${1:-}" = "--real" ]; then
  "$bin/kvsim" validate scenarios/real/*.toml > "$OUT/real-validate.txt" 2>&1
  note "kvsim validate scenarios/real: rc=$?"
  sed 's/^/   /' "$OUT/real-validate.txt"
  for f in scenarios/real/*.toml; do
    t0=$(date +%s)
    name=$(basename "$f" .toml)
    /usr/bin/time -v timeout "$(allow 600 60)" stdbuf -oL "$bin/kvsim" run "$f" --backend cuda --details \
      ${KVSIM_REAL_INVARIANTS:+--invariants "$KVSIM_REAL_INVARIANTS"} > "$OUT/real-run-$name.txt" 2>&1
    rc=$?
    note "kvsim run --backend cuda $name: rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E 'scenarios on cuda' "$OUT/real-run-$name.txt" | tail -1 | cut -c1-160); $(grep -E 'Maximum resident' "$OUT/real-run-$name.txt" | sed 's/^[[:space:]]*//')"
    grep -E "^$name " "$OUT/real-run-$name.txt" | sed 's/^/   /'
  done
  t0=$(date +%s)
  timeout "$(allow 600 30)" stdbuf -oL "$bin/kvsim" diff scenarios/real/*.toml > "$OUT/real-diff.txt" 2>&1
  note "kvsim diff scenarios/real: rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E 'run\(s\)|differ' "$OUT/real-diff.txt" | tail -1)"
  t0=$(date +%s)
  KVSIM_LARGE_POOL_TEST=1 KVSIM_LARGE_POOL_BACKEND=cuda timeout "$(allow 300 10)" "$bin/run_cli_test" \
    -tc="*pools beyond 4 GiB*" > "$OUT/real-large-pool.txt" 2>&1
  note "4.5 GiB pools on cuda (run_cli_test): rc=$? ($(( $(date +%s) - t0 )) s)"
  finish 0
fi

# The differential tests first (the ones this machine exists for), then the
# rest of the suite.
t0=$(date +%s)
# (attention_differential_test alone takes ~125 s on the H200 since the mma ring kernel's sweep.)
timeout "$(allow 220 170)" ctest --test-dir build-gpu -L cuda --output-on-failure -j4 --timeout 210 \
  > "$OUT/ctest-cuda.log" 2>&1
rc=$?
note "ctest -L cuda: rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E 'tests passed|tests failed' "$OUT/ctest-cuda.log" | tail -1)"
grep -E "^ *[0-9]+/[0-9]+ Test" "$OUT/ctest-cuda.log" | sed 's/^/   /' | head -20
grep -hE "ops, [0-9]+ bytes compared|Not Run|Failed|first difference" "$OUT/ctest-cuda.log" | head -20

t0=$(date +%s)
# KVSIM_CTEST_EXCLUDE: a test-name regex to leave out when time is short (e.g.
# the CPU-only exhaustive codec sweep, which CI runs).
timeout "$(allow 150 150)" ctest --test-dir build-gpu -LE cuda ${KVSIM_CTEST_EXCLUDE:+-E "$KVSIM_CTEST_EXCLUDE"} --output-on-failure -j"$jobs" \
  --timeout 140 > "$OUT/ctest-rest.log" 2>&1
rc=$?
note "ctest (every other label): rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E 'tests passed|tests failed' "$OUT/ctest-rest.log" | tail -1)"
grep -E "\(Failed\)|\(Timeout\)|\*\*\*" "$OUT/ctest-rest.log" | head -10

# kvsim diff: every built-in scenario, then generated op sequences.
t0=$(date +%s)
timeout "$(allow 90 110)" stdbuf -oL "$bin/kvsim" diff > "$OUT/diff-scenarios.txt" 2>&1
rc=$?
note "kvsim diff (every scenario): rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E 'run\(s\)' "$OUT/diff-scenarios.txt" | tail -1)"
[ $rc -ne 0 ] && tail -20 "$OUT/diff-scenarios.txt"
for values in --finite ""; do
  t0=$(date +%s)
  log="$OUT/diff-generated.txt"
  echo "== kvsim diff --generated 150 --seed 2026 $values" >> "$log"
  timeout "$(allow 45 90)" stdbuf -oL "$bin/kvsim" diff --generated 150 --seed 2026 $values > "$log.part" 2>&1
  rc=$?
  cat "$log.part" >> "$log"
  rm -f "$log.part"
  note "kvsim diff --generated 150 ${values:-(NaN/Inf included)}: rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E 'run\(s\)' "$log" | tail -1)"
  [ $rc -ne 0 ] && tail -12 "$log"
done

# kvsim run on the CUDA backend: every built-in scenario with every invariant.
t0=$(date +%s)
timeout "$(allow 90 110)" stdbuf -oL "$bin/kvsim" run --backend cuda > "$OUT/run-cuda.txt" 2>&1
rc=$?
note "kvsim run --backend cuda (every scenario): rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -E 'scenarios on cuda' "$OUT/run-cuda.txt" | tail -1 | cut -c1-60)"
[ $rc -ne 0 ] && tail -12 "$OUT/run-cuda.txt"

# A window of the Mooncake synthetic trace as a scenario (docs/traces.md), with KV contents and
# every invariant: fp8 + NaN-poisoned pages + a sliding/full [layers] pair + an offload tier (all
# eleven in one run), then the two set-ups that split them: the offload tier alone (every
# invariant but window), the [layers] pair alone (window).
t0=$(date +%s)
trace_window=(--trace traces/mooncake_synthetic_trace.jsonl --requests 56:62 --scale 1/32 --step-ms 100 --kv-dtype fp8_e4m3 --poison-nan)
rc=0
{ timeout "$(allow 60 100)" "$bin/kvsim" run --backend cuda --details "${trace_window[@]}" --primary-blocks 64 --secondary-blocks 64 --layer-windows 256,0 || rc=$?
  timeout "$(allow 60 90)" "$bin/kvsim" run --backend cuda --details "${trace_window[@]}" --primary-blocks 40 --secondary-blocks 64 || rc=$?
  timeout "$(allow 60 80)" "$bin/kvsim" run --backend cuda --details "${trace_window[@]}" --primary-blocks 64 --layer-windows 256,0 || rc=$?
} > "$OUT/run-cuda-trace.txt" 2>&1
passed=$(grep -oE ': [a-z_]+ pass' "$OUT/run-cuda-trace.txt" | awk '{print $2}' | sort -u | tr '\n' ' ')
note "kvsim run --backend cuda --trace (Mooncake requests 56..61, three cache set-ups): rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -c 'pass$' "$OUT/run-cuda-trace.txt") runs all pass; invariants passed: ${passed}($(echo $passed | wc -w) of 11)"

# kvsim mma-check: the tensor cores' mma.sync (inline PTX) against core's
# model of it, 10^8 random and 2.5 * 10^7 targeted inner products per input
# type, bit for bit (docs/canonical-arithmetic.md, "Tensor-core inner product").
t0=$(date +%s)
timeout "$(allow 60 80)" stdbuf -oL "$bin/kvsim" mma-check > "$OUT/mma-check.txt" 2>&1
rc=$?
note "kvsim mma-check (bf16, fp16, e4m3, e5m2 against the model): rc=$rc ($(( $(date +%s) - t0 )) s)"
grep -E "^kvsim mma-check|all \(model|for the host" "$OUT/mma-check.txt" | sed 's/^/   /'

# kvsim bench on the GPU at small sizes: every op runs and matches the oracle
# (the full tables with the PyTorch baseline: scripts/gpu-bench.sh).
t0=$(date +%s)
timeout "$(allow 60 80)" stdbuf -oL "$bin/kvsim" bench --backend cuda --sequences 4 --tokens 300 --min-seconds 0 \
  > "$OUT/bench-cuda-small.txt" 2>&1
note "kvsim bench --backend cuda (small suite, every row checked against the oracle): rc=$? ($(( $(date +%s) - t0 )) s)"

# compute-sanitizer over the differential tests, each tool on a reduced sweep
# (KVSIM_SWEEP_CASES: still every value of every axis).
if command -v compute-sanitizer >/dev/null 2>&1; then
  export KVSIM_SWEEP_CASES=14
  for tool in memcheck racecheck initcheck synccheck; do
    log="/tmp/sanitizer-$tool.log"
    t0=$(date +%s)
    timeout "$(allow 40 20)" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/ops_differential_test" \
      > "$log" 2>&1
    rc=$?
    { echo "== $tool"; cat "$log"; } >> "$OUT/sanitizer.log"
    note "compute-sanitizer $tool ops_differential_test: rc=$rc ($(( $(date +%s) - t0 )) s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1) $(grep -E 'test cases' "$log" | tail -1)"
  done
  # The attention kernels: the NaN-tail and one-token-prefill cases (both paths, every tail dtype).
  for tool in memcheck racecheck initcheck synccheck; do
    log="/tmp/sanitizer-attention-$tool.log"
    t0=$(date +%s)
    cap=40; [ "$tool" = racecheck ] && cap=110  # racecheck of the prefill kernel's tiles took 40-100 s on the H200
    timeout "$(allow "$cap" 20)" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/attention_differential_test" \
      --test-case='*NanTail*,*OneTokenPrefill*' > "$log" 2>&1
    rc=$?
    { echo "== $tool attention"; cat "$log"; } >> "$OUT/sanitizer.log"
    note "compute-sanitizer $tool attention_differential_test (NaN tail, one-token prefill): rc=$rc ($(( $(date +%s) - t0 )) s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1) $(grep -E 'test cases' "$log" | tail -1)"
  done
  timeout "$(allow 30 10)" compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/core_device_test" \
    --test-case-exclude='*every fp32 input*' > /tmp/sanitizer-core.log 2>&1
  rc=$?
  { echo "== memcheck core_device_test"; cat /tmp/sanitizer-core.log; } >> "$OUT/sanitizer.log"
  note "compute-sanitizer memcheck core_device_test: rc=$rc $(grep -E 'ERROR SUMMARY' /tmp/sanitizer-core.log | tail -1)"
else
  note "compute-sanitizer: not found"
fi
finish 0
