#pragma once
// The benchmarks' transformer scripted by torch.jit.script (make_bench_models.py, run at build
// time by bench/CMakeLists.txt), and its input.
#include <benchmark/benchmark.h>
#include <torch/script.h>

#include <optional>
#include <vector>

#include "transformer_model.h"

namespace bench {

// The module, loaded once; without it the case is skipped with a message.
inline std::optional<torch::jit::Module> load_scripted(benchmark::State& state) {
  static std::optional<torch::jit::Module> model = []() -> std::optional<torch::jit::Module> {
    try {
      return torch::jit::load(SENTINEL_BENCH_MODELS_DIR "/transformer_scripted.pt");
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }();
  if (!model) state.SkipWithError("no " SENTINEL_BENCH_MODELS_DIR "/transformer_scripted.pt (make_bench_models.py)");
  return model;
}

inline torch::Tensor scripted_input() {
  static torch::Tensor x = [] {
    torch::manual_seed(1);
    return torch::randn({kBatch, kSeq, kModel});
  }();
  return x;
}

// Forward, pow(2).mean().backward() and an SGD step of the scripted model.
struct ScriptedStep {
  explicit ScriptedStep(torch::jit::Module m) : model(std::move(m)) {
    model.train();
    for (const auto& p : model.parameters()) params.push_back(p);
  }
  void step() {
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    model.forward({scripted_input()}).toTensor().pow(2).mean().backward();
    torch::NoGradGuard no_grad;
    for (auto& p : params) p.add_(p.grad(), -1e-4);
  }
  torch::jit::Module model;
  std::vector<torch::Tensor> params;
};

}  // namespace bench
