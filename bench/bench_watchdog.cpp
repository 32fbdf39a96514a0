// Forward of a 6-layer transformer encoder on the CPU, three ways in one run:
//   Unwatched  - the model alone;
//   Watched    - under sentinel::DebugUnderflowOverflow: every outermost op, its inputs, outputs
//                and weights, one fused pass per tensor;
//   HfStyle    - HF's DebugUnderflowOverflow as it computes: after every module, for its
//                parameters, input and output, abs(), min(), max(), isnan().any(), isinf().any(),
//                each read back to the host (fewer frames than Watched: modules, not ops).
// Ratios: see bench/run_benchmarks.sh and docs/benchmarks.md.
#include <benchmark/benchmark.h>
#include <sentinel/sentinel.h>

#include <sstream>

#include "transformer_model.h"

namespace {

constexpr int64_t kLayers = 6, kModel = 256, kHeads = 4, kFeedForward = 1024, kBatch = 4, kSeq = 128;

struct Fixture {
  Fixture() : model(kLayers, kModel, kHeads, kFeedForward) {
    torch::manual_seed(0);
    model->eval();
    x = torch::randn({kBatch, kSeq, kModel});
  }
  bench::Encoder model;
  torch::Tensor x;
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void hf_stats(const torch::Tensor& t, double& sink) {
  auto a = t.abs();
  sink += a.min().item<double>() + a.max().item<double>();
  sink += static_cast<double>(torch::isnan(t).any().item<bool>()) + static_cast<double>(torch::isinf(t).any().item<bool>());
}

void BM_Unwatched(benchmark::State& state) {
  auto& f = fixture();
  torch::NoGradGuard no_grad;
  for (auto _ : state) benchmark::DoNotOptimize(f.model->forward(f.x));
}

void BM_Watched(benchmark::State& state) {
  auto& f = fixture();
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(f.model, sentinel::Options().output(out));
  for (auto _ : state) benchmark::DoNotOptimize(debug.forward(f.x));
  state.counters["frames_kept"] = static_cast<double>(debug.saved_frames().size());
}

void BM_HfStyle(benchmark::State& state) {
  auto& f = fixture();
  torch::NoGradGuard no_grad;
  double sink = 0;
  bench::ModuleHook hook = [&sink](torch::nn::Module& m, const torch::Tensor& in, const torch::Tensor& out) {
    for (const auto& p : m.named_parameters(/*recurse=*/false)) hf_stats(p.value(), sink);
    hf_stats(in, sink);
    hf_stats(out, sink);
  };
  f.model->set_hook(&hook);
  for (auto _ : state) benchmark::DoNotOptimize(f.model->forward(f.x));
  f.model->set_hook(nullptr);
  benchmark::DoNotOptimize(sink);
}

// Interleaved registration, repeated: each repetition measures the three back to back, so slow
// drifts of the machine affect all three alike.
BENCHMARK(BM_Unwatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Watched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HfStyle)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
