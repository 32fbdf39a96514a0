// Builds whose LibTorch has no CUDA: CUDA tensors stay "not on cpu" (skipped and labelled).
#include "device/stats_device.h"

namespace sentinel {
namespace device {

std::unique_ptr<StatsDevice> make_cuda_device(int64_t, std::string* why) {
  if (why) *why = "this build of the sentinel has no CUDA (LibTorch without CUDA, or no nvcc)";
  return nullptr;
}

}  // namespace device
}  // namespace sentinel
