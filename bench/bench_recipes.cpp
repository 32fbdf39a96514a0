// The recipes' probes against the plain statistics pass, on the same 16 MiB activation-like
// tensor, in one run: current scaling's probe alone, one block recipe alone, and all four recipes
// as the FP8 monitor reads a GEMM operand with them (the statistics fused with delayed scaling,
// then current, MXFP8 and NVFP4). Ratios, not times, are what docs/benchmarks.md records.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <sentinel/options.h>

#include "fp8/block_probe.h"
#include "fp8/recipe_probe.h"
#include "fp8/fp8_probe.h"
#include "stats_pass_cases.h"

namespace {

using sentinel::fp8::ScalingRecipe;

using bench_cases::at_level;
using bench_cases::BM_StatsPass;
using bench_cases::probe_tensor;

template <ScalingRecipe R>
void BM_BlockProbe(benchmark::State& state) {
  const sentinel::recipes::BlockRecipe recipe{R, sentinel::fp8::Format::E4M3, sentinel::fp8::MxScaleRule::RoundUp};
  sentinel::recipes::BlockProbeResult r;
  for (auto _ : state) {
    sentinel::recipes::probe_blocks(probe_tensor(), recipe, sentinel::recipes::BlockLayout{-1, false}, 12.0f, r);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(state.iterations() * probe_tensor().nbytes());
}

// Current scaling's read: the per-tensor probe alone (the statistics are known from the first
// read).
void BM_CurrentProbe(benchmark::State& state) {
  sentinel::stats::Fp8ProbeResult r;
  for (auto _ : state) {
    sentinel::stats::compute_fp8_probe(probe_tensor(), 448.0f / 12.0f, sentinel::fp8::Format::E4M3, r);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(state.iterations() * probe_tensor().nbytes());
}

// What the monitor does per operand with every recipe on: one fused read for the statistics and
// delayed scaling, then one read per other recipe.
void BM_AllFourRecipes(benchmark::State& state) {
  const auto options = sentinel::Fp8Options().enabled(true).recipes(
      {ScalingRecipe::Delayed, ScalingRecipe::Current, ScalingRecipe::MXFP8, ScalingRecipe::NVFP4});
  for (auto _ : state) {
    sentinel::TensorStats s;
    sentinel::stats::Fp8ProbeResult delayed;
    sentinel::stats::compute_with_fp8_probe(probe_tensor(), 448.0f / 12.0f, sentinel::fp8::Format::E4M3, s, delayed);
    for (ScalingRecipe r : {ScalingRecipe::Current, ScalingRecipe::MXFP8, ScalingRecipe::NVFP4}) {
      sentinel::recipes::RecipeTally tally{r, {}};
      sentinel::recipes::probe_recipe(probe_tensor(), options, sentinel::fp8::Role::Activation, "aten::linear", 0, s,
                                      tally);
      benchmark::DoNotOptimize(tally);
    }
    benchmark::DoNotOptimize(delayed);
  }
  state.SetBytesProcessed(state.iterations() * probe_tensor().nbytes());
}

BENCHMARK(BM_StatsPass)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CurrentProbe)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockProbe<ScalingRecipe::MXFP8>)->Name("BM_BlockProbe_mxfp8")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockProbe<ScalingRecipe::NVFP4>)->Name("BM_BlockProbe_nvfp4")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AllFourRecipes)->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_StatsPass, 1>)->Name("BM_StatsPass_v3")->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_CurrentProbe, 1>)->Name("BM_CurrentProbe_v3")->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_BlockProbe<ScalingRecipe::MXFP8>, 1>)->Name("BM_BlockProbe_mxfp8_v3")->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_BlockProbe<ScalingRecipe::NVFP4>, 1>)->Name("BM_BlockProbe_nvfp4_v3")->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_AllFourRecipes, 1>)->Name("BM_AllFourRecipes_v3")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
