#!/usr/bin/env bash
# Every source file of the library, the command line and the CUDA side's host code compiled for
# aarch64 (Grace, GH200) with Debian's cross compiler, against the same third-party headers as
# the native build: syntax and semantics checked, no object written (LibTorch for aarch64 is not
# installed here). Fails on the first file that does not compile, naming it.
#   scripts/check_aarch64.sh BUILD_DIR   (BUILD_DIR: where the generated protobuf headers are)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
cxx=${SENTINEL_AARCH64_CXX:-aarch64-linux-gnu-g++}
command -v "$cxx" >/dev/null || { echo "check_aarch64: $cxx not found (Debian: g++-aarch64-linux-gnu)"; exit 1; }
# The third-party headers only, not the host's own C library headers (those come from the cross
# toolchain): a directory of links to them.
shadow=$(mktemp -d)
trap 'rm -rf "$shadow"' EXIT
# LibTorch's (with its pybind11 and fmt, which the native build uses too) from the project's
# PyTorch, the others from Debian's packages.
source scripts/venv_path.sh
torch_include=$("$SENTINEL_PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
for d in ATen c10 caffe2 torch pybind11 fmt; do
  [ -e "$torch_include/$d" ] && ln -s "$torch_include/$d" "$shadow/$d"
done
for d in fmt nlohmann yaml-cpp boost google gloo CLI; do
  [ -e "/usr/include/$d" ] && [ ! -e "$shadow/$d" ] && ln -s "/usr/include/$d" "$shadow/$d"
done
# The Python module's files: Python's headers, whose one machine-specific header (pyconfig.h, the
# same sizes on both 64-bit little-endian Linux targets) Debian ships for the host only.
python_include=$(ls -d /usr/include/python3.* 2>/dev/null | head -1 || true)
if [ -n "$python_include" ]; then
  python_name=$(basename "$python_include")
  ln -s "$python_include" "$shadow/$python_name"
  if [ -e "/usr/include/x86_64-linux-gnu/$python_name/pyconfig.h" ]; then
    mkdir -p "$shadow/aarch64-linux-gnu/$python_name"
    ln -s "/usr/include/x86_64-linux-gnu/$python_name/pyconfig.h" "$shadow/aarch64-linux-gnu/$python_name/pyconfig.h"
  fi
fi
flags=(-std=c++17 -fsyntax-only -Wall -Wextra -Werror=attributes -DFMT_HEADER_ONLY
       -Iinclude -Isrc -I. -Icuda -I"$build_dir/src/loggers/tensorboard"
       -isystem "$shadow" -isystem "$shadow/torch/csrc/api/include")
[ -n "$python_include" ] && flags+=(-isystem "$shadow/$python_name")
[ -d /usr/local/cuda/include ] && flags+=(-isystem /usr/local/cuda/include)
files=$(ls src/*/*.cpp src/*/*/*.cpp cuda/*.cpp 2>/dev/null | grep -v 'cuda_stats_device.cpp')
# One compiler per core (each file parses LibTorch's headers: about 10 s); the first file that
# fails is named, and its errors shown.
export cxx
export flags_joined=$(printf '%q ' "${flags[@]}")
check_one() { eval "\"\$cxx\" $flags_joined \"\$1\"" || { echo "check_aarch64: $1 does not compile for aarch64"; exit 255; }; }
export -f check_one
count=$(echo "$files" | wc -w)
echo "$files" | tr ' ' '\n' | xargs -P "${SENTINEL_JOBS:-$(nproc)}" -I{} bash -c 'check_one "$1"' _ {} || exit 1
echo "check_aarch64: $count files compile for aarch64 ($("$cxx" -dumpmachine))"
