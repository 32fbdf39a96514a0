#pragma once
// The baseline every pass is compared with, shared by the benchmark programs: the plain
// statistics pass over one 4M-element activation-like tensor (16 MiB, read from memory each time
// on machines whose caches are smaller), at::sum over the same tensor, and a wrapper that runs a
// case at a forced SIMD level.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "stats/simd_level.h"
#include "stats/tensor_stats.h"

namespace bench_cases {

inline at::Tensor& probe_tensor() {
  static at::Tensor t = at::randn({4096, 1024}) * 3;
  return t;
}

inline void BM_StatsPass(benchmark::State& state) {
  sentinel::TensorStats s;
  for (auto _ : state) {
    sentinel::stats::compute(probe_tensor(), s);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * probe_tensor().nbytes());
}

// The ceiling the pass is held to: ATen's own reduction reading the same tensor.
inline void BM_AtSum(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(at::sum(probe_tensor()));
  state.SetBytesProcessed(state.iterations() * probe_tensor().nbytes());
}

// A case with an instruction-set level forced (simd_level.h), so that a CPU's variants can be
// timed against each other: Level 1 is the AVX2 (x86-64-v3) code, 0 the SSE2 baseline.
template <void (*Case)(benchmark::State&), int Level>
void at_level(benchmark::State& state) {
  const auto level = static_cast<sentinel::stats::SimdLevel>(Level);
  if (!sentinel::stats::cpu_supports(level)) {
    state.SkipWithError("this CPU cannot run that level");
    return;
  }
  sentinel::stats::force_simd_level_for_testing(level);
  Case(state);
  sentinel::stats::force_simd_level_for_testing(std::nullopt);
}

}  // namespace bench_cases
