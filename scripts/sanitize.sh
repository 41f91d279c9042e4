#!/usr/bin/env bash
# The sanitizer part of CI (README.md, "Sanitizers and fuzzing"): builds the
# "asan" preset into ./build-asan (clang, ASan + UBSan without recovery, the
# libFuzzer targets, CPU only), runs the core, oracle, CLI and bench suites under it
# (the exhaustive 2^32 codec sweep stays with the normal build) and a smoke
# run of every fuzz target over its seed corpus. Prints the time it took.
#   KVSIM_FUZZ_SMOKE_RUNS   executions per fuzz target (default 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
jobs="$(nproc)"
cmake --preset asan -DKVSIM_FUZZ_SMOKE_RUNS="${KVSIM_FUZZ_SMOKE_RUNS:-20000}" >/dev/null
# Only what the asan test preset runs (core, oracle, cli, bench suites, fuzz targets) and kvsim itself.
targets=$(ctest --preset asan -N | sed -n 's/^ *Test *#[0-9]*: [a-z]*\.\(.*\)$/\1/p')
cmake --build --preset asan -j"$jobs" --target kvsim $targets
built=$(date +%s)
# Leak checks stay on; UBSan stops at the first report (-fno-sanitize-recover) and prints a stack.
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --preset asan -j"$jobs"
end=$(date +%s)
echo "kvsim sanitize: build $((built - start)) s, suites and fuzz smoke $((end - built)) s, total $((end - start)) s"
