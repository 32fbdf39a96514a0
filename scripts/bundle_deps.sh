#!/usr/bin/env bash
# Copies the Debian-installed build dependencies other than LibTorch (headers, static and shared
# libraries, CMake package files) into one prefix folder, for building on a machine that has
# LibTorch and CUDA but no package manager access (a GPU box with a Python LibTorch).
# Only the Boost headers that the project actually includes are copied (Boost is 160 MiB).
# Usage: bash scripts/bundle_deps.sh OUT_DIR     (after scripts/setup.sh)
# Then: CMAKE_PREFIX_PATH=OUT_DIR/usr, LIBRARY_PATH and LD_LIBRARY_PATH=OUT_DIR/usr/lib/x86_64-linux-gnu.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "$1")
lib=/usr/lib/x86_64-linux-gnu
rm -rf "$out"
mkdir -p "$out/usr/include" "$out$lib/cmake" "$out/usr/share/cmake"
copy() { for p in "$@"; do mkdir -p "$out$(dirname "$p")"; cp -a "$p" "$out$p"; done; }

copy /usr/include/nlohmann /usr/include/CLI /usr/include/gtest /usr/include/gmock /usr/include/benchmark
copy /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11
copy $lib/cmake/GTest $lib/cmake/benchmark $lib/cmake/Boost-1.74.0 $lib/cmake/BoostDetectToolset-1.74.0.cmake \
     $lib/cmake/boost_headers-1.74.0 $lib/cmake/boost_stacktrace_backtrace-1.74.0
copy $lib/libgtest.a $lib/libgtest_main.a $lib/libgmock.a $lib/libgmock_main.a \
     $lib/libbenchmark.so $lib/libbenchmark.so.1debian $lib/libbenchmark.so.1.7.1 $lib/libbenchmark_main.a \
     $lib/libboost_stacktrace_backtrace.a $lib/libboost_stacktrace_backtrace.so \
     $lib/libboost_stacktrace_backtrace.so.1.74.0
# fmt, yaml-cpp (configs) and protobuf with protoc (TensorBoard files; CMake's FindProtobuf finds
# them under the prefix: include/, lib/, bin/protoc).
copy /usr/include/fmt /usr/include/yaml-cpp /usr/include/google/protobuf $lib/cmake/fmt $lib/cmake/yaml-cpp
copy $lib/libfmt.so $lib/libfmt.so.9 $lib/libfmt.so.9.1.0 \
     $lib/libyaml-cpp.so $lib/libyaml-cpp.so.0.7 $lib/libyaml-cpp.so.0.7.0 \
     $lib/libprotobuf.so $lib/libprotobuf.so.32 $lib/libprotobuf.so.32.0.12 $lib/libprotoc.so.32 \
     $lib/libprotoc.so.32.0.12 /usr/bin/protoc
# Gloo's headers, apart: used only when the LibTorch in use ships none of its own (c10d's
# ProcessGroupGloo.hpp needs them for the multi-rank example).
mkdir -p "$out/extra/gloo-include" && cp -a /usr/include/gloo "$out/extra/gloo-include/"
# GCC's libbacktrace (Boost.Stacktrace's symboliser), put where -lbacktrace finds it.
cp /usr/lib/gcc/x86_64-linux-gnu/*/libbacktrace.a "$out$lib/"

# The Boost headers reached from the sources that include Boost.
files=$(grep -rl --include='*.cpp' --include='*.h' 'boost/' src include || true)
for f in $files; do
  g++ -std=c++17 -M -MG -MT x -Isrc -Iinclude -I. \
      $(pkg-config --cflags-only-I 2>/dev/null || true) \
      -I/usr/include/torch/csrc/api/include -DBOOST_STACKTRACE_USE_BACKTRACE "$f" 2>/dev/null |
    tr ' \\' '\n\n' | grep '^/usr/include/boost/' || true
done | sort -u | while read -r h; do copy "$h"; done
du -sh "$out"
