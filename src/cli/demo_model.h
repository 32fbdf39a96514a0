#pragma once
// The embedded demo: a small T5-style encoder (TorchScript, built in C++) whose gated-GELU
// feed-forward overflows float32 at a known batch, as inputs grow from batch to batch.
#include <torch/script.h>

#include <vector>

namespace sentinel {
namespace demo {

constexpr int64_t kOverflowBatch = 3;  // batches 0..2 are clean

torch::jit::Module make_t5_encoder();
// Batches of shape (2, 4, 16); batch k is scaled by kScales[k].
std::vector<std::vector<c10::IValue>> make_batches();

}  // namespace demo
}  // namespace sentinel
