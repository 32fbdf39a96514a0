#!/usr/bin/env bash
# Every source file of the library, the command line and the CUDA side's host code compiled for
# aarch64 (Grace, GH200) with Debian's cross compiler, against the same third-party headers as
# the native build: syntax and semantics checked, no object written (LibTorch for aarch64 is not
# installed here). Fails on the first file that does not compile, naming it. A file whose text and
# every header it read are unchanged since it last passed (with the same compiler and flags) is not
# compiled again: the record of what it read is kept outside the checkout, as ccache keeps objects.
#   scripts/check_aarch64.sh BUILD_DIR   (BUILD_DIR: where the generated protobuf headers are)
set -euo pipefail
cd "$(dirname "$0")/.."
# The build directory as seen from the checkout, so that the flags are the same from every clone.
build_dir=$(realpath -m --relative-to=. "${1:-build}")
cxx=${SENTINEL_AARCH64_CXX:-aarch64-linux-gnu-g++}
command -v "$cxx" >/dev/null || { echo "check_aarch64: $cxx not found (Debian: g++-aarch64-linux-gnu)"; exit 1; }
# The third-party headers only, not the host's own C library headers (those come from the cross
# toolchain): a directory of links to them, at one fixed place so that the headers a file read
# have the same names from every clone.
cache=${XDG_CACHE_HOME:-$HOME/.cache}/overflow-sentinel/aarch64
shadow=$cache/include
records=$cache/passed
mkdir -p "$shadow" "$records"
# LibTorch's (with its pybind11 and fmt, which the native build uses too) from the project's
# PyTorch, the others from Debian's packages.
source scripts/venv_path.sh
torch_include=$("$SENTINEL_PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
for d in ATen c10 caffe2 torch pybind11 fmt; do
  [ -e "$torch_include/$d" ] && ln -sfn "$torch_include/$d" "$shadow/$d"
done
for d in fmt nlohmann yaml-cpp boost google gloo CLI; do
  [ -e "/usr/include/$d" ] && [ ! -e "$torch_include/$d" ] && ln -sfn "/usr/include/$d" "$shadow/$d"
done
# The Python module's files: Python's headers, whose one machine-specific header (pyconfig.h, the
# same sizes on both 64-bit little-endian Linux targets) Debian ships for the host only.
python_include=$(ls -d /usr/include/python3.* 2>/dev/null | head -1 || true)
if [ -n "$python_include" ]; then
  python_name=$(basename "$python_include")
  ln -sfn "$python_include" "$shadow/$python_name"
  if [ -e "/usr/include/x86_64-linux-gnu/$python_name/pyconfig.h" ]; then
    mkdir -p "$shadow/aarch64-linux-gnu/$python_name"
    ln -sfn "/usr/include/x86_64-linux-gnu/$python_name/pyconfig.h" "$shadow/aarch64-linux-gnu/$python_name/pyconfig.h"
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
compiled_list=$(mktemp)
trap 'rm -f "$compiled_list"' EXIT
export cxx records compiled_list
export flags_joined=$(printf '%q ' "${flags[@]}")
export compiler_version=$("$cxx" --version | head -1)
# What a file's check depended on: the compiler, the flags, and each file it read (paths as the
# compiler wrote them: relative ones are the checkout's).
read_key() { { echo "$compiler_version"; echo "$flags_joined"; xargs -d '\n' sha256sum < "$1"; } | sha256sum; }
check_one() {
  local record=$records/${1//\//_} deps
  if [ -f "$record.read" ] && [ "$(read_key "$record.read" 2>/dev/null)" = "$(cat "$record.key" 2>/dev/null)" ]; then
    return 0
  fi
  deps=$(mktemp)
  eval "\"\$cxx\" $flags_joined -MD -MF \"\$deps\" \"\$1\"" ||
    { rm -f "$deps"; echo "check_aarch64: $1 does not compile for aarch64"; exit 255; }
  sed -e 's/\\$//' -e 's/^[^:]*://' "$deps" | tr -s ' ' '\n' | grep -v '^$' > "$record.read"
  rm -f "$deps"
  read_key "$record.read" > "$record.key"
  echo "$1" >> "$compiled_list"
}
export -f read_key check_one
count=$(echo "$files" | wc -w)
echo "$files" | tr ' ' '\n' | xargs -P "${SENTINEL_JOBS:-$(nproc)}" -I{} bash -c 'check_one "$1"' _ {} || exit 1
compiled=$(wc -l < "$compiled_list")
echo "check_aarch64: $count files compile for aarch64 ($("$cxx" -dumpmachine)); $compiled compiled now, the others unchanged since they passed"
