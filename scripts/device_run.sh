#!/usr/bin/env bash
# There, on a lent GPU machine: runs the binaries scripts/device_pack.sh gathered here against that
# machine's own PyTorch (the same build: checked first). Usage, as one device call carrying
# .devcarry (docs/platform.md, "A GPU session"):
#   bash scripts/device_run.sh STAGE...   STAGE: info cuda-tests checks sanitize bench python python-bench pack
# Logs go to $OUT; each stage is bounded so that one stage cannot spend the session.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/sentinel-device}
mkdir -p "$out"
carry=.devcarry
[ -d "$carry/bin" ] || { echo "device_run: no $carry/bin: run scripts/device_pack.sh here and carry $carry"; exit 2; }
# scripts/device_pack.sh gzips the binaries to fit the carried tree's size.
for packed in "$carry"/bin/*.gz; do
  [ -e "$packed" ] && gunzip -f "$packed" && chmod +x "${packed%.gz}"
done
py=${PYTHON:-python3}
torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$torch_lib:$PWD/$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH=/usr/local/cuda/bin:$PATH
# The tests were compiled with this checkout's absolute path here (their data, the CLI's path).
src=$(cat "$carry/source_dir")
if [ "$(realpath -m "$src")" != "$(pwd)" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$(pwd)" "$src"; fi
mkdir -p build && cp "$carry/bin/sentinel" build/sentinel
bin=$carry/bin
status=0
run() {  # run SECONDS NAME COMMAND...: bounded, logged under $OUT, the log's end shown
  local limit=$1 name=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || status=1
  echo "-- $name: exit $rc in $((SECONDS - start)) s"
  tail -n "${TAIL_LINES:-12}" "$out/$name.log"
}

for stage in "$@"; do
  echo "== $stage"
  case $stage in
    info)
      nvidia-smi -L
      here=$("$py" -c 'import torch; print(torch.__version__, torch.version.git_version)')
      echo "torch here: $here; built against: $(cat "$carry/torch_build")"
      [ "$here" = "$(cat "$carry/torch_build")" ] || { echo "device_run: another torch build than the binaries'"; status=1; }
      ;;
    cuda-tests)
      # Unbuffered, so that a crash leaves the name of the test it happened in.
      run 240 cuda_tests stdbuf -o0 "$bin/sentinel_cuda_tests"
      run 240 cuda_watch_tests stdbuf -o0 "$bin/sentinel_cuda_watch_tests"
      ;;
    checks)
      # The GPU branches of the CPU suite's device tests: the CLI on CUDA, fusion on CUDA.
      run 180 device_checks "$bin/sentinel_tests" --gtest_filter='Cli.Device*:TorchScriptFusion.*'
      ;;
    sanitize)
      # Without the caching allocator, which would hide out-of-bounds accesses inside its blocks;
      # but a CUDA graph's capture may not allocate, so the graph test runs with it.
      graph_test=CudaWatch.AGraphCapturedStepRunsAndIsLabelled
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 run 240 memcheck compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$bin/sentinel_cuda_watch_tests" --gtest_brief=1 --gtest_filter=-$graph_test
      run 120 memcheck_graph compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$bin/sentinel_cuda_watch_tests" --gtest_brief=1 --gtest_filter=$graph_test
      run 120 memcheck_kernels compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/sentinel_cuda_tests" --gtest_brief=1
      run 180 racecheck compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/sentinel_cuda_tests" --gtest_brief=1
      # The recipes' kernel shares its histogram and its warps' tallies in shared memory.
      run 180 racecheck_recipes compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$bin/sentinel_cuda_watch_tests" --gtest_brief=1 --gtest_filter='CudaWatch.Recipes*'
      ;;
    bench)
      # Gpt2StepProfile's Chrome traces, one per kind of step.
      export SENTINEL_TRACE_DIR=${SENTINEL_TRACE_DIR:-$out/traces}
      mkdir -p "$SENTINEL_TRACE_DIR"
      TAIL_LINES=30 run 300 bench_cuda "$bin/bench_cuda" --benchmark_repetitions="${REPETITIONS:-3}" \
        --benchmark_report_aggregates_only=true --benchmark_counters_tabular=true \
        ${BENCH_FILTER:+--benchmark_filter=$BENCH_FILTER}
      ;;
    python)
      # The module rebuilt for this machine's Python against its torch (the library with it; the
      # other dependencies from .devdeps, made here by scripts/bundle_deps.sh), then its tests.
      [ -d .devdeps ] || { echo "device_run: no .devdeps: run scripts/bundle_deps.sh .devdeps here and carry it"; status=1; continue; }
      SENTINEL_DEPS=.devdeps SENTINEL_BUILD_TARGETS=sentinel_python OUT="$out/python_build" \
        run 300 python_build bash scripts/cuda_check.sh build
      PYTHONPATH=build-cuda/python run 300 python_tests "$py" -m pytest -q -p no:cacheprovider tests/python
      ;;
    python-bench)
      # After `python`: the Python GPT-2 step and forward, eager and compiled, watched and not.
      [ -d build-cuda/python ] || { echo "device_run: python-bench needs the python stage first"; status=1; continue; }
      TAIL_LINES=12 PYTHONPATH=build-cuda/python:bench run 420 python_gpu_step "$py" bench/python_gpu_step.py \
        --rounds "${ROUNDS:-10}"
      ;;
    pack)
      # Last: everything under $OUT as one archive (a call brings back at most 8 files).
      (cd "$out" && tar czf /tmp/sentinel-logs.tgz . && find . -mindepth 1 -delete && mv /tmp/sentinel-logs.tgz logs.tgz)
      ls -l "$out"
      ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
exit $status
