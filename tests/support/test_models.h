#pragma once
// Small C++-frontend models shared by the watchdog tests.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/errors.h>
#include <sentinel/scope.h>

#include <string>
#include <vector>

#include "support/test_paths.h"

namespace sentinel_test {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

// A module whose own code, between its two sub-modules, can make an inf: the case module hooks
// cannot name (the value appears neither in a sub-module's output nor in its input).
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    a = register_module("a", torch::nn::Linear(4, 4));
    b = register_module("b", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto s = sentinel::scope(*this);
    auto h = a(x);
    h = torch::exp(h);  // overflows float32 once h > ~88.7
    return b(h);
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Block);

struct TwoBlocksImpl : torch::nn::Module {
  TwoBlocksImpl() {
    encoder = register_module("encoder", torch::nn::Sequential(Block(), Block()));
  }
  torch::Tensor forward(torch::Tensor x) { return encoder->forward(x); }
  torch::nn::Sequential encoder{nullptr};
};
TORCH_MODULE(TwoBlocks);

inline torch::Tensor small_input(int64_t rows = 2, int64_t cols = 4, double scale = 1.0) {
  return torch::linspace(-1.0, 1.0, rows * cols).reshape({rows, cols}) * scale;
}

// Runs `body`, which must end in sentinel::NonFiniteError; returns that error's report (an empty
// report, and a test failure, if it does not).
template <class Body>
sentinel::Report expect_nonfinite(Body&& body) {
  try {
    body();
  } catch (const sentinel::NonFiniteError& e) {
    return e.report();
  }
  ADD_FAILURE() << "expected sentinel::NonFiniteError";
  return {};
}

inline std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

inline std::string data_path(const std::string& name) { return sentinel_test::test_data_dir() + "/" + name; }

}  // namespace sentinel_test
