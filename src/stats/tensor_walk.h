#pragma once
// Walks a strided CPU tensor as contiguous-or-strided runs. Internal.
#include <ATen/core/Tensor.h>

#include <cstdlib>
#include <vector>

#include "stats/read_only_data.h"

namespace sentinel {
namespace stats {
namespace kernels {

// Visits every element once, in memory order where possible. A tensor whose elements fill a
// block of memory without gaps or overlap (contiguous, transposed, permuted) is one span; other
// views are walked as rows along their smallest-stride dimension.
// Calls run(ptr, n, stride) for runs that together cover every element exactly once.
template <typename T, typename Run>
void for_each_run(const at::Tensor& t, Run&& run) {
  const T* base = static_cast<const T*>(read_only_data(t));
  const int64_t numel = t.numel();
  if (t.is_non_overlapping_and_dense()) {
    run(base, numel, int64_t{1});
    return;
  }
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t dims = t.dim();
  int64_t inner = 0;
  for (int64_t d = 1; d < dims; ++d) {
    if (sizes[d] > 1 && (sizes[inner] <= 1 || std::abs(strides[d]) < std::abs(strides[inner]))) inner = d;
  }
  std::vector<int64_t> index(dims, 0);
  const int64_t rows = numel / sizes[inner];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t offset = 0;
    for (int64_t d = 0; d < dims; ++d) offset += index[d] * strides[d];
    run(base + offset, sizes[inner], strides[inner]);
    for (int64_t d = dims - 1; d >= 0; --d) {  // odometer over every dimension but `inner`
      if (d == inner) continue;
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace kernels
}  // namespace stats
}  // namespace sentinel
