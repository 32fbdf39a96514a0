#!/usr/bin/env bash
# Runs the benchmarks in one process and prints each case's median and its ratio to Unwatched.
# Usage: bash bench/run_benchmarks.sh [build-dir]    (after scripts/build.sh)
set -euo pipefail
build=${1:-build}
out=$(mktemp)
"$build/bench/bench_watchdog" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_format=json >"$out"
python3 - "$out" <<'PY'
import json, sys
runs = {b["run_name"].split("/")[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"] if b.get("aggregate_name") == "median"}
base = runs["BM_Unwatched"]["real_time"]
print(f"{'case':<14}{'median ms':>12}{'ratio':>9}")
for name, b in runs.items():
    print(f"{name[3:]:<14}{b['real_time']:>12.2f}{b['real_time'] / base:>9.3f}")
PY
rm -f "$out"
