#pragma once
// A ResNet-style convolutional network in the C++ frontend: a stem, then four stages of two basic
// blocks (3x3 convolutions, batch norm, in-place ReLU, the residual added in place as torchvision
// does), global pooling and a classifier. The in-place ops are what a reader of tensors must not
// race with; the module hook gives HF's baseline, as in transformer_model.h.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "transformer_model.h"

namespace bench {

inline torch::nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

struct BasicBlockImpl : torch::nn::Module, Hooked {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    conv1 = register_module("conv1", conv3x3(in, out, stride));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(out));
    conv2 = register_module("conv2", conv3x3(out, out, 1));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(out));
    relu = register_module("relu", torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
    if (stride != 1 || in != out) {
      down_conv = register_module(
          "down_conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
      down_bn = register_module("down_bn", torch::nn::BatchNorm2d(out));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto identity = down_conv ? call(down_bn, call(down_conv, x)) : x;
    auto out = call(relu, call(bn1, call(conv1, x)));
    out = call(bn2, call(conv2, out));
    out += identity;
    return call(relu, out);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, down_conv{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, down_bn{nullptr};
  torch::nn::ReLU relu{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNetImpl : torch::nn::Module, Hooked {
  explicit ResNetImpl(std::vector<int64_t> widths = {32, 64, 128, 256}, int64_t classes = 100) {
    stem = register_module("stem", conv3x3(3, widths[0], 1));
    stem_bn = register_module("stem_bn", torch::nn::BatchNorm2d(widths[0]));
    stem_relu = register_module("stem_relu", torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
    int64_t in = widths[0];
    for (size_t s = 0; s < widths.size(); ++s) {
      for (int b = 0; b < 2; ++b) {
        const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
        blocks.push_back(register_module("stage" + std::to_string(s) + "_" + std::to_string(b),
                                         BasicBlock(in, widths[s], stride)));
        in = widths[s];
      }
    }
    fc = register_module("fc", torch::nn::Linear(in, classes));
  }
  void set_hook(ModuleHook* h) {
    hook = h;
    for (auto& b : blocks) b->hook = h;
  }
  torch::Tensor forward(torch::Tensor x) {
    auto in = x;
    x = call(stem_relu, call(stem_bn, call(stem, x)));
    for (auto& b : blocks) {
      auto y = b->forward(x);
      if (hook && *hook) (*hook)(*b, x, y);
      x = y;
    }
    auto y = call(fc, x.mean({2, 3}));
    if (hook && *hook) (*hook)(*this, in, y);
    return y;
  }
  torch::nn::Conv2d stem{nullptr};
  torch::nn::BatchNorm2d stem_bn{nullptr};
  torch::nn::ReLU stem_relu{nullptr};
  std::vector<BasicBlock> blocks;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

}  // namespace bench
