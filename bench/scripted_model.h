#pragma once
// The benchmarks' transformer scripted by torch.jit.script (make_bench_models.py, run at build
// time by bench/CMakeLists.txt), and its input.
#include <benchmark/benchmark.h>
#include <torch/script.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "transformer_model.h"

namespace bench {

// In models/ beside the benchmark's program, where bench/CMakeLists.txt writes it: found from the
// program rather than compiled in, so that no object depends on where the build lies.
inline const std::string& scripted_model_path() {
  static const std::string path =
      (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "models" / "transformer_scripted.pt").string();
  return path;
}

// The module, loaded once; without it the case is skipped with a message.
inline std::optional<torch::jit::Module> load_scripted(benchmark::State& state) {
  static std::optional<torch::jit::Module> model = []() -> std::optional<torch::jit::Module> {
    try {
      return torch::jit::load(scripted_model_path());
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }();
  if (!model) state.SkipWithError(("no " + scripted_model_path() + " (make_bench_models.py)").c_str());
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
