#!/usr/bin/env bash
# On the GPU machine (carry [".deps"]): build the kvsim Python module against
# the machine's PyTorch venv, run the pytest suite there, and if a test
# crashes, gather what names the cause (docs/python.md, "The GPU machine's
# crash"): which libraries the process loaded, which of the module's symbols
# the dynamic linker bound to another library, oneTBB's own report, and the
# faulting pc / caller from the module's SEGV handler; then the same with the
# module linked without --exclude-libs (KVSIM_PYTHON_EXCLUDE_LIBS=OFF), to see
# whether the symbol isolation is what makes the difference. Logs in $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
exec > >(tee "$OUT/gpu-python.log") 2>&1
py="$(command -v python3)"
t0=$(date +%s)
gpu_configure -DKVSIM_PYTHON_EXCLUDE_LIBS=ON > "$OUT/python-build.log" 2>&1 &&
  timeout 300 cmake --build build-gpu -j"$(nproc)" --target kvsim kvsim_python >> "$OUT/python-build.log" 2>&1
echo "== build (module with --exclude-libs): rc=$? ($(( $(date +%s) - t0 )) s)"
grep -E "kvsim: Python module" "$OUT/python-build.log"
mod=$(ls build-gpu/python/kvsim/_kvsim*.so)
echo "== exported symbols: $(nm -D --defined-only "$mod" | wc -l)"
echo "== torch/lib:"; ls "$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')/lib" | tr '\n' ' '; echo
echo "== ldd (tbb, hwloc, cuda, stdc++, gomp):"; ldd "$mod" | grep -E "tbb|hwloc|cuda|stdc|gomp" | sed 's/^/   /'

export PYTHONPATH="$PWD/build-gpu/python" KVSIM_BINARY="$PWD/build-gpu/bin/kvsim" KVSIM_SOURCE_DIR="$PWD" \
  KVSIM_SEGV_BACKTRACE=1 PYTHONFAULTHANDLER=1
t0=$(date +%s)
timeout 300 "$py" -m pytest -q -p no:cacheprovider --capture=sys python/tests python/examples/test_reference_backend.py \
  > "$OUT/pytest.log" 2>&1
echo "== pytest (module with --exclude-libs): rc=$? ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/pytest.log")"
grep -E "^kvsim:|Fatal Python|File .*line" "$OUT/pytest.log" | head -12

repro=(-c "import sys; sys.argv[1:] and __import__(sys.argv[1]); import kvsim; r = kvsim.replay('scenarios/quant_fp8_e4m3.toml'); print('replay ok:', r['ok'])")
probe() {  # $1: label; the rest: the module to import first (or none)
  local label=$1; shift
  timeout 60 env TBB_VERSION=1 "$py" "${repro[@]}" "$@" > "$OUT/repro-$label.log" 2>&1
  echo "== replay, $label: rc=$?"
  grep -E "replay ok|^kvsim:|TBB: (VERSION|TBBBIND|TBBMALLOC)|Fatal Python" "$OUT/repro-$label.log" | head -14 | sed 's/^/   /'
}
probe kvsim-only
probe torch-first torch

t0=$(date +%s)
cmake -DKVSIM_PYTHON_EXCLUDE_LIBS=OFF build-gpu > /dev/null 2>&1 &&
  timeout 120 cmake --build build-gpu -j"$(nproc)" --target kvsim_python >> "$OUT/python-build.log" 2>&1
echo "== relink without --exclude-libs: rc=$? ($(( $(date +%s) - t0 )) s); exported symbols: $(nm -D --defined-only "$mod" | wc -l)"
probe plain-kvsim-only
probe plain-torch-first torch
# Which of the module's own references the dynamic linker bound elsewhere than
# to the module itself or the system's C/C++ runtime.
timeout 60 env LD_DEBUG=bindings "$py" "${repro[@]}" torch 2> "$OUT/bindings.raw" > /dev/null
grep -E "binding file [^ ]*_kvsim" "$OUT/bindings.raw" | grep -vE "to [^ ]*(_kvsim|libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux)" |
  sed -E "s/.* to ([^ ]*) .*symbol \`([^']*)'.*/\\1 \\2/" | sort | uniq -c | sort -rn | head -40 > "$OUT/bindings.txt"
echo "== module symbols bound to other libraries (count, library, symbol), torch first:"
head -40 "$OUT/bindings.txt" | sed 's/^/   /'
rm -f "$OUT/bindings.raw"
timeout 200 "$py" -m pytest -q -p no:cacheprovider --capture=sys python/tests -x > "$OUT/pytest-plain.log" 2>&1
echo "== pytest (module without --exclude-libs): rc=$?: $(tail -1 "$OUT/pytest-plain.log")"
