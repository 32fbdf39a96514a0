#!/usr/bin/env bash
# The test suite under the sanitizers, each build in its own directory:
#   build-asan: AddressSanitizer + UndefinedBehaviorSanitizer, the whole suite in the Debug
#               configuration (asserts on, NDEBUG not defined), but for the checks that run no
#               code of the project's (the aarch64 syntax check and the source checks: labels
#               `arm`, `source`) and the exhaustive FP8 sweep (`slow`);
#   build-tsan: ThreadSanitizer, the multi-threaded tests (LibTorch's own libraries are not
#               instrumented: tests/tsan.supp ignores what they call).
# -O1 without debug info: reports still name the functions, and the builds compile several times
# faster than with -O2 -g (build-asan and its tests: 12 minutes on 2 cores).
# Run after scripts/setup.sh (scripts/test.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=${SENTINEL_JOBS:-2}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# The Python module is left out: a sanitized extension would need the sanitizer's runtime loaded
# into the interpreter before anything else.
source scripts/venv_path.sh
source scripts/compiler_cache.sh
torch_prefix=$("$SENTINEL_PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
common=(-DCMAKE_PREFIX_PATH="$torch_prefix" -DSENTINEL_FIXTURE_PYTHON="$SENTINEL_PYTHON" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O1 -DSENTINEL_ENABLE_CUDA=OFF -DSENTINEL_BUILD_BENCHMARKS=OFF
        -DSENTINEL_BUILD_PYTHON=OFF "${sentinel_launcher[@]}")

echo "== AddressSanitizer + UndefinedBehaviorSanitizer, Debug configuration (build-asan)"
# Debug: without NDEBUG, as a user's Debug build sees LibTorch's headers (asserts on), at -O1.
cmake -S . -B build-asan "${generator[@]}" "${common[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O1 \
  -DSENTINEL_SANITIZE=ON >/dev/null
# LibTorch keeps allocations alive until exit by design: leak checking would report those, also
# when the build lists each test binary's tests.
ASAN_OPTIONS=detect_leaks=0 cmake --build build-asan -j "$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest --output-on-failure -j "$jobs" -LE "slow|arm|source")

echo "== ThreadSanitizer (build-tsan)"
cmake -S . -B build-tsan "${generator[@]}" "${common[@]}" -DSENTINEL_TSAN=ON -DSENTINEL_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-tsan -j "$jobs" --target sentinel_threads_tests
# Outside ctest, so bounded here: a hang fails the run with a message instead of stalling it.
# Gloo's own worker threads (inside PyPI's LibTorch, not instrumented) wait on the process group's
# condition variables: TSan sees the waits through libstdc++ but not the locking around them, and
# reports each as an unlock of an unlocked mutex. The test that runs a real Gloo group runs in the
# other builds; the channel's logic is covered here by the tests with simulated collectives.
TSAN_OPTIONS="suppressions=$root/tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1" \
  timeout 1800 build-tsan/tests/sentinel_threads_tests --gtest_filter=-GroupChannel.AllGatherOnGlooGivesTheSameAgreement
