#pragma once
// The memory a strided tensor's elements occupy, for a reader of one dense span [data, data + n).
// A dense tensor (contiguous or permuted) is its own span. An expanded view (stride 0 along
// dimensions of size > 1, as autograd makes for the gradient of a sum or a mean) repeats every
// element of a dense tensor of fewer elements the same number of times: reading that tensor and
// multiplying its counts gives the view's statistics exactly (its extremes are the same). Anything
// else, such as a slice with gaps or negative strides, has no span.
#include <c10/util/ArrayRef.h>
#include <c10/util/Optional.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "device/stats_device.h"

namespace sentinel {
namespace device {

struct DenseSpan {
  int64_t numel = 0;    // elements of the dense span, read from the tensor's data pointer
  int64_t repeats = 1;  // how many of the tensor's elements each of them stands for
};

inline c10::optional<DenseSpan> dense_span(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  DenseSpan span;
  c10::SmallVector<std::pair<int64_t, int64_t>, 8> dims;  // (stride, size) of the dimensions read
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return DenseSpan{};
    if (sizes[d] == 1) continue;
    if (strides[d] == 0) {
      span.repeats *= sizes[d];
      continue;
    }
    if (strides[d] < 0) return c10::nullopt;
    dims.emplace_back(strides[d], sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return c10::nullopt;
    expected *= size;
  }
  span.numel = expected;
  return span;
}

// A result read over the span, as the whole view's: every count times `repeats`.
inline void scale_by_repeats(SlotResult& r, int64_t repeats) {
  if (repeats == 1) return;
  TensorStats& s = r.stats;
  for (int64_t* n : {&s.count, &s.nan, &s.pos_inf, &s.neg_inf, &s.zeros, &s.subnormal}) *n *= repeats;
  HeadroomCounts& h = r.headroom;
  for (int64_t* n : {&h.fp16_overflow, &h.fp16_underflow, &h.bf16_overflow, &h.bf16_underflow}) *n *= repeats;
  stats::Fp8ProbeResult& p = r.probe;
  for (int64_t* n : {&p.count, &p.overflow, &p.underflow}) *n *= repeats;
  const auto times = static_cast<double>(repeats);
  for (double* x : {&p.sum_sq_error, &p.sum_x_q, &p.sum_x_sq, &p.sum_q_sq}) *x *= times;
}

}  // namespace device
}  // namespace sentinel
