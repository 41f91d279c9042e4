#!/usr/bin/env bash
# cmake --install into a scratch prefix, then build and run a consumer project
# that finds kvsim with find_package(kvsim) and links kvsim::core.
#   usage: check_install.sh BUILD_DIR CMAKE
set -euo pipefail
build="$1"
cmake_bin="$2"
here="$(cd "$(dirname "$0")" && pwd)"
work="$build/install-check"
rm -rf "$work"
"$cmake_bin" --install "$build" --prefix "$work/prefix" > "$work.install.log" 2>&1 || { cat "$work.install.log"; exit 1; }
"$cmake_bin" -S "$here/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release
"$cmake_bin" --build "$work/build"
test -x "$work/prefix/bin/kvsim"
"$work/prefix/bin/kvsim" --version
"$work/build/consumer"
# The Python module, where the build has it: the installed package imports
# from the prefix alone (from a folder outside the source and build trees),
# with the interpreter CMake built it for.
if ls "$build"/python/kvsim/_kvsim*.so > /dev/null 2>&1; then
  py="$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")"
  site="$(dirname "$(ls -d "$work"/prefix/lib/python3*/dist-packages/kvsim)")"
  (cd "$work" && PYTHONPATH="$site" "$py" -c \
    'import kvsim, os; assert os.path.dirname(kvsim.__file__).startswith(os.environ["PYTHONPATH"]); print("installed kvsim imports:", kvsim.codec.encode("e4m3", [1.5]).tolist())')
fi
