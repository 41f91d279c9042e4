#!/usr/bin/env bash
# On the GPU machine (../shared/DEVICE.md), one kernel change checked and timed
# in one short call: build kvsim and the three CUDA differential tests for
# sm_90, run the test cases named in KVSIM_ROWS_TESTS (lines of
# "BINARY [doctest filters]", e.g. "ops_differential_test -tc=*Reshape*"), then
# `kvsim bench --backend cuda` on the rows whose names contain any argument
# (each row's oracle check included), with the same run's copy bandwidth.
# Logs to $OUT; every step under `timeout` inside KVSIM_GPU_ROWS_SECONDS
# (default 420).
#   usage: KVSIM_ROWS_TESTS=$'core_device_test -tc=*Fp8Pair*' scripts/gpu-rows.sh "reshape_and_cache" ...
#          (carry [".deps"])
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
budget="${KVSIM_GPU_ROWS_SECONDS:-420}"
# KVSIM_ROWS_TARGETS: the targets to build (default kvsim and the three differential tests).
# shellcheck disable=SC2086
gpu_build 60 ${KVSIM_ROWS_TARGETS:-kvsim core_device_test ops_differential_test attention_differential_test} || exit 1
n=0
while IFS= read -r line; do
  [ -z "$line" ] && continue
  n=$((n + 1))
  read -r -a words <<< "$line"
  step "test: $line"
  timeout "$(left 40)" stdbuf -oL "$bin/${words[0]}" "${words[@]:1}" > "$OUT/test-$n.log" 2>&1
  echo "rc=$?"; grep -E "test cases|assertions|ERROR|first difference|bytes compared" "$OUT/test-$n.log" | head -12
done <<< "${KVSIM_ROWS_TESTS:-}"
if [ $# -gt 0 ]; then
  only=(); for r in "$@"; do only+=(--only "$r"); done
  step "kvsim bench: $*"
  timeout "$(left 5)" stdbuf -oL "$bin/kvsim" bench --backend cuda "${only[@]}" --min-seconds "${KVSIM_BENCH_MIN_SECONDS:-0.1}" \
    --output "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
  echo "rc=$?"; cat "$OUT/bench.txt"
fi
step "done"
