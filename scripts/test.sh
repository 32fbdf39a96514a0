#!/usr/bin/env bash
# One command for a fresh machine: install dependencies, build, run the whole test suite, then
# the suite again under the sanitizers (scripts/sanitize.sh: ASan+UBSan, and ThreadSanitizer on
# the multi-threaded tests; SENTINEL_SANITIZERS=0 skips them).
# Tests labelled `slow` (the exhaustive FP8 sweep) run only with SENTINEL_SLOW_TESTS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
(
  cd "${SENTINEL_BUILD_DIR:-build}"
  if [ "${SENTINEL_SLOW_TESTS:-0}" = 1 ]; then
    ctest --output-on-failure -j 2
  else
    ctest --output-on-failure -j 2 -LE slow
  fi
)
if [ "${SENTINEL_SANITIZERS:-1}" != 0 ]; then
  bash scripts/sanitize.sh
fi
