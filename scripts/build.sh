#!/usr/bin/env bash
# Configures and builds into build/ (or $SENTINEL_BUILD_DIR). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${SENTINEL_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$build_dir" "$@"
fi
# Two jobs: a LibTorch translation unit takes a couple of GiB and ~15 s.
cmake --build "$build_dir" -j "${SENTINEL_JOBS:-2}"
