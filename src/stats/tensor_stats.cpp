#include "stats/tensor_stats.h"

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "stats/stats_accumulator.h"

namespace sentinel {

double TensorStats::hf_abs_min() const {
  return nan > 0 ? std::numeric_limits<double>::quiet_NaN() : (count == 0 ? 0.0 : abs_min);
}
double TensorStats::hf_abs_max() const {
  return nan > 0 ? std::numeric_limits<double>::quiet_NaN() : abs_max;
}

namespace stats {
namespace {

// Elements per block: small enough for uint32 counters, large enough to amortise the combine.
constexpr int64_t kBlock = int64_t{1} << 20;

template <typename T>
struct Widen {
  using acc_t = float;
  static acc_t get(T v) { return static_cast<acc_t>(v); }
};
template <>
struct Widen<double> {
  using acc_t = double;
  static double get(double v) { return v; }
};
template <>
struct Widen<c10::BFloat16> {
  using acc_t = float;
  // bfloat16 is the top half of a float32: a shift, which vectorises.
  static float get(c10::BFloat16 v) {
    uint32_t bits = static_cast<uint32_t>(v.x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};

template <typename T>
constexpr double smallest_normal() {
  if constexpr (std::is_same_v<T, c10::Half>) return 6.103515625e-05;  // 2^-14
  else if constexpr (std::is_same_v<T, c10::BFloat16>) return 1.1754943508222875e-38;  // 2^-126
  else return static_cast<double>(std::numeric_limits<T>::min());
}

// Explicit SIMD through GCC vector extensions: a NaN-aware min/max reduction is not
// auto-vectorised (it would need -ffinite-math-only). 32-byte vectors become AVX2 in the avx2
// clone and SSE2 pairs in the default one. Comparisons give lane masks of -1, so subtracting a
// mask counts.
template <typename F>
struct Simd;
template <>
struct Simd<float> {
  typedef float V __attribute__((vector_size(32)));
  typedef int32_t M __attribute__((vector_size(32)));
  static constexpr int kLanes = 8;
  static constexpr int32_t kAbsMask = 0x7fffffff;
};
template <>
struct Simd<double> {
  typedef double V __attribute__((vector_size(32)));
  typedef int64_t M __attribute__((vector_size(32)));
  static constexpr int kLanes = 4;
  static constexpr int64_t kAbsMask = 0x7fffffffffffffffLL;
};

// Loads a vector and clears its sign bits: |x| for every lane (|-0| = +0, as torch's abs()).
// (Out-parameters: returning a 32-byte vector by value would change the ABI between clones.)
template <typename S>
inline void load_abs(const void* p, typename S::V& x, typename S::V& a) {
  typename S::M bits;
  std::memcpy(&x, p, sizeof x);
  std::memcpy(&bits, &x, sizeof x);
  bits &= typename S::M{} + S::kAbsMask;
  std::memcpy(&a, &bits, sizeof a);
}

// Every count, lane by lane: used for blocks that hold a non-finite value (rare).
template <typename F>
__attribute__((target_clones("avx2", "default"))) void reduce_detailed(const F* p, int64_t len, F min_normal,
                                                                       AbsStatsAccumulator<F>& acc) {
  using S = Simd<F>;
  using V = typename S::V;
  using M = typename S::M;
  constexpr int L = S::kLanes;
  const F inf = std::numeric_limits<F>::infinity();
  const V vinf = V{} + inf, vmin_normal = V{} + min_normal, zero = V{};
  V mn = V{} + inf, mx = V{};
  M nan = M{}, infs = M{}, pinf = M{}, zeros = M{}, sub = M{};
  int64_t i = 0;
  for (; i + L <= len; i += L) {
    V x, a;
    load_abs<S>(p + i, x, a);
    mn = a < mn ? a : mn;  // NaN compares false: never selected
    mx = a > mx ? a : mx;
    nan -= (a != a);
    infs -= (a == vinf);
    pinf -= (x == vinf);
    zeros -= (a == zero);
    sub -= (a < vmin_normal) & (a > zero);
  }
  AbsStatsAccumulator<F> lanes(inf);
  for (int l = 0; l < L; ++l) {
    lanes.abs_min = mn[l] < lanes.abs_min ? mn[l] : lanes.abs_min;
    lanes.abs_max = mx[l] > lanes.abs_max ? mx[l] : lanes.abs_max;
    lanes.nan += static_cast<uint32_t>(nan[l]);
    lanes.inf += static_cast<uint32_t>(infs[l]);
    lanes.pos_inf += static_cast<uint32_t>(pinf[l]);
    lanes.zeros += static_cast<uint32_t>(zeros[l]);
    lanes.subnormal += static_cast<uint32_t>(sub[l]);
  }
  for (; i < len; ++i) lanes.reduce(p[i], inf, min_normal);
  acc.combine(lanes);
}

// Reduces `len` contiguous elements (len < 2^31) into `acc`. The common case - every value
// finite - needs only min, max, "not finite", "below the smallest normal" and "zero" per lane.
// Four independent min/max chains hide the latency of vminps/vmaxps, which otherwise caps the
// loop at one vector every four cycles. A block holding any non-finite value is read again by
// reduce_detailed to split nan, +inf and -inf.
template <typename F>
__attribute__((target_clones("avx2", "default"))) void reduce_contiguous(const F* p, int64_t len, F min_normal,
                                                                         AbsStatsAccumulator<F>& acc) {
  using S = Simd<F>;
  using V = typename S::V;
  using M = typename S::M;
  constexpr int L = S::kLanes;
  constexpr int kUnroll = 4;
  const F inf = std::numeric_limits<F>::infinity();
  const V vmax_finite = V{} + std::numeric_limits<F>::max(), vmin_normal = V{} + min_normal, zero = V{};
  V mn[kUnroll], mx[kUnroll];
  for (int u = 0; u < kUnroll; ++u) {
    mn[u] = V{} + inf;
    mx[u] = V{};
  }
  M nonfinite = M{}, small = M{}, zeros = M{};
  int64_t i = 0;
  for (; i + kUnroll * L <= len; i += kUnroll * L) {
    for (int u = 0; u < kUnroll; ++u) {
      V x, a;
      load_abs<S>(p + i + u * L, x, a);
      mn[u] = a < mn[u] ? a : mn[u];
      mx[u] = a > mx[u] ? a : mx[u];
      nonfinite -= ~(a <= vmax_finite) & 1;  // true for inf and NaN
      small -= (a < vmin_normal);            // zeros and subnormals
      zeros -= (a == zero);
    }
  }
  M nonfinite_sum = nonfinite;
  bool any_nonfinite = false;
  for (int l = 0; l < L; ++l) any_nonfinite = any_nonfinite || nonfinite_sum[l] != 0;
  for (int64_t j = i; j < len && !any_nonfinite; ++j) any_nonfinite = !(std::fabs(p[j]) <= std::numeric_limits<F>::max());
  if (any_nonfinite) {
    reduce_detailed<F>(p, len, min_normal, acc);
    return;
  }
  AbsStatsAccumulator<F> lanes(inf);
  for (int u = 0; u < kUnroll; ++u) {
    for (int l = 0; l < L; ++l) {
      lanes.abs_min = mn[u][l] < lanes.abs_min ? mn[u][l] : lanes.abs_min;
      lanes.abs_max = mx[u][l] > lanes.abs_max ? mx[u][l] : lanes.abs_max;
    }
  }
  for (int l = 0; l < L; ++l) {
    lanes.zeros += static_cast<uint32_t>(zeros[l]);
    lanes.subnormal += static_cast<uint32_t>(small[l] - zeros[l]);
  }
  for (; i < len; ++i) lanes.reduce(p[i], inf, min_normal);
  acc.combine(lanes);
}

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

// Visits every element once, in memory order where possible. A tensor whose elements fill a
// block of memory without gaps or overlap (contiguous, transposed, permuted) is one span; other
// views are walked as rows along their smallest-stride dimension.
template <typename T>
void reduce_tensor(const at::Tensor& t, TensorStats& out) {
  const T* base = static_cast<const T*>(t.data_ptr());
  const int64_t numel = t.numel();
  if (t.is_non_overlapping_and_dense()) {
    reduce_any<T>(base, numel, 1, out);
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
    reduce_any<T>(base + offset, sizes[inner], strides[inner], out);
    for (int64_t d = dims - 1; d >= 0; --d) {  // odometer over every dimension but `inner`
      if (d == inner) continue;
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

Readability compute(const at::Tensor& t, TensorStats& out) {
  out = TensorStats{};
  if (!t.defined()) return Readability::Undefined;
  if (t.is_sparse()) return Readability::Sparse;
  if (t.layout() != c10::kStrided) return Readability::OtherLayout;
  if (t.is_meta()) return Readability::Meta;
  if (t.is_quantized()) return Readability::Quantized;
  if (t.is_complex()) return Readability::Complex;
  if (!t.device().is_cpu()) return Readability::NotOnCpu;
  if (t.numel() == 0) return Readability::Empty;
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
