#pragma once
// The address of a tensor's elements, for reading only. Where LibTorch has copy-on-write storage
// (2.1 and later), the mutable accessor would materialise a lazy copy: reading must not.
#include <ATen/core/Tensor.h>
#include <torch/version.h>

namespace sentinel {
namespace stats {

inline const void* read_only_data(const at::TensorBase& t) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  return t.const_data_ptr();
#else
  return t.data_ptr();
#endif
}

}  // namespace stats
}  // namespace sentinel
