#!/usr/bin/env bash
# Runs the benchmarks in one process and prints each case's median and its ratio to its baseline.
# Usage: bash bench/run_benchmarks.sh [build-dir] [benchmark flags...]    (after scripts/build.sh)
# BENCH=bench_recipes runs the recipes' benchmarks instead of bench_watchdog's.
# BLAS_THREADS=N sets OpenBLAS's threads (default 1); BLAS_THREADS=default leaves OpenBLAS its own.
set -euo pipefail
build=${1:-build}
out=$(mktemp)
# One BLAS thread by default: ATen runs one intra-op thread, and OpenBLAS's second thread
# spin-waits on the only other core, which makes every timing depend on what else the machine runs.
# Repetitions are interleaved at random so that slow drifts hit all cases alike.
# PyPI's LibTorch runs its GEMMs in MKL, Debian's in OpenBLAS: both are set alike, and ATen's own
# intra-op threads with them (OMP_NUM_THREADS: Debian's 1.13 takes one on these machines by
# itself, PyPI's 2.x one per vCPU).
blas=${BLAS_THREADS:-1}
if [ "$blas" = default ]; then
  unset OPENBLAS_NUM_THREADS MKL_NUM_THREADS OMP_NUM_THREADS
else
  export OPENBLAS_NUM_THREADS=$blas MKL_NUM_THREADS=$blas OMP_NUM_THREADS=$blas
fi
echo "threads: OpenBLAS ${OPENBLAS_NUM_THREADS:-default}, MKL ${MKL_NUM_THREADS:-default}, ATen (OpenMP) ${OMP_NUM_THREADS:-default}"
# MALLOC=keep: glibc keeps the memory it has (no trimming of its heap, a fixed mmap threshold), so
# that no case pays page faults for memory it had freed (the page_faults column) and a ratio is the
# watching's own cost. The default is glibc's own behaviour, as users run it.
if [ "${MALLOC:-}" = keep ]; then
  export MALLOC_TRIM_THRESHOLD_=4000000000 MALLOC_TOP_PAD_=1000000000 MALLOC_MMAP_THRESHOLD_=33554432
  echo "malloc keeps its memory (MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_THRESHOLD_)"
fi
"$build/bench/${BENCH:-bench_watchdog}" --benchmark_repetitions=${REPETITIONS:-12} \
  --benchmark_enable_random_interleaving=true --benchmark_min_time=${MIN_TIME:-1} \
  --benchmark_report_aggregates_only=true --benchmark_format=json "${@:2}" >"$out"
python3 - "$out" <<'PY'
import json, sys
runs = {b["run_name"].split("/")[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"] if b.get("aggregate_name") == "median"}
# Each case is compared with the unwatched run of its own model and kind (forward, training step).
def base_of(name):
    if name.endswith("HeadView"):  # a view with gaps, against at::sum of the same view
        return runs.get("BM_AtSumHeadView")
    if name.startswith(("BM_StatsPass", "BM_CurrentProbe", "BM_BlockProbe", "BM_AllFourRecipes", "BM_AtSum")):  # the plain pass, same level
        level = name[name.rfind("_"):] if name.endswith(("_v3", "_baseline")) else ""
        return runs.get("BM_StatsPass" + level)
    if name.startswith("BM_RankExchange"):  # what the exchange adds to a watched training step
        return runs.get("BM_TrainStepWatched")
    model = next((m for m in ("Scripted", "Conv", "TinyOps") if name.startswith("BM_" + m)), "")
    return runs.get("BM_" + model + ("TrainStepUnwatched" if "TrainStep" in name else "Unwatched"))
cv = {b["run_name"].split("/")[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"] if b.get("aggregate_name") == "cv"}
print(f"{'case':<36}{'median':>15}{'ratio':>9}{'cv':>8}{'faults/iter':>13}")
for name, b in sorted(runs.items()):
    spread = cv.get(name, {}).get("real_time", float("nan"))
    base = base_of(name)
    ratio = b["real_time"] / base["real_time"] if base else float("nan")
    last = f"{b['page_faults']:>13.0f}" if "page_faults" in b else ""  # the faults/iter column
    if "ratio" in b:  # Paired*: the median of the pairs' ratios (bench/bench_paired.cpp), quartiles after
        ratio = b["ratio"]
        last = f"   pairs' quartiles {b['ratio_q1']:.3f}-{b['ratio_q3']:.3f}"
    if "MB_read" in b:  # Paired*BareReads: what the bare reads read per forward, and how fast
        last += f", {b['MB_read']:.0f} MB read at {b.get('read_GBps', float('nan')):.0f} GB/s"
    print(f"{name[3:]:<36}{b['real_time']:>12.2f} {b['time_unit']:<2}{ratio:>9.3f}{spread:>8.1%}{last}")
if "BM_StatsPass" in runs and "BM_AtSum" in runs:
    share = runs["BM_AtSum"]["real_time"] / runs["BM_StatsPass"]["real_time"]
    print(f"statistics pass bandwidth / at::sum bandwidth: {share:.1%}")
if "BM_StatsPassHeadView" in runs and "BM_AtSumHeadView" in runs:
    share = runs["BM_AtSumHeadView"]["real_time"] / runs["BM_StatsPassHeadView"]["real_time"]
    print(f"the same on a head of packed q/k/v (a view with gaps): {share:.1%}")
PY
rm -f "$out"
