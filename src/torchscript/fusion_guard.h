#pragma once
// TorchScript's fusers run a chain of elementwise ops (gelu then mul, say) as one generated
// kernel, from a model's third call on. That kernel starts no RecordFunction event per op, so the
// ops inside it would have no frame and an inf they made would be blamed on the next op. While a
// watchdog lives the fusers are therefore off, unless Options::keep_torchscript_fusion. Internal.
#include <memory>

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace sentinel {
namespace torchscript {

// Holds TorchScript's fusers off (CPU and GPU, the tensor-expression fuser and the legacy one)
// from the first holder's construction to the last holder's destruction, which restores the
// settings found at the first. `model`, when given, has its compiled plans flushed at both ends:
// a plan fused before the watchdog came is profiled again without fusion, and after the watchdog
// goes the model fuses again as it would have.
class FusionOff {
 public:
  explicit FusionOff(const torch::jit::Module* model);
  ~FusionOff();
  FusionOff(const FusionOff&) = delete;
  FusionOff& operator=(const FusionOff&) = delete;

 private:
  std::unique_ptr<torch::jit::Module> model_;
};

// The fusers' settings, as FusionOff saves and restores them (tests compare them).
struct FusionSettings {
  bool texpr_fuser = false;
  bool cpu = false;
  bool gpu = false;
  bool cpu_legacy = false;
  bool operator==(const FusionSettings& o) const {
    return texpr_fuser == o.texpr_fuser && cpu == o.cpu && gpu == o.gpu && cpu_legacy == o.cpu_legacy;
  }
};
FusionSettings current_fusion_settings();

// Whether a RecordFunction event of scope FUNCTION with this name and no operator behind it is a
// fused group's kernel ("fused_" and the ops it holds, as "fused_gelu_mul"): such an event
// carries no inputs or outputs.
bool is_fusion_group_name(const char* name);

}  // namespace torchscript
}  // namespace sentinel
