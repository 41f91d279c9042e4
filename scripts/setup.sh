#!/usr/bin/env bash
# Installs what kvsim needs (Debian 12 packages, only those missing), then
# configures and builds kvsim into ./build. Safe to run again: it only
# installs what is missing and rebuilds what changed.
#   KVSIM_BUILD_DIR   build folder (default: build)
#   KVSIM_CUDA        AUTO (default: CUDA parts when nvcc is found), ON or OFF
set -euo pipefail
cd "$(dirname "$0")/.."

# clang and libclang-rt-14-dev (libFuzzer, the sanitizer runtimes) are for
# scripts/sanitize.sh, which CI runs after the test suite. python3-dev,
# pybind11-dev and libdlpack-dev build the Python module (python/); numpy,
# pytest and torch run its tests (docs/python.md). chromium is for the report's
# browser test (tests/report; it skips, saying so, without it).
packages=(g++ cmake ninja-build jq libeigen3-dev libtbb-dev doctest-dev libcli11-dev
          libtomlplusplus-dev nlohmann-json3-dev libmsgpack-cxx-dev clang libclang-rt-14-dev
          python3-dev pybind11-dev libdlpack-dev python3-numpy python3-pytest python3-torch chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kvsim setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update
  "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi

# nvcc lives outside the default PATH on CUDA Toolkit installs.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

build_dir="${KVSIM_BUILD_DIR:-build}"
# The Python module and its tests use Debian's interpreter (where apt puts numpy,
# pytest and torch), not whichever python3 comes first on the PATH.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIM_CUDA="${KVSIM_CUDA:-AUTO}" \
  -DPython3_EXECUTABLE="${KVSIM_PYTHON:-/usr/bin/python3}"
cmake --build "$build_dir" -j"$(nproc)"
