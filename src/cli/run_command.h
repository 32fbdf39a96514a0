#pragma once
// `sentinel run` and `sentinel demo`: run a TorchScript model on batches under the watchdog.
#include <sentinel/options.h>

#include <string>
#include <vector>

namespace c10 {
struct IValue;
}
namespace torch {
namespace jit {
struct Module;
}
}  // namespace torch

namespace sentinel {
namespace cli {

enum ExitCode : int {
  kClean = 0,
  kInternalError = 1,
  kUsageError = 2,
  kNonFinite = 3,
  kInputError = 4,
};

torch::jit::Module load_model(const std::string& path);
// Batches from a file written by Python's torch.save([batch0, batch1, ...]); each batch a tensor
// or a tuple/list of tensors (positional arguments). Throws sentinel::InputError.
std::vector<std::vector<c10::IValue>> load_batches(const std::string& path);
// `sentinel run --dtype`: the model's floating parameters and buffers and the batches' floating
// tensors cast to "bfloat16", "float16" or "float32" (integer tensors are left alone), so that
// traces of one model file in two precisions can be compared (`sentinel diff`).
void cast_floating(torch::jit::Module& model, std::vector<std::vector<c10::IValue>>& batches,
                   const std::string& dtype);
// `sentinel run --device`: "cpu", "cuda" or "cuda:N": the model's parameters and buffers and the
// batches' tensors moved there. Throws sentinel::OptionError naming the device when the text is
// not one of those, when this LibTorch has no CUDA, when no GPU is visible, or N is past the last.
void move_to_device(torch::jit::Module& model, std::vector<std::vector<c10::IValue>>& batches,
                    const std::string& device);
// Runs every batch in eval mode under no-grad; prints a summary; returns the exit code.
int run_batches(torch::jit::Module& model, const std::vector<std::vector<c10::IValue>>& batches,
                const Options& options);

}  // namespace cli
}  // namespace sentinel
