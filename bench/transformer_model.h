#pragma once
// A 6-layer transformer encoder (pre-norm, multi-head attention, GELU feed-forward) in the C++
// frontend, with an optional per-module hook so HF's module-hook baseline can be measured on it.
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>

namespace bench {

// The benchmarks' transformer and its input: 6 layers, d_model 256, 4 heads, feed-forward 1024,
// batch 4 x 128 tokens.
constexpr int64_t kLayers = 6, kModel = 256, kHeads = 4, kFeedForward = 1024, kBatch = 4, kSeq = 128;

// Called after each module's forward with (module, input, output), as HF's forward hooks are.
using ModuleHook = std::function<void(torch::nn::Module&, const torch::Tensor&, const torch::Tensor&)>;

struct Hooked {
  ModuleHook* hook = nullptr;
  template <class M>
  torch::Tensor call(M& m, const torch::Tensor& x) {
    auto y = m->forward(x);
    if (hook && *hook) (*hook)(*m, x, y);
    return y;
  }
};

struct EncoderLayerImpl : torch::nn::Module, Hooked {
  EncoderLayerImpl(int64_t d, int64_t heads, int64_t ff) : heads(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1 = register_module("fc1", torch::nn::Linear(d, ff));
    fc2 = register_module("fc2", torch::nn::Linear(ff, d));
  }
  torch::Tensor forward(torch::Tensor x) {
    const auto b = x.size(0), s = x.size(1), d = x.size(2);
    auto h = call(ln1, x);
    auto q_k_v = call(qkv, h).view({b, s, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    auto scores = torch::matmul(q_k_v[0], q_k_v[1].transpose(-2, -1)) / std::sqrt(double(d / heads));
    auto attn = torch::matmul(torch::softmax(scores, -1), q_k_v[2]).transpose(1, 2).reshape({b, s, d});
    x = x + call(proj, attn);
    return x + call(fc2, torch::gelu(call(fc1, call(ln2, x))));
  }
  int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(EncoderLayer);

struct EncoderImpl : torch::nn::Module {
  EncoderImpl(int64_t layers, int64_t d, int64_t heads, int64_t ff) {
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(register_module("layer" + std::to_string(i), EncoderLayer(d, heads, ff)));
    }
    final_ln = register_module("final_ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  }
  void set_hook(ModuleHook* hook) {
    for (auto& b : blocks) b->hook = hook;
    root_hook = hook;
  }
  torch::Tensor forward(torch::Tensor x) {
    auto in = x;
    for (auto& b : blocks) {
      auto y = b->forward(x);
      if (root_hook && *root_hook) (*root_hook)(*b, x, y);
      x = y;
    }
    auto y = final_ln(x);
    if (root_hook && *root_hook) {
      (*root_hook)(*final_ln, x, y);
      (*root_hook)(*this, in, y);
    }
    return y;
  }
  std::vector<EncoderLayer> blocks;
  torch::nn::LayerNorm final_ln{nullptr};
  ModuleHook* root_hook = nullptr;
};
TORCH_MODULE(Encoder);

}  // namespace bench
