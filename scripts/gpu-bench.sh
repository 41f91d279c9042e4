#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu-check.sh has built build-gpu: issue
# 8's benchmark in one run -- PyTorch's baseline of the same configurations,
# then `kvsim bench` of the full CUDA suite joined with it (speed-up per row),
# then the CPU oracle's small suite at 1 and all threads beside PyTorch's CPU
# baseline. Tables and JSON go to $OUT. Every step runs under `timeout`.
#   usage: scripts/gpu-bench.sh            (after gpu-check.sh; carry [".deps"])
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
min_seconds="${KVSIM_BENCH_MIN_SECONDS:-0.15}"
# --baseline FILE when PyTorch left a report (a run cut short leaves its finished rows).
baseline() { [ -s "$1" ] && echo "--baseline $1"; }
step() { echo "== $1 ($(( $(date +%s) - start )) s)"; }
start=$(date +%s)

step "cuda: configurations"
"$bin/kvsim" bench --backend cuda --list --json > "$OUT/cases-cuda.json"
step "cuda: PyTorch baseline"
timeout "${KVSIM_TORCH_CUDA_SECONDS:-150}" python3 -u bench/pytorch_baseline.py --cases "$OUT/cases-cuda.json" --output "$OUT/torch-cuda.json" > "$OUT/torch-cuda.txt" 2>&1
echo "rc=$?"; cat "$OUT/torch-cuda.txt"
step "cuda: kvsim bench"
timeout "${KVSIM_BENCH_CUDA_SECONDS:-200}" stdbuf -oL "$bin/kvsim" bench --backend cuda --min-seconds "$min_seconds" \
  $(baseline "$OUT/torch-cuda.json") --output "$OUT/bench-cuda.json" > "$OUT/bench-cuda.txt" 2>&1
echo "rc=$?"; cat "$OUT/bench-cuda.txt"

threads=$(nproc)
step "cpu: configurations"
"$bin/kvsim" bench --backend cpu --list --json > "$OUT/cases-cpu.json"
step "cpu: PyTorch baseline ($threads threads)"
timeout "${KVSIM_TORCH_CPU_SECONDS:-60}" python3 -u bench/pytorch_baseline.py --device cpu --cases "$OUT/cases-cpu.json" --output "$OUT/torch-cpu.json" > "$OUT/torch-cpu.txt" 2>&1
echo "rc=$?"; cat "$OUT/torch-cpu.txt"
step "cpu: kvsim bench (1 and $threads threads)"
timeout "${KVSIM_BENCH_CPU_SECONDS:-150}" stdbuf -oL "$bin/kvsim" bench --backend cpu --threads 1 --threads "$threads" --min-seconds "$min_seconds" \
  $(baseline "$OUT/torch-cpu.json") --output "$OUT/bench-cpu.json" > "$OUT/bench-cpu.txt" 2>&1
echo "rc=$?"; cat "$OUT/bench-cpu.txt"
step "done"
