#include "torchscript/fusion_guard.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/graph_fuser.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>

#include <cstring>
#include <mutex>

// Declared in torch/csrc/jit/codegen/fuser/interface.h, which not every LibTorch package ships;
// exported by libtorch_cpu in 1.13 and 2.x alike.
namespace torch {
namespace jit {
TORCH_API bool canFuseOnCPU();
TORCH_API bool canFuseOnGPU();
TORCH_API void overrideCanFuseOnCPU(bool value);
TORCH_API void overrideCanFuseOnGPU(bool value);
}  // namespace jit
}  // namespace torch

namespace sentinel {
namespace torchscript {

namespace {

std::mutex& holders_mutex() {
  static std::mutex m;
  return m;
}
int holders = 0;          // guarded by holders_mutex
FusionSettings saved;     // the settings found by the first holder

void apply(const FusionSettings& s) {
  torch::jit::setTensorExprFuserEnabled(s.texpr_fuser);
  torch::jit::overrideCanFuseOnCPU(s.cpu);
  torch::jit::overrideCanFuseOnGPU(s.gpu);
  torch::jit::overrideCanFuseOnCPULegacy(s.cpu_legacy);
}

// Drops the compiled plans of the model's methods: their next call profiles and optimises the
// graph again under the fusers' current settings.
// A method that is not a graph (none in TorchScript today) is left as it is.
void flush_plans(const torch::jit::Module& model) noexcept {
  try {
    for (const auto& method : model.get_methods()) {
      torch::jit::toGraphFunction(method.function()).get_executor().debugFlushCompilationCache();
    }
  } catch (...) {
  }
}

}  // namespace

FusionSettings current_fusion_settings() {
  FusionSettings s;
  s.texpr_fuser = torch::jit::tensorExprFuserEnabled();
  s.cpu = torch::jit::canFuseOnCPU();
  s.gpu = torch::jit::canFuseOnGPU();
  s.cpu_legacy = torch::jit::canFuseOnCPULegacy();
  return s;
}

FusionOff::FusionOff(const torch::jit::Module* model) {
  {
    std::lock_guard<std::mutex> lock(holders_mutex());
    if (holders++ == 0) {
      saved = current_fusion_settings();
      apply(FusionSettings{});
    }
  }
  if (model) {
    model_ = std::make_unique<torch::jit::Module>(*model);
    flush_plans(*model_);
  }
}

FusionOff::~FusionOff() {
  {
    std::lock_guard<std::mutex> lock(holders_mutex());
    if (--holders == 0) apply(saved);
  }
  if (model_) flush_plans(*model_);
}

bool is_fusion_group_name(const char* name) { return name != nullptr && std::strncmp(name, "fused_", 6) == 0; }

}  // namespace torchscript
}  // namespace sentinel
