#pragma once
// Walks a strided CPU tensor as contiguous-or-strided runs. Internal.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cstdlib>

#include "stats/read_only_data.h"

namespace sentinel {
namespace stats {
namespace kernels {

// The rows of a view with gaps, in memory order: its dimensions sorted by stride (largest
// first), those of size 1 dropped, and neighbours that tile each other merged (a head of a
// packed q/k/v projection, [batch, heads, tokens, 64] viewed out of [batch, tokens, 3 * width],
// is rows of `width` floats, not of 64). The last dimension is the run; the others number the
// rows. Walking the rows in memory order lets the hardware's prefetchers follow the reads, and
// longer runs cost less per element.
class RowLayout {
 public:
  // Every dimension kept has two elements or more, so a tensor of fewer than 2^63 elements has
  // fewer than 63 of them.
  static constexpr int kMaxDims = 64;

  // `t` has at least one element.
  explicit RowLayout(const at::Tensor& t) {
    const auto sizes = t.sizes();
    const auto strides = t.strides();
    std::array<int, kMaxDims> order;
    int n = 0;
    for (int d = 0; d < static_cast<int>(sizes.size()); ++d) {
      if (sizes[d] != 1) order[n++] = d;
    }
    // Stable: dimensions of equal stride (a broadcast's zeros) keep their order.
    std::stable_sort(order.begin(), order.begin() + n,
                     [&](int a, int b) { return std::abs(strides[a]) > std::abs(strides[b]); });
    dims_ = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t size = sizes[order[i]], stride = strides[order[i]];
      if (dims_ > 0 && stride != 0 && strides_[dims_ - 1] == size * stride) {
        sizes_[dims_ - 1] *= size;  // the dimension before steps over exactly this one: one run
        strides_[dims_ - 1] = stride;
      } else {
        sizes_[dims_] = size;
        strides_[dims_] = stride;
        ++dims_;
      }
    }
    if (dims_ == 0) {  // a single element
      sizes_[0] = 1;
      strides_[0] = 1;
      dims_ = 1;
    }
    rows_ = 1;
    for (int d = 0; d + 1 < dims_; ++d) rows_ *= sizes_[d];
  }

  int64_t rows() const { return rows_; }
  int64_t run_length() const { return sizes_[dims_ - 1]; }
  int64_t run_stride() const { return strides_[dims_ - 1]; }

  // Calls run(offset, n, stride) for the rows [begin, end), offsets in elements from the
  // tensor's first element.
  template <typename Run>
  void for_each_row(int64_t begin, int64_t end, Run&& run) const {
    if (begin >= end) return;
    std::array<int64_t, kMaxDims> index{};
    int64_t offset = 0;
    for (int64_t d = dims_ - 2, rest = begin; d >= 0; --d) {  // `begin` in mixed radix
      index[d] = rest % sizes_[d];
      rest /= sizes_[d];
      offset += index[d] * strides_[d];
    }
    for (int64_t r = begin; r < end; ++r) {
      run(offset, run_length(), run_stride());
      for (int64_t d = dims_ - 2; d >= 0; --d) {  // odometer, the smallest stride fastest
        offset += strides_[d];
        if (++index[d] < sizes_[d]) break;
        offset -= index[d] * strides_[d];
        index[d] = 0;
      }
    }
  }

 private:
  std::array<int64_t, kMaxDims> sizes_;
  std::array<int64_t, kMaxDims> strides_;
  int dims_ = 0;
  int64_t rows_ = 1;
};

// Visits every element once, in memory order. A tensor whose elements fill a block of memory
// without gaps or overlap (contiguous, transposed, permuted) is one span; other views are walked
// as the rows of their RowLayout.
// Calls run(ptr, n, stride) for runs that together cover every element exactly once.
template <typename T, typename Run>
void for_each_run(const at::Tensor& t, Run&& run) {
  if (t.numel() == 0) return;
  const T* base = static_cast<const T*>(read_only_data(t));
  if (t.is_non_overlapping_and_dense()) {
    run(base, t.numel(), int64_t{1});
    return;
  }
  const RowLayout layout(t);
  layout.for_each_row(0, layout.rows(),
                      [&](int64_t offset, int64_t n, int64_t stride) { run(base + offset, n, stride); });
}

}  // namespace kernels
}  // namespace stats
}  // namespace sentinel
