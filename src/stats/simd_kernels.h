#pragma once
// The vector kernels of the statistics pass, shared by the plain pass and the FP8 probe.
// Internal: included by src/stats/*.cpp only.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "stats/isa.h"
#include "stats/simd_level.h"
#include "stats/stats_accumulator.h"

namespace sentinel {
namespace stats {
namespace kernels {

// Elements per block: small enough for uint32 counters, large enough to amortise the combine.
constexpr int64_t kBlock = int64_t{1} << 20;

// How far ahead of the loop the kernels ask for memory. The hardware's prefetchers follow a stream
// but start late on each page and each tensor; reading 8 KiB ahead reads float32 that is not in
// the core's cache (an optimizer's state, a result another core wrote) 30-40% faster, and what is
// in L3 about 10% faster (docs/benchmarks.md, "Reading ahead").
constexpr int64_t kPrefetchBytes = 8192;

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

// Calls chunk(values, len) for the elements of a run (n of them, `stride` apart) in chunks of at
// most kChunkLen: in place when they are already dense acc_t, else widened (or narrowed) into a
// buffer on the stack, so that each chunk is read from memory once and then from cache.
template <typename acc_t, int64_t kChunkLen, typename T, typename Chunk>
void for_each_chunk_as(const T* p, int64_t n, int64_t stride, Chunk&& chunk) {
  acc_t buffer[kChunkLen];
  for (int64_t start = 0; start < n; start += kChunkLen) {
    const int64_t len = std::min(kChunkLen, n - start);
    const T* q = p + start * stride;
    const acc_t* values = buffer;
    if constexpr (std::is_same_v<T, acc_t>) {
      if (stride == 1) values = q;
    }
    if (values == buffer) {
      for (int64_t i = 0; i < len; ++i) buffer[i] = static_cast<acc_t>(Widen<T>::get(q[i * stride]));
    }
    chunk(values, len);
  }
}

template <typename T>
constexpr double smallest_normal() {
  if constexpr (std::is_same_v<T, c10::Half>) return 6.103515625e-05;  // 2^-14
  else if constexpr (std::is_same_v<T, c10::BFloat16>) return 1.1754943508222875e-38;  // 2^-126
  else return static_cast<double>(std::numeric_limits<T>::min());
}

// Explicit SIMD through GCC vector extensions: a NaN-aware min/max reduction is not
// auto-vectorised (it would need -ffinite-math-only). Each variant (simd_level.h picks) uses its
// own register width. Comparisons give lane masks of -1, so subtracting a mask counts.
// kBytes is the variant's register width: 32 for AVX2, 16 for the baseline's SSE2 (wider
// vectors there are split by the compiler through the stack, many times slower).
template <typename F, int kBytes>
struct Simd;
template <int kBytes>
struct Simd<float, kBytes> {
  typedef float V __attribute__((vector_size(kBytes)));
  typedef int32_t M __attribute__((vector_size(kBytes)));
  static constexpr int kLanes = kBytes / 4;
  static constexpr int32_t kAbsMask = 0x7fffffff;
};
template <int kBytes>
struct Simd<double, kBytes> {
  typedef double V __attribute__((vector_size(kBytes)));
  typedef int64_t M __attribute__((vector_size(kBytes)));
  static constexpr int kLanes = kBytes / 8;
  static constexpr int64_t kAbsMask = 0x7fffffffffffffffLL;
};

// Loads a vector and clears its sign bits: |x| for every lane (|-0| = +0, as torch's abs()).
// (Out-parameters: returning a 32-byte vector by value would change the ABI between variants.)
template <typename S>
__attribute__((always_inline)) inline void load_abs(const void* p, typename S::V& x, typename S::V& a) {
  typename S::M bits;
  std::memcpy(&x, p, sizeof x);
  std::memcpy(&bits, &x, sizeof x);
  bits &= typename S::M{} + S::kAbsMask;
  std::memcpy(&a, &bits, sizeof a);
}

// Every count, lane by lane: used for blocks that hold a non-finite value (rare).
template <typename F, int kBytes>
__attribute__((always_inline)) inline void reduce_detailed(const F* p, int64_t len, F min_normal,
                                                           AbsStatsAccumulator<F>& acc) {
  using S = Simd<F, kBytes>;
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
template <typename F, int kBytes>
__attribute__((always_inline)) inline void reduce_contiguous_body(const F* p, int64_t len, F min_normal,
                                                                  AbsStatsAccumulator<F>& acc) {
  using S = Simd<F, kBytes>;
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
  constexpr int64_t kAhead = kPrefetchBytes / sizeof(F);
  int64_t i = 0;
  for (; i + kUnroll * L <= len; i += kUnroll * L) {
    if (i + kAhead < len) __builtin_prefetch(p + i + kAhead);
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
    reduce_detailed<F, kBytes>(p, len, min_normal, acc);
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

// The vector part of one chunk of reduce_float_bits_body: integer max and min of |x|'s bits, and
// with kCount the zeros and the values below the smallest normal. Returns where it stopped.
// `readable`: how many elements from q on belong to the span (prefetched up to there).
template <bool kCount, typename M, int L, int kUnroll>
__attribute__((always_inline)) inline int64_t bits_min_max(const float* q, int64_t n, int64_t readable, M* mx, M* mn,
                                                           M& zeros, M& small, const M& vnormal) {
  constexpr int64_t kAhead = kPrefetchBytes / sizeof(float);
  const M abs_mask = M{} + 0x7fffffff, zero = M{};
  int64_t i = 0;
  for (; i + kUnroll * L <= n; i += kUnroll * L) {
    if (i + kAhead < readable) __builtin_prefetch(q + i + kAhead);
    for (int u = 0; u < kUnroll; ++u) {
      M b;
      std::memcpy(&b, q + i + u * L, sizeof b);
      b &= abs_mask;
      mx[u] = b > mx[u] ? b : mx[u];
      mn[u] = b < mn[u] ? b : mn[u];
      if constexpr (kCount) {
        zeros -= (b == zero);
        small -= (b < vnormal);
      }
    }
  }
  return i;
}

// float32 as integers (AVX2): the bits of |x| order as |x| does, and every inf or NaN lies above
// every finite value, so one integer max gives the abs max and tells whether anything is not
// finite, and one integer min gives the abs min and tells whether the chunk holds any zero or
// subnormal. Integer min/max take one cycle where the float ones take four, and a chunk of
// ordinary values needs nothing else: three operations per vector, about the speed of a plain
// sum. A chunk holding zeros or subnormals (post-ReLU activations) is counted in a second read
// while it is still in L1, and the chunks after it count in their first read until one needs no
// counting again; a chunk holding inf or NaN goes to reduce_detailed.
template <int kBytes>
__attribute__((always_inline)) inline void reduce_float_bits_body(const float* p, int64_t len, float min_normal,
                                                                  AbsStatsAccumulator<float>& acc) {
  using M = typename Simd<float, kBytes>::M;
  constexpr int L = kBytes / 4;
  constexpr int kUnroll = 4;
  constexpr int64_t kChunk = 4096;  // 16 KiB
  constexpr int32_t kInfBits = 0x7f800000;
  int32_t normal_bits;
  std::memcpy(&normal_bits, &min_normal, sizeof normal_bits);
  const M abs_mask = M{} + 0x7fffffff, vnormal = M{} + normal_bits, zero = M{};
  bool counting = false;  // the chunk before held zeros or subnormals
  for (int64_t start = 0; start < len; start += kChunk) {
    const int64_t n = std::min(kChunk, len - start);
    const float* q = p + start;
    M mx[kUnroll], mn[kUnroll];
    for (int u = 0; u < kUnroll; ++u) {
      mx[u] = M{};
      mn[u] = M{} + std::numeric_limits<int32_t>::max();
    }
    M zeros = M{}, small = M{};
    const int64_t readable = len - start;
    int64_t i = counting ? bits_min_max<true, M, L, kUnroll>(q, n, readable, mx, mn, zeros, small, vnormal)
                         : bits_min_max<false, M, L, kUnroll>(q, n, readable, mx, mn, zeros, small, vnormal);
    int32_t cmax = 0, cmin = std::numeric_limits<int32_t>::max();
    uint32_t zero_count = 0, small_count = 0;
    for (int u = 0; u < kUnroll; ++u) {
      for (int l = 0; l < L; ++l) {
        cmax = mx[u][l] > cmax ? mx[u][l] : cmax;
        cmin = mn[u][l] < cmin ? mn[u][l] : cmin;
      }
    }
    for (int l = 0; l < L; ++l) {
      zero_count += static_cast<uint32_t>(zeros[l]);
      small_count += static_cast<uint32_t>(small[l]);
    }
    const int64_t counted_to = i;  // [0, counted_to) counted when `counting`
    for (; i < n; ++i) {
      int32_t b;
      std::memcpy(&b, q + i, sizeof b);
      b &= 0x7fffffff;
      cmax = b > cmax ? b : cmax;
      cmin = b < cmin ? b : cmin;
      zero_count += (b == 0);
      small_count += (b < normal_bits);
    }
    if (cmax >= kInfBits) {
      reduce_detailed<float, kBytes>(q, n, min_normal, acc);
      continue;
    }
    if (cmin < normal_bits && !counting) {
      // Zeros or subnormals somewhere: count the vector part again, from L1.
      M z = M{}, sm = M{};
      for (int64_t j = 0; j < counted_to; j += L) {  // counted_to: a whole number of vectors
        M b;
        std::memcpy(&b, q + j, sizeof b);
        b &= abs_mask;
        z -= (b == zero);
        sm -= (b < vnormal);
      }
      for (int l = 0; l < L; ++l) {
        zero_count += static_cast<uint32_t>(z[l]);
        small_count += static_cast<uint32_t>(sm[l]);
      }
    }
    counting = cmin < normal_bits;
    float fmin, fmax;
    std::memcpy(&fmin, &cmin, sizeof fmin);
    std::memcpy(&fmax, &cmax, sizeof fmax);
    AbsStatsAccumulator<float> chunk(fmin);
    chunk.abs_max = fmax;
    chunk.zeros = zero_count;
    chunk.subnormal = small_count - zero_count;
    acc.combine(chunk);
  }
}

// The body compiled once per level; the always_inline bodies take each variant's instructions.
template <typename F>
SENTINEL_ISA_AVX2 void reduce_contiguous_avx2(const F* p, int64_t len, F min_normal,
                                                                      AbsStatsAccumulator<F>& acc) {
  if constexpr (std::is_same_v<F, float>) {
    reduce_float_bits_body<32>(p, len, min_normal, acc);
  } else {
    reduce_contiguous_body<F, 32>(p, len, min_normal, acc);
  }
}
template <typename F>
__attribute__((noinline)) void reduce_contiguous_baseline(const F* p, int64_t len, F min_normal,
                                                          AbsStatsAccumulator<F>& acc) {
  reduce_contiguous_body<F, 16>(p, len, min_normal, acc);
}
template <typename F>
inline void reduce_contiguous(const F* p, int64_t len, F min_normal, AbsStatsAccumulator<F>& acc) {
  if (simd_level() >= SimdLevel::V3) {
    reduce_contiguous_avx2<F>(p, len, min_normal, acc);
  } else {
    reduce_contiguous_baseline<F>(p, len, min_normal, acc);
  }
}

// The statistics menu of one float chunk (already in cache), as MomentsAccumulator::add_chunk
// defines it, in vectors: extremes on float lanes (exact), sums on double lanes (each half of a
// float register widened), then the squared deviations from the chunk's mean in a second loop.
// The lanes add in another order than the scalar loop: the sums agree to rounding, not bits.
template <int kBytes>
struct MomentVectors {
  typedef float V __attribute__((vector_size(kBytes)));
  typedef int32_t M __attribute__((vector_size(kBytes)));
  typedef float H __attribute__((vector_size(kBytes / 2)));  // half a register of floats ...
  typedef double D __attribute__((vector_size(kBytes)));     // ... widened
};

template <int kBytes>
__attribute__((always_inline)) inline void moments_chunk_body(const float* p, int64_t len, MomentsAccumulator& out) {
  using V = typename MomentVectors<kBytes>::V;
  using M = typename MomentVectors<kBytes>::M;
  using H = typename MomentVectors<kBytes>::H;
  using D = typename MomentVectors<kBytes>::D;
  constexpr int L = kBytes / 4;
  if (len <= 0) return;
  const V zero = V{}, vinf = V{} + std::numeric_limits<float>::infinity();
  V mn = vinf, mx = -vinf, amax = zero, min_nonzero = vinf;
  M nan = M{};
  D sum_lo = D{}, sum_hi = D{}, abs_lo = D{}, abs_hi = D{}, sq_lo = D{}, sq_hi = D{};
  int64_t i = 0;
  for (; i + L <= len; i += L) {
    V x, a;
    load_abs<Simd<float, kBytes>>(p + i, x, a);
    mn = x < mn ? x : mn;  // NaN compares false: never selected
    mx = x > mx ? x : mx;
    amax = a > amax ? a : amax;
    const V nonzero = a > zero ? a : vinf;  // two plain selects: a combined mask is not vectorised
    min_nonzero = nonzero < min_nonzero ? nonzero : min_nonzero;
    nan |= (x != x);
    // Each half of the register loaded again (from L1) straight into a widening conversion.
    // (Written out, not a lambda: a lambda would not take this clone's target and stay a call.)
    H half_lo, half_hi;
    std::memcpy(&half_lo, p + i, sizeof half_lo);
    std::memcpy(&half_hi, p + i + L / 2, sizeof half_hi);
    D lo = __builtin_convertvector(half_lo, D), hi = __builtin_convertvector(half_hi, D);
    sum_lo += lo;
    sum_hi += hi;
    sq_lo += lo * lo;
    sq_hi += hi * hi;
    abs_lo += lo < 0 ? -lo : lo;
    abs_hi += hi < 0 ? -hi : hi;
  }
  MomentsAccumulator c;
  double sum = 0;
  for (int l = 0; l < L; ++l) {
    c.min = mn[l] < c.min ? mn[l] : c.min;
    c.max = mx[l] > c.max ? mx[l] : c.max;
    c.max_abs = amax[l] > c.max_abs ? amax[l] : c.max_abs;
    c.min_nonzero_abs = min_nonzero[l] < c.min_nonzero_abs ? min_nonzero[l] : c.min_nonzero_abs;
    c.any_nan |= nan[l] != 0;
  }
  for (int l = 0; l < L / 2; ++l) {
    sum += sum_lo[l] + sum_hi[l];
    c.sum_abs += abs_lo[l] + abs_hi[l];
    c.sum_sq += sq_lo[l] + sq_hi[l];
  }
  for (int64_t j = i; j < len; ++j) c.reduce_first_loop(p[j], sum);
  c.n = len;
  c.mean = sum / static_cast<double>(len);
  const D vmean = D{} + c.mean;
  D m2_lo = D{}, m2_hi = D{};
  for (i = 0; i + L <= len; i += L) {
    H half_lo, half_hi;
    std::memcpy(&half_lo, p + i, sizeof half_lo);
    std::memcpy(&half_hi, p + i + L / 2, sizeof half_hi);
    D lo = __builtin_convertvector(half_lo, D), hi = __builtin_convertvector(half_hi, D);
    lo -= vmean;
    hi -= vmean;
    m2_lo += lo * lo;
    m2_hi += hi * hi;
  }
  for (int l = 0; l < L / 2; ++l) c.m2 += m2_lo[l] + m2_hi[l];
  for (int64_t j = i; j < len; ++j) {
    const double d = p[j] - c.mean;
    c.m2 += d * d;
  }
  out.combine(c);
}

template <typename Unused = void>
SENTINEL_ISA_V4 void moments_chunk_v4(const float* p, int64_t len,
                                                                          MomentsAccumulator& out) {
  moments_chunk_body<64>(p, len, out);
}
template <typename Unused = void>
SENTINEL_ISA_AVX2 void moments_chunk_avx2(const float* p, int64_t len, MomentsAccumulator& out) {
  moments_chunk_body<32>(p, len, out);
}
template <typename Unused = void>
__attribute__((noinline)) void moments_chunk_baseline(const float* p, int64_t len, MomentsAccumulator& out) {
  moments_chunk_body<16>(p, len, out);
}
// float chunks in vectors (per SIMD level); float64 chunks through the scalar definition.
inline void moments_chunk(const float* p, int64_t len, MomentsAccumulator& out) {
  if (simd_level() >= SimdLevel::V4) {
    moments_chunk_v4<>(p, len, out);
  } else if (simd_level() >= SimdLevel::V3) {
    moments_chunk_avx2<>(p, len, out);
  } else {
    moments_chunk_baseline<>(p, len, out);
  }
}
inline void moments_chunk(const double* p, int64_t len, MomentsAccumulator& out) { out.add_chunk(p, len); }

}  // namespace kernels
}  // namespace stats
}  // namespace sentinel
