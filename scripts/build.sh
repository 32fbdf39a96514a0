#!/usr/bin/env bash
# Configures and builds into build/ (or $SENTINEL_BUILD_DIR) against the LibTorch of the project's
# PyTorch (scripts/setup.sh installs it), with CUDA. Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_path.sh
source scripts/compiler_cache.sh
if ! "$SENTINEL_PYTHON" -c 'import torch' >/dev/null 2>&1; then
  echo "build: no PyTorch in $SENTINEL_VENV: run scripts/setup.sh first (or set SENTINEL_VENV to an environment with torch)" >&2
  exit 1
fi
build_dir=${SENTINEL_BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# Configure when there is no generated build yet (a configure that failed leaves a cache only).
if [ ! -f "$build_dir/build.ninja" ] && [ ! -f "$build_dir/Makefile" ]; then
  torch_prefix=$("$SENTINEL_PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DSENTINEL_FIXTURE_PYTHON="$SENTINEL_PYTHON" \
    -DSENTINEL_ENABLE_CUDA="${SENTINEL_ENABLE_CUDA:-ON}" "${sentinel_launcher[@]}" "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$build_dir" "$@"
fi
# Two jobs: a LibTorch translation unit takes a couple of GiB and ~15 s.
cmake --build "$build_dir" -j "${SENTINEL_JOBS:-2}"
