#pragma once
// A GPT-2-style decoder in the C++ frontend, for the GPU benchmarks. Module paths follow HF's
// GPT2LMHeadModel (wte, wpe, h.0.ln_1, h.0.attn.c_attn, h.0.attn.c_proj, h.0.mlp.c_fc,
// h.0.mlp.act, h.0.mlp.c_proj, ln_f, lm_head), so reports read as they would for the real model.
// Differences from GPT-2, none of which changes what the benchmarks compare:
//   - Linear instead of HF's Conv1D (the same matmul with the weight transposed);
//   - no dropout, so every step does the same work;
//   - attention is matmul + masked_fill + softmax rather than a fused kernel, so the model also
//     builds against LibTorch 1.13, and so every intermediate is an op the watchdog sees.
// An optional hook runs after each module's forward with (path, module, input, output), as HF's
// forward hooks do; it lets the benchmark measure HF's DebugUnderflowOverflow on the GPU.
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace bench {

struct Gpt2Config {
  int64_t vocab = 50257;
  int64_t context = 1024;
  int64_t layers = 12;
  int64_t d_model = 768;
  int64_t heads = 12;
  int64_t mlp = 3072;
};

using Gpt2Hook =
    std::function<void(const std::string& path, torch::nn::Module&, const torch::Tensor& in, const torch::Tensor& out)>;

// The hook and this module's path prefix ("h.3.attn."; empty at the root). Paths are built only
// while a hook is set, so the unhooked model pays nothing for them.
struct Gpt2HookPoint {
  const Gpt2Hook* hook = nullptr;
  std::string prefix;

  template <class M>
  torch::Tensor call(const std::string& name, M& m, const torch::Tensor& x) {
    auto y = m->forward(x);
    if (hook && *hook) (*hook)(prefix + name, *m, x, y);
    return y;
  }
};

// The most negative finite value of a floating dtype. Masked scores get this, not -inf, as in HF:
// an -inf in the scores would be an inf the watchdog reports (and -FLT_MAX rounds to -inf in bf16).
inline double lowest_finite(torch::ScalarType t) {
  switch (t) {
    case torch::kBFloat16: return static_cast<float>(std::numeric_limits<c10::BFloat16>::lowest());
    case torch::kHalf: return static_cast<float>(std::numeric_limits<c10::Half>::lowest());
    case torch::kDouble: return std::numeric_limits<double>::lowest();
    default: return std::numeric_limits<float>::lowest();
  }
}

struct Gpt2AttentionImpl : torch::nn::Module, Gpt2HookPoint {
  explicit Gpt2AttentionImpl(const Gpt2Config& c) : heads(c.heads) {
    c_attn = register_module("c_attn", torch::nn::Linear(c.d_model, 3 * c.d_model));
    c_proj = register_module("c_proj", torch::nn::Linear(c.d_model, c.d_model));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto b = x.size(0), s = x.size(1), d = x.size(2), hd = d / heads;
    // (b, s, 3, heads, hd) -> (3, b, heads, s, hd): q, k and v as one strided tensor each.
    auto qkv = call("c_attn", c_attn, x).view({b, s, 3, heads, hd}).permute({2, 0, 3, 1, 4});
    auto scores = torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    scores = scores.masked_fill(causal_mask(s, x.device()), lowest_finite(scores.scalar_type()));
    auto y = torch::matmul(torch::softmax(scores, -1), qkv[2]).transpose(1, 2).reshape({b, s, d});
    return call("c_proj", c_proj, y);
  }

  // True above the diagonal (the future). Kept outside the registered buffers on purpose:
  // Module::to(device, dtype) would turn a bool buffer into bf16.
  const torch::Tensor& causal_mask(int64_t s, const torch::Device& device) {
    if (!mask.defined() || mask.size(0) != s || mask.device() != device) {
      mask = torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool).device(device)).triu(1);
    }
    return mask;
  }

  int64_t heads;
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::Tensor mask;
};
TORCH_MODULE(Gpt2Attention);

struct Gpt2MlpImpl : torch::nn::Module, Gpt2HookPoint {
  explicit Gpt2MlpImpl(const Gpt2Config& c) {
    c_fc = register_module("c_fc", torch::nn::Linear(c.d_model, c.mlp));
    // GPT-2's GELU is the tanh approximation; a module of its own, as HF's `act` is.
    act = register_module("act", torch::nn::GELU(torch::nn::GELUOptions().approximate("tanh")));
    c_proj = register_module("c_proj", torch::nn::Linear(c.mlp, c.d_model));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return call("c_proj", c_proj, call("act", act, call("c_fc", c_fc, x)));
  }
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::GELU act{nullptr};
};
TORCH_MODULE(Gpt2Mlp);

struct Gpt2BlockImpl : torch::nn::Module, Gpt2HookPoint {
  explicit Gpt2BlockImpl(const Gpt2Config& c) {
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    attn = register_module("attn", Gpt2Attention(c));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    mlp = register_module("mlp", Gpt2Mlp(c));
  }
  void set_hook(const Gpt2Hook* h, const std::string& path) {
    hook = attn->hook = mlp->hook = h;
    prefix = path + ".";
    attn->prefix = prefix + "attn.";
    mlp->prefix = prefix + "mlp.";
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + call("attn", attn, call("ln_1", ln_1, x));
    return x + call("mlp", mlp, call("ln_2", ln_2, x));
  }
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Gpt2Attention attn{nullptr};
  Gpt2Mlp mlp{nullptr};
};
TORCH_MODULE(Gpt2Block);

// GPT-2 ties the output projection to the token embedding. A module with no parameters of its
// own that reads wte's weight keeps that tie: registering the weight twice would list it twice
// in parameters(), and the optimizer would update it twice per step.
struct TiedLmHeadImpl : torch::nn::Module {
  explicit TiedLmHeadImpl(torch::nn::Embedding embedding) : wte(std::move(embedding)) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::matmul(x, wte->weight.t()); }
  torch::nn::Embedding wte;  // not registered: it belongs to the model
};
TORCH_MODULE(TiedLmHead);

// Token ids (batch, seq) -> logits (batch, seq, vocab).
struct Gpt2Impl : torch::nn::Module, Gpt2HookPoint {
  explicit Gpt2Impl(const Gpt2Config& c) : config(c) {
    wte = register_module("wte", torch::nn::Embedding(c.vocab, c.d_model));
    wpe = register_module("wpe", torch::nn::Embedding(c.context, c.d_model));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks.push_back(Gpt2Block(c));
      h->push_back(blocks.back());
      block_paths.push_back("h." + std::to_string(i));
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    lm_head = register_module("lm_head", TiedLmHead(wte));
    init_weights();
  }

  void set_hook(const Gpt2Hook* h_) {
    hook = h_;
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i]->set_hook(h_, block_paths[i]);
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    const auto s = ids.size(1);
    TORCH_CHECK(s <= config.context, "sequence of ", s, " tokens is longer than the context of ", config.context);
    auto x = call("wte", wte, ids) + call("wpe", wpe, torch::arange(s, ids.options()));
    for (size_t i = 0; i < blocks.size(); ++i) x = call(block_paths[i], blocks[i], x);
    auto logits = call("lm_head", lm_head, call("ln_f", ln_f, x));
    if (hook && *hook) (*hook)("", *this, ids, logits);  // HF hooks the root module too
    return logits;
  }

  // GPT-2's initialisation: N(0, 0.02) for matrices, zero biases. LibTorch's default N(0, 1)
  // embedding would make the tied logits ~28x larger than the real model's.
  void init_weights() {
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      const auto& name = p.key();
      if (p.value().dim() == 2) {
        p.value().normal_(0.0, 0.02);
      } else if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
        p.value().zero_();
      }
    }
  }

  Gpt2Config config;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<Gpt2Block> blocks;  // the same modules as h, typed
  std::vector<std::string> block_paths;
  torch::nn::LayerNorm ln_f{nullptr};
  TiedLmHead lm_head{nullptr};
};
TORCH_MODULE(Gpt2);

}  // namespace bench
