#!/usr/bin/env bash
# On the GPU machine (../shared/DEVICE.md), issue 13's prefill kernel in one
# short call: build kvsim and the attention differential test for sm_90, run
# the prefill differential cases (tiled kernel and the partition plan against
# the CPU oracle, byte for byte), then `kvsim bench` rows fma_throughput and
# prefill_attention (16K, 64K) beside PyTorch SDPA on the same shapes, then the
# rest of the attention differential test. Logs to $OUT; every step under
# `timeout` inside KVSIM_GPU_PREFILL_SECONDS (default 330).
#   usage: scripts/gpu-prefill.sh            (carry [".deps"])
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
budget="${KVSIM_GPU_PREFILL_SECONDS:-330}"
gpu_build 90 kvsim attention_differential_test || exit 1
step "prefill differential cases"
timeout "$(left 80)" stdbuf -oL "$bin/attention_differential_test" -tc='*Prefill*' > "$OUT/diff-prefill.log" 2>&1
echo "rc=$?"; grep -E "MESSAGE|tiled|test cases|assertions|ERROR|first difference" "$OUT/diff-prefill.log" | head -30
step "PyTorch SDPA on the prefill shapes"
"$bin/kvsim" bench --backend cuda --list --json --only prefill_attention > /tmp/cases.json
timeout 60 python3 -u bench/pytorch_baseline.py --cases /tmp/cases.json --output "$OUT/torch.json" > "$OUT/torch.txt" 2>&1
echo "rc=$?"; cat "$OUT/torch.txt"
step "kvsim bench: fma_throughput, prefill_attention"
baseline=""; [ -s "$OUT/torch.json" ] && baseline="--baseline $OUT/torch.json"
timeout "$(left 20)" stdbuf -oL "$bin/kvsim" bench --backend cuda --only fma_throughput --only prefill_attention \
  --min-seconds 0.05 $baseline --output "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
echo "rc=$?"; cat "$OUT/bench.txt"
step "the rest of the attention differential test"
timeout "$(left 5)" stdbuf -oL "$bin/attention_differential_test" -tce='*Prefill*' > "$OUT/diff-rest.log" 2>&1
echo "rc=$?"; grep -E "test cases|assertions|ERROR" "$OUT/diff-rest.log" | head -10
step "done"
