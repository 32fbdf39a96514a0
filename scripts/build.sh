#!/usr/bin/env bash
# Configures and builds into build/ (or $SENTINEL_BUILD_DIR). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${SENTINEL_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# Configure when there is no generated build yet (a configure that failed leaves a cache only).
if [ ! -f "$build_dir/build.ninja" ] && [ ! -f "$build_dir/Makefile" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$build_dir" "$@"
fi
# Two jobs: a LibTorch translation unit takes a couple of GiB and ~15 s.
cmake --build "$build_dir" -j "${SENTINEL_JOBS:-2}"
