#!/usr/bin/env bash
# One command for a fresh machine: install dependencies, build, run the whole test suite, then
# the suite again under the sanitizers (scripts/sanitize.sh: ASan+UBSan, and ThreadSanitizer on
# the multi-threaded tests; SENTINEL_SANITIZERS=0 skips them).
# Tests labelled `slow` (the exhaustive FP8 sweep) run only with SENTINEL_SLOW_TESTS=1.
# Each leg is timed against its budget (README, "Quick start"); the times are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${SENTINEL_BUILD_DIR:-build}
legs=()
leg() {  # leg NAME BUDGET_MINUTES COMMAND...: runs it, records its time
  local name=$1 budget=$2 start=$SECONDS
  shift 2
  echo "== $name"
  "$@"
  legs+=("$(printf '%-34s %3d s (budget %2d min)' "$name" $((SECONDS - start)) "$budget")")
}
slowest() {  # the ten slowest tests of the last ctest run in $1, from CTest's own cost data
  echo "ten slowest tests (seconds):"
  sort -k3 -g -r "$1/Testing/Temporary/CTestCostData.txt" 2>/dev/null | grep -v '^---' | head -10 |
    awk '{printf "  %8.1f  %s\n", $3, $1}'
}
skipped() {  # each test the last ctest run in $1 skipped, with the reason it gave
  awk '/^[0-9]+\/[0-9]+ Testing: / {test = $3}
       /: Skipped$/ {getline why; if (!(test in seen)) {seen[test]; n++; printf "  %s: %s\n", test, why}}
       END {if (n) printf "%d tests skipped, each with its reason above\n", n}' \
    "$1/Testing/Temporary/LastTest.log" 2>/dev/null
}
ctest_run() {  # ctest_run LABEL_ARGS...: the build's tests, slow ones only on request
  local exclude=python
  [ "${SENTINEL_SLOW_TESTS:-0}" = 1 ] || exclude="python|slow"
  (cd "$build_dir" && ctest --output-on-failure -j 2 "$@" -LE "$exclude") && skipped "$build_dir" && slowest "$build_dir"
}

leg "install (setup.sh)" 6 bash scripts/setup.sh
export build_dir
export -f slowest skipped ctest_run
leg "build + C++ tests" 20 bash -c 'bash scripts/build.sh && ctest_run'
leg "Python, HF and compile tests" 10 bash -c "cd '$build_dir' && ctest --output-on-failure -j 2 -L python"
if [ "${SENTINEL_SANITIZERS:-1}" != 0 ]; then
  leg "sanitizers (sanitize.sh)" 25 bash scripts/sanitize.sh
fi
echo "== time per leg"
printf '%s\n' "${legs[@]}"
