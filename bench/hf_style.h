#pragma once
// HF's DebugUnderflowOverflow as it computes, for the baselines: after every module, for its
// parameters, input and output, abs(), min(), max(), isnan().any(), isinf().any(), each read back
// to the host (fewer frames than the sentinel's: modules, not ops).
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "transformer_model.h"

namespace bench {

inline void hf_stats(const torch::Tensor& t, double& sink) {
  auto a = t.abs();
  sink += a.min().item<double>() + a.max().item<double>();
  sink += static_cast<double>(torch::isnan(t).any().item<bool>()) + static_cast<double>(torch::isinf(t).any().item<bool>());
}

// The hook HF's tool registers on every module; no autograd history, as under HF's no_grad.
inline ModuleHook hf_hook(double& sink) {
  return [&sink](torch::nn::Module& m, const torch::Tensor& in, const torch::Tensor& out) {
    torch::NoGradGuard no_grad;
    for (const auto& p : m.named_parameters(/*recurse=*/false)) hf_stats(p.value(), sink);
    hf_stats(in, sink);
    hf_stats(out, sink);
  };
}

// Runs `body` with HF's hook on every module of `model` (a holder with set_hook).
template <typename Model, typename Body>
void with_hf_hooks(Model& model, Body&& body) {
  double sink = 0;
  ModuleHook hook = hf_hook(sink);
  model->set_hook(&hook);
  body();
  model->set_hook(nullptr);
  benchmark::DoNotOptimize(sink);
}

}  // namespace bench
