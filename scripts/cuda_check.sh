#!/usr/bin/env bash
# Builds against a LibTorch with CUDA (the one of a Python torch install) and runs the checks that
# need a GPU: the CUDA test suite, compute-sanitizer, the whole test suite, the GPU benchmarks.
# Usage: bash scripts/cuda_check.sh STAGE...   STAGE: info build cuda-tests sanitize tests bench profile ranks
# Build dependencies other than LibTorch come from $SENTINEL_DEPS (made by scripts/bundle_deps.sh)
# when the machine has no package manager access. Logs go to $OUT (default /tmp/sentinel-cuda).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/sentinel-cuda}
mkdir -p "$out"
build=${SENTINEL_BUILD_DIR:-build-cuda}
deps=${SENTINEL_DEPS:-}
py=${PYTHON:-python3}
if [ -n "$deps" ]; then
  deps=$(realpath "$deps")
  export LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$deps/usr/bin:$PATH"  # protoc
fi
export PATH=/usr/local/cuda/bin:$PATH
torch_prefix=$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_include=$($py -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
torch_lib=$($py -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
jobs=$(nproc)
status=0
step() { echo "== $*"; }

for stage in "$@"; do
  case $stage in
    info)
      step info
      nvidia-smi -L; nvcc --version | tail -2; cmake --version | head -1; g++ --version | head -1
      $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
      command -v compute-sanitizer || ls /usr/local/cuda/bin | grep -i sanit
      echo "torch include: $torch_include"; ls "$torch_include" | tr '\n' ' '; echo
      ;;
    build)
      step build
      std=17
      inc=$($py -c 'from torch.utils.cpp_extension import include_paths; print(" ".join("-I"+p for p in include_paths()))')
      if ! echo '#include <torch/torch.h>' | g++ -std=c++17 -x c++ -fsyntax-only $inc - 2>"$out/cxx17_probe.log"; then
        std=20; echo "LibTorch's headers need C++20 (see cxx17_probe.log)"
      fi
      gloo=()
      if [ ! -d "$torch_include/gloo" ] && [ -n "$deps" ] && [ -d "$deps/extra/gloo-include" ]; then
        gloo=(-DSENTINEL_GLOO_INCLUDE_DIR="$deps/extra/gloo-include"); echo "Gloo headers from $deps"
      fi
      # The test fixtures are scripted by this Python's torch, the one whose LibTorch is linked.
      cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=$std \
        -DCMAKE_PREFIX_PATH="${deps:+$deps/usr;}$torch_prefix" -DSENTINEL_ENABLE_CUDA=ON "${gloo[@]}" \
        -DSENTINEL_FIXTURE_PYTHON="$(command -v "$py")" \
        -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
      grep 'Sentinel:' "$out/configure.log"
      # SENTINEL_BUILD_TARGETS (space-separated) builds only those, for a short check.
      cmake --build "$build" -j "$jobs" ${SENTINEL_BUILD_TARGETS:+--target $SENTINEL_BUILD_TARGETS} -- -k 0 >"$out/build.log" 2>&1 || { status=1; grep -E 'error|Error' "$out/build.log" | head -60; }
      ;;
    cuda-tests)
      step cuda-tests
      for t in "$build"/tests/cuda/sentinel_cuda_tests "$build"/tests/cuda/sentinel_cuda_watch_tests; do
        [ -x "$t" ] || continue
        "$t" --gtest_brief=1 >"$out/$(basename "$t").log" 2>&1 || status=1
        tail -25 "$out/$(basename "$t").log"
      done
      ;;
    sanitize)
      step sanitize
      for tool in memcheck racecheck; do
        for t in "$build"/tests/cuda/sentinel_cuda_tests "$build"/tests/cuda/sentinel_cuda_watch_tests; do
          [ -x "$t" ] || continue
          compute-sanitizer --tool $tool --error-exitcode 9 "$t" --gtest_brief=1 \
            >"$out/sanitize_${tool}_$(basename "$t").log" 2>&1 || status=1
          echo "$tool $(basename "$t"): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_${tool}_$(basename "$t").log" | tail -1)"
        done
      done
      ;;
    tests)
      step tests
      (cd "$build" && ctest -j 8 -LE slow --output-on-failure --timeout 600 >"$out/ctest.log" 2>&1) || status=1
      grep -E 'tests passed|Failed|\*\*\*' "$out/ctest.log" | head -40
      ;;
    bench)
      step bench
      if [ -x "$build/bench/bench_cuda" ]; then
        "$build/bench/bench_cuda" --benchmark_repetitions=${REPETITIONS:-5} --benchmark_report_aggregates_only=true \
          --benchmark_counters_tabular=true 2>&1 | tee "$out/bench_cuda.log" || status=1
      fi
      ;;
    profile)
      # Where the watched GPT-2 step's time goes on the device: the statistics kernels' own
      # durations (Nsight Compute, the first PROFILE_KERNELS launches), to set against the step's
      # wall time in the bench stage. Each profiled launch is replayed: this takes minutes.
      step profile
      if command -v ncu >/dev/null && [ -x "$build/bench/bench_cuda" ]; then
        ncu --kernel-name regex:reduce_kernel --launch-count "${PROFILE_KERNELS:-1000}" \
          --metrics gpu__time_duration.sum --csv --log-file "$out/ncu_reduce.csv" \
          "$build/bench/bench_cuda" --benchmark_filter='Gpt2StepWatched' >"$out/ncu_bench.log" 2>&1 || status=1
        $py - "$out/ncu_reduce.csv" <<'PY' || status=1
import csv, statistics, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
us = [float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]]
      for r in csv.DictReader(lines[start:]) if r["Metric Name"] == "gpu__time_duration.sum"]
print(f"statistics kernels profiled: {len(us)}; median {statistics.median(us):.2f} us, "
      f"mean {statistics.mean(us):.2f} us, max {max(us):.1f} us, sum {sum(us) / 1e3:.2f} ms")
PY
      else
        echo "no ncu or no bench_cuda"; status=1
      fi
      ;;
    ranks)
      # torchrun itself (it works with PyTorch 2.x): the data-parallel example as 2 ranks, then
      # their summary, which must name rank 1 (the default bad rank) as first.
      step ranks
      if [ -x "$build/examples/example_ranks_data_parallel" ]; then
        rm -rf "$out/ranks_reports"
        SENTINEL_EXAMPLE_REPORT_DIR="$out/ranks_reports" $py -m torch.distributed.run --nproc_per_node=2 \
          --master_port=29533 --no_python "$build/examples/example_ranks_data_parallel" >"$out/torchrun.log" 2>&1 || status=1
        "$build/sentinel" ranks "$out/ranks_reports" | tee "$out/ranks_summary.txt"
        grep -q "First to see inf/nan: rank 1," "$out/ranks_summary.txt" || { status=1; tail -30 "$out/torchrun.log"; }
      else
        echo "no example_ranks_data_parallel (no Gloo headers?)"; status=1
      fi
      ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
exit $status
