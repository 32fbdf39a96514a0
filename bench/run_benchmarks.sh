#!/usr/bin/env bash
# Runs the benchmarks in one process and prints each case's median and its ratio to Unwatched.
# Usage: bash bench/run_benchmarks.sh [build-dir]    (after scripts/build.sh)
# BENCH=bench_recipes runs the recipes' benchmarks instead of bench_watchdog's.
set -euo pipefail
build=${1:-build}
out=$(mktemp)
# One BLAS thread: ATen runs one intra-op thread here, and OpenBLAS's second thread spin-waits on
# the only other core, which makes every timing depend on what else the machine runs.
# Repetitions are interleaved at random so that slow drifts hit all cases alike.
OPENBLAS_NUM_THREADS=1 "$build/bench/${BENCH:-bench_watchdog}" --benchmark_repetitions=${REPETITIONS:-12} \
  --benchmark_enable_random_interleaving=true --benchmark_min_time=${MIN_TIME:-1} \
  --benchmark_report_aggregates_only=true --benchmark_format=json "${@:2}" >"$out"
python3 - "$out" <<'PY'
import json, sys
runs = {b["run_name"].split("/")[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"] if b.get("aggregate_name") == "median"}
# Each case is compared with the unwatched run of its own kind (forward, or training step).
def base_of(name):
    if name.startswith(("BM_StatsPass", "BM_BlockProbe", "BM_AllFourRecipes")):  # against the plain pass, same level
        level = name[name.rfind("_"):] if name.endswith(("_v3", "_baseline")) else ""
        return runs["BM_StatsPass" + level]["real_time"]
    if name.startswith("BM_RankExchange"):  # what the exchange adds to a watched training step
        return runs["BM_TrainStepWatched"]["real_time"]
    return runs["BM_TrainStepUnwatched" if name.startswith("BM_TrainStep") else "BM_Unwatched"]["real_time"]
cv = {b["run_name"].split("/")[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"] if b.get("aggregate_name") == "cv"}
print(f"{'case':<22}{'median ms':>12}{'ratio':>9}{'cv':>8}")
for name, b in sorted(runs.items()):
    spread = cv.get(name, {}).get("real_time", float("nan"))
    print(f"{name[3:]:<22}{b['real_time']:>12.2f}{b['real_time'] / base_of(name):>9.3f}{spread:>8.1%}")
PY
rm -f "$out"
