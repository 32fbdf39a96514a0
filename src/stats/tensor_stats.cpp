#include "stats/tensor_stats.h"

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "stats/headroom_math.h"
#include "stats/read_only_data.h"
#include "stats/simd_kernels.h"
#include "stats/stats_accumulator.h"
#include "stats/tensor_walk.h"

namespace sentinel {

double TensorStats::hf_abs_min() const {
  return nan > 0 ? std::numeric_limits<double>::quiet_NaN() : (count == 0 ? 0.0 : abs_min);
}
double TensorStats::hf_abs_max() const {
  return nan > 0 ? std::numeric_limits<double>::quiet_NaN() : abs_max;
}

namespace stats {
namespace {

using namespace kernels;

// The loop over `n` elements `stride` apart, in blocks small enough for 32-bit counters.
// float32/float64 spans are read in place; fp16/bf16 (and strided rows) are widened into a small
// buffer on the stack first, so one vector kernel serves every dtype.
template <typename T>
void reduce_span(const T* p, int64_t n, int64_t stride, TensorStats& out) {
  using acc_t = typename Widen<T>::acc_t;
  const acc_t inf = std::numeric_limits<acc_t>::infinity();
  const acc_t min_normal = static_cast<acc_t>(smallest_normal<T>());
  constexpr int64_t kChunk = 512;
  acc_t buffer[kChunk];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    AbsStatsAccumulator<acc_t> acc(inf);
    const T* q = p + start * stride;
    if constexpr (std::is_same_v<T, acc_t>) {
      if (stride == 1) {
        reduce_contiguous<acc_t>(q, len, min_normal, acc);
        acc.project(len, out);
        continue;
      }
    }
    for (int64_t c = 0; c < len; c += kChunk) {
      const int64_t m = std::min(kChunk, len - c);
      for (int64_t i = 0; i < m; ++i) buffer[i] = Widen<T>::get(q[(c + i) * stride]);
      reduce_contiguous<acc_t>(buffer, m, min_normal, acc);
    }
    acc.project(len, out);
  }
}

// Integers and bool: no inf/nan/subnormal; abs min/max and zeros as HF shows them.
template <typename T>
void reduce_span_integral(const T* p, int64_t n, int64_t stride, TensorStats& out) {
  double mn = std::numeric_limits<double>::infinity(), mx = 0;
  int64_t zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    double a = std::fabs(static_cast<double>(p[i * stride]));
    mn = a < mn ? a : mn;
    mx = a > mx ? a : mx;
    zeros += (a == 0);
  }
  out.count += n;
  out.zeros += zeros;
  out.abs_min = std::min(out.abs_min, mn);
  out.abs_max = std::max(out.abs_max, mx);
}

template <typename T>
void reduce_any(const T* p, int64_t n, int64_t stride, TensorStats& out) {
  if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, c10::Half> ||
                std::is_same_v<T, c10::BFloat16>) {
    reduce_span<T>(p, n, stride, out);
  } else {
    reduce_span_integral<T>(p, n, stride, out);
  }
}

// A view with gaps (a head of a packed q/k/v projection, a column slice) comes as many short
// rows. Reduced one by one, each row would pay the vector kernel's setup and its final reduction
// across lanes (a 64-element row reads at a fifth of the dense speed); gathered into one buffer,
// the rows are reduced 4096 elements at a time. Counts and extremes do not depend on the order
// in which elements are visited, so the numbers are those of any other walk. Rows [begin, end)
// of the view's RowLayout.
template <typename T>
void reduce_gathered(const at::Tensor& t, const RowLayout& layout, int64_t begin, int64_t end, TensorStats& out) {
  using acc_t = typename Widen<T>::acc_t;
  const acc_t inf = std::numeric_limits<acc_t>::infinity();
  const acc_t min_normal = static_cast<acc_t>(smallest_normal<T>());
  constexpr int64_t kChunk = 4096;
  acc_t buffer[kChunk];
  int64_t filled = 0, in_block = 0;  // in the buffer; in the accumulator (32-bit counts: < kBlock)
  AbsStatsAccumulator<acc_t> acc(inf);
  auto flush = [&] {
    reduce_contiguous<acc_t>(buffer, filled, min_normal, acc);
    in_block += filled;
    filled = 0;
    if (in_block + kChunk > kBlock) {
      acc.project(in_block, out);
      acc = AbsStatsAccumulator<acc_t>(inf);
      in_block = 0;
    }
  };
  const T* base = static_cast<const T*>(read_only_data(t));
  layout.for_each_row(begin, end, [&](int64_t offset, int64_t n, int64_t stride) {
    const T* p = base + offset;
    for (int64_t i = 0; i < n;) {
      const int64_t m = std::min(kChunk - filled, n - i);
      if (std::is_same_v<T, acc_t> && stride == 1) {
        std::memcpy(buffer + filled, p + i, static_cast<size_t>(m) * sizeof(acc_t));
      } else {
        for (int64_t j = 0; j < m; ++j) buffer[filled + j] = Widen<T>::get(p[(i + j) * stride]);
      }
      filled += m;
      i += m;
      if (filled == kChunk) flush();
    }
  });
  if (filled > 0) flush();
  if (in_block > 0) acc.project(in_block, out);
}

template <typename T>
void reduce_tensor(const at::Tensor& t, TensorStats& out) {
  if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>) {
    if (!t.is_non_overlapping_and_dense()) {
      const RowLayout layout(t);
      reduce_gathered<T>(t, layout, 0, layout.rows(), out);
      return;
    }
  }
  kernels::for_each_run<T>(t, [&](const T* p, int64_t n, int64_t stride) { reduce_any<T>(p, n, stride, out); });
}

// The statistics and the menu from one read: each chunk is widened (or read in place), reduced
// by the vector kernel, then added to the menu while it is still in cache.
template <typename T>
void moments_span(const T* p, int64_t n, int64_t stride, TensorStats& out, MomentsAccumulator& moments) {
  using acc_t = typename Widen<T>::acc_t;
  const acc_t inf = std::numeric_limits<acc_t>::infinity();
  const acc_t min_normal = static_cast<acc_t>(smallest_normal<T>());
  for_each_chunk_as<acc_t, 4096>(p, n, stride, [&](const acc_t* values, int64_t len) {
    AbsStatsAccumulator<acc_t> acc(inf);
    reduce_contiguous<acc_t>(values, len, min_normal, acc);
    acc.project(len, out);
    moments_chunk(values, len, moments);
  });
}

// Calls f(T{}) with T the element type of a floating dtype; false for any other dtype.
template <typename F>
bool with_float_type(c10::ScalarType dtype, F&& f) {
  switch (dtype) {
    case c10::kFloat: f(float{}); return true;
    case c10::kDouble: f(double{}); return true;
    case c10::kHalf: f(c10::Half{}); return true;
    case c10::kBFloat16: f(c10::BFloat16{}); return true;
    default: return false;
  }
}

}  // namespace

Readability compute_with_moments(const at::Tensor& t, TensorStats& out, MomentsAccumulator& moments) {
  out = TensorStats{};
  const Readability readable = compute_readability(t);
  if (readable != Readability::Read) return readable;
  const bool floating = with_float_type(t.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    kernels::for_each_run<T>(t, [&](const T* p, int64_t n, int64_t s) { moments_span<T>(p, n, s, out, moments); });
  });
  return floating ? Readability::Read : compute(t, out);  // integers: statistics only, no menu
}

namespace {

template <typename T>
void headroom_span(const T* p, int64_t n, int64_t stride, HeadroomCounts& out) {
  // Blocks small enough for the accumulator's 32-bit counts.
  for (int64_t start = 0; start < n; start += kernels::kBlock) {
    const int64_t len = std::min(kernels::kBlock, n - start);
    HeadroomAccumulator acc;
    for (int64_t i = start; i < start + len; ++i) {
      acc.reduce(std::fabs(static_cast<double>(kernels::Widen<T>::get(p[i * stride]))), double(INFINITY));
    }
    out.fp16_overflow += acc.fp16_overflow;
    out.fp16_underflow += acc.fp16_underflow;
    out.bf16_overflow += acc.bf16_overflow;
    out.bf16_underflow += acc.bf16_underflow;
  }
}

}  // namespace

bool compute_headroom(const at::Tensor& t, HeadroomCounts& out) {
  out = HeadroomCounts{};
  if (compute_readability(t) != Readability::Read) return false;
  return with_float_type(t.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    kernels::for_each_run<T>(t, [&](const T* p, int64_t n, int64_t s) { headroom_span<T>(p, n, s, out); });
  });
}

Readability compute_readability(const at::Tensor& t) {
  if (!t.defined()) return Readability::Undefined;
  if (t.is_nested()) return Readability::Nested;
  if (t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python)) return Readability::TensorSubclass;
  if (t.is_sparse()) return Readability::Sparse;
  if (t.layout() != c10::kStrided) return Readability::OtherLayout;
  if (t.is_meta()) return Readability::Meta;
  if (t._is_zerotensor()) return Readability::ZeroTensor;
  if (t.is_quantized()) return Readability::Quantized;
  if (t.is_complex()) return Readability::Complex;
  if (!t.device().is_cpu()) return Readability::NotOnCpu;
  if (t.numel() == 0) return Readability::Empty;
  if (!t.has_storage()) return Readability::NoStorage;
  if (read_only_data(t) == nullptr) return Readability::NoData;
  // Elements beyond the memory the storage holds (a wrapper tensor's empty storage) are not read.
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * std::abs(t.stride(d));
  if (t.storage_offset() < 0 || static_cast<size_t>((last + 1) * t.element_size()) > t.storage().nbytes()) {
    return Readability::NoData;
  }
  return Readability::Read;
}

void compute_dense_range(const at::Tensor& t, int64_t begin, int64_t end, TensorStats& out) {
  out = TensorStats{};
  with_float_type(t.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    reduce_span(static_cast<const T*>(read_only_data(t)) + begin, end - begin, 1, out);
  });
}

int64_t gapped_rows(const at::Tensor& t) { return kernels::RowLayout(t).rows(); }

void compute_gapped_rows(const at::Tensor& t, int64_t begin, int64_t end, TensorStats& out) {
  out = TensorStats{};
  const kernels::RowLayout layout(t);
  with_float_type(t.scalar_type(), [&](auto tag) { reduce_gathered<decltype(tag)>(t, layout, begin, end, out); });
}

Readability compute(const at::Tensor& t, TensorStats& out) {
  out = TensorStats{};
  const Readability readable = compute_readability(t);
  if (readable != Readability::Read) return readable;
  switch (t.scalar_type()) {
    case c10::kFloat: reduce_tensor<float>(t, out); break;
    case c10::kDouble: reduce_tensor<double>(t, out); break;
    case c10::kHalf: reduce_tensor<c10::Half>(t, out); break;
    case c10::kBFloat16: reduce_tensor<c10::BFloat16>(t, out); break;
    case c10::kByte: reduce_tensor<uint8_t>(t, out); break;
    case c10::kChar: reduce_tensor<int8_t>(t, out); break;
    case c10::kShort: reduce_tensor<int16_t>(t, out); break;
    case c10::kInt: reduce_tensor<int32_t>(t, out); break;
    case c10::kLong: reduce_tensor<int64_t>(t, out); break;
    case c10::kBool: reduce_tensor<bool>(t, out); break;
    default: return Readability::OtherDtype;
  }
  return Readability::Read;
}

const char* describe(Readability r) {
  switch (r) {
    case Readability::Read: return "read";
    case Readability::Undefined: return "None";
    case Readability::Empty: return "empty";
    case Readability::Sparse: return "sparse";
    case Readability::OtherLayout: return "other layout";
    case Readability::Meta: return "meta";
    case Readability::NotOnCpu: return "not on cpu";
    case Readability::Quantized: return "quantized";
    case Readability::Complex: return "complex";
    case Readability::OtherDtype: return "other dtype";
    case Readability::DeviceStrided: return "strided view on device";
    case Readability::DeviceDtype: return "dtype not read on device";
    case Readability::CapturedInGraph: return "captured in cuda graph";
    case Readability::Overwritten: return "overwritten";
    case Readability::Nested: return "nested";
    case Readability::ZeroTensor: return "zero tensor";
    case Readability::NoStorage: return "no storage";
    case Readability::NoData: return "no data";
    case Readability::InsideFusedKernel: return "inside a fused kernel: not read";
    case Readability::FactorOfFiniteProduct: return "not read: its product is finite";
    case Readability::Uninitialized: return "uninitialized: not read";
    case Readability::PartlyWritten: return "partly written: not read";
    case Readability::TensorSubclass: return "tensor subclass: not read";
    case Readability::ProvenThenWritten: return "proven finite, not read; written since";
  }
  return "?";
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kLong: return "int64";
    case c10::kInt: return "int32";
    case c10::kShort: return "int16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kBool: return "bool";
    default: return c10::toString(t);
  }
}

}  // namespace stats
}  // namespace sentinel
