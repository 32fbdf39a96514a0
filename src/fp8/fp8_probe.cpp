#include "fp8/fp8_probe.h"

#include <ATen/core/Tensor.h>

#include <cmath>
#include <limits>

#include "fp8/fp8_probe_math.h"
#include "fp8/fp8_round_lanes.h"
#include "stats/simd_kernels.h"
#include "stats/tensor_stats.h"
#include "stats/tensor_walk.h"

namespace sentinel {
namespace stats {

double Fp8ProbeResult::cosine() const {
  if (sum_x_sq == 0 && sum_q_sq == 0) return 1.0;
  if (sum_x_sq == 0 || sum_q_sq == 0) return 0.0;
  return sum_x_q / std::sqrt(sum_x_sq * sum_q_sq);
}

void Fp8ProbeResult::add_scaled_sums(double sq_error, double a_q, double q_sq, float scale) {
  const double inv_sq = 1.0 / (static_cast<double>(scale) * scale);
  sum_sq_error += sq_error * inv_sq;
  sum_x_q += a_q * inv_sq;
  sum_q_sq += q_sq * inv_sq;
  sum_x_sq += (sq_error + 2 * a_q - q_sq) * inv_sq;
}

double Fp8ProbeResult::sqnr_db() const {
  if (sum_sq_error == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(sum_x_sq / sum_sq_error);
}

namespace {

using namespace kernels;

// Below this scaled abs max, the squares of a chunk's smaller values underflow float lanes.
constexpr double kTinyForFloatSums = 1e-12;
constexpr int64_t kChunk = 4096;

// A chunk's underflow count and sums (scaled domain).
struct ProbeSums {
  uint32_t underflow = 0;
  double sum_sq_error = 0, sum_a_q = 0, sum_q_sq = 0;
};

// The statistics and the probe of one chunk (n <= kChunk) in a single loop, from registers.
// Per vector the probe adds: a comparison for underflow, a multiply by the scale, the cast as a
// magic-number add and subtract, the saturation, and three multiply-adds (fused in the x86-64
// v3/v4 clones: this file is built with contraction on; the scale's product has other uses, so
// it is never fused into the rounding add). One register per vector:
// 16 lanes with AVX-512, 8 with AVX2, 4 with SSE2.
// Returns false when a sum is not finite - an inf or NaN in the chunk, or a value whose square
// overflows float - and the caller takes the exact path. Overflow is counted by the caller,
// only in chunks whose abs max calls for it.
// kBytes: the variant's register width (64 for AVX-512, 32 for AVX2, 16 for SSE2); wider
// vectors than the registers are split by the compiler through the stack, many times slower.
template <int kBytes>
struct ProbeVectors {
  typedef float V __attribute__((vector_size(kBytes)));
  typedef int32_t M __attribute__((vector_size(kBytes)));
  typedef uint32_t U __attribute__((vector_size(kBytes)));  // bit arithmetic: wraps (inf's exponent + offset)
  typedef double D __attribute__((vector_size(kBytes)));
};

// kStats false: the probe alone (its caller has the statistics): no minimum, zeros or subnormals,
// and an underflow count that leaves zeros out by itself; the lanes' abs max stays (it decides
// the overflow count and the exact path).
template <int kBytes, bool kStats>
__attribute__((always_inline)) inline bool stats_and_probe_body(const float* p, int64_t n, float min_normal,
                                                                const Fp8ProbeParams& c, AbsStatsAccumulator<float>& acc,
                                                                ProbeSums& out) {
  using V = typename ProbeVectors<kBytes>::V;
  using M = typename ProbeVectors<kBytes>::M;
  using U = typename ProbeVectors<kBytes>::U;
  using D = typename ProbeVectors<kBytes>::D;
  constexpr int L = kBytes / 4;
  constexpr int64_t kSubBlock = 256;
  // Each sub-block's float lanes are widened and added into double lanes (half as many).
  // (By reference: passing a vector by value would change the ABI between variants.)
  auto add_widened = [](D& sum, const V& v) {
    if constexpr (L == 16) {
      sum += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), D) +
             __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), D);
    } else if constexpr (L == 8) {
      sum += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), D) +
             __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), D);
    } else {
      static_assert(L == 4, "16, 32 or 64-byte vectors");
      sum += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1), D) +
             __builtin_convertvector(__builtin_shufflevector(v, v, 2, 3), D);
    }
  };
  D dse = D{}, daq = D{}, dqq = D{};
  const V vscale = V{} + c.scale, vmax = V{} + c.max, vfloor = V{} + c.magic_floor, vbelow = V{} + c.underflow_below;
  const V vmin_normal = V{} + min_normal, zero = V{};
  const M abs_mask = M{} + 0x7fffffff;
  const U exp_mask = U{} + 0x7f800000u, offset = U{} + c.magic_offset;
  // |x|'s bits minus one, compared unsigned: below the threshold's and not zero, in one comparison
  // (zero wraps to the largest value; underflow_below is never 0).
  const U below_bits_minus_one = U{} + (fp8::detail::float_to_bits(c.underflow_below) - 1u), one = U{} + 1u;
  V mn = V{} + std::numeric_limits<float>::infinity(), mx = V{};
  M below = M{}, small = M{}, zeros = M{};
  int64_t i = 0;
  while (i + L <= n) {
    const int64_t end = std::min(n - (n - i) % L, i + kSubBlock);
    V se = V{}, aq = V{}, qq = V{};
    for (; i < end; i += L) {
      M xbits;
      std::memcpy(&xbits, p + i, sizeof xbits);
      xbits &= abs_mask;
      V ax;
      std::memcpy(&ax, &xbits, sizeof ax);
      mx = ax > mx ? ax : mx;
      if constexpr (kStats) {
        mn = ax < mn ? ax : mn;
        small -= (ax < vmin_normal);  // zeros and subnormals
        zeros -= (ax == zero);
        below -= (ax < vbelow);
      } else {
        U ubits;
        std::memcpy(&ubits, &xbits, sizeof ubits);
        below -= ((ubits - one) < below_bits_minus_one);
      }
      const V a = ax * vscale;
      V q0;
      fp8_round_lanes(a, exp_mask, offset, vfloor, q0);
      const V q = q0 < vmax ? q0 : vmax;  // NaN (from the largest values): max
      const V err = a - q;
      se += err * err;
      aq += a * q;
      qq += q * q;
    }
    add_widened(dse, se);
    add_widened(daq, aq);
    add_widened(dqq, qq);
  }
  for (int l = 0; l < L / 2; ++l) {
    out.sum_sq_error += dse[l];
    out.sum_a_q += daq[l];
    out.sum_q_sq += dqq[l];
  }
  const bool finite = std::isfinite(out.sum_sq_error + out.sum_a_q + out.sum_q_sq);
  AbsStatsAccumulator<float> lanes(std::numeric_limits<float>::infinity());
  for (int l = 0; l < L; ++l) {
    lanes.abs_max = mx[l] > lanes.abs_max ? mx[l] : lanes.abs_max;
    if constexpr (kStats) {
      lanes.abs_min = mn[l] < lanes.abs_min ? mn[l] : lanes.abs_min;
      lanes.zeros += static_cast<uint32_t>(zeros[l]);
      lanes.subnormal += static_cast<uint32_t>(small[l] - zeros[l]);
      out.underflow += static_cast<uint32_t>(below[l] - zeros[l]);  // the lanes' below includes zeros
    } else {
      out.underflow += static_cast<uint32_t>(below[l]);
    }
  }
  Fp8ProbeAccumulator<double> tail;
  for (; i < n; ++i) {
    lanes.reduce(p[i], std::numeric_limits<float>::infinity(), min_normal);
    tail.reduce(p[i], c);
  }
  if (!finite || lanes.nan + lanes.inf > 0) return false;
  acc.combine(lanes);
  out.underflow += tail.underflow;
  out.sum_sq_error += tail.sum_sq_error;
  out.sum_a_q += tail.sum_a_q;
  out.sum_q_sq += tail.sum_q_sq;
  return true;
}

// One variant per level (simd_level.h) and mode, each the same body in its instruction set.
template <bool kStats>
SENTINEL_ISA_V4 bool stats_and_probe_v4(const float* p, int64_t n, float min_normal,
                                                                            const Fp8ProbeParams& c,
                                                                            AbsStatsAccumulator<float>& acc, ProbeSums& out) {
  return stats_and_probe_body<64, kStats>(p, n, min_normal, c, acc, out);
}
template <bool kStats>
SENTINEL_ISA_V3 bool stats_and_probe_v3(const float* p, int64_t n, float min_normal,
                                                                            const Fp8ProbeParams& c,
                                                                            AbsStatsAccumulator<float>& acc, ProbeSums& out) {
  return stats_and_probe_body<32, kStats>(p, n, min_normal, c, acc, out);
}
template <bool kStats>
__attribute__((noinline)) bool stats_and_probe_baseline(const float* p, int64_t n, float min_normal, const Fp8ProbeParams& c,
                                                        AbsStatsAccumulator<float>& acc, ProbeSums& out) {
  return stats_and_probe_body<16, kStats>(p, n, min_normal, c, acc, out);
}
template <bool kStats>
bool stats_and_probe_lanes(const float* p, int64_t n, float min_normal, const Fp8ProbeParams& c,
                           AbsStatsAccumulator<float>& acc, ProbeSums& out) {
  switch (simd_level()) {
    case SimdLevel::V4: return stats_and_probe_v4<kStats>(p, n, min_normal, c, acc, out);
    case SimdLevel::V3: return stats_and_probe_v3<kStats>(p, n, min_normal, c, acc, out);
    case SimdLevel::Baseline: break;
  }
  return stats_and_probe_baseline<kStats>(p, n, min_normal, c, acc, out);
}

// Elements above the overflow threshold: a second look, only at chunks whose abs max is above it.
__attribute__((always_inline)) inline uint32_t count_above_body(const float* p, int64_t n, float threshold) {
  uint32_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += std::fabs(p[i]) > threshold;
  return count;
}
SENTINEL_ISA_V3 uint32_t count_above_v3(const float* p, int64_t n, float threshold) {
  return count_above_body(p, n, threshold);
}
__attribute__((noinline)) uint32_t count_above_baseline(const float* p, int64_t n, float threshold) {
  return count_above_body(p, n, threshold);
}
uint32_t count_above(const float* p, int64_t n, float threshold) {
  return simd_level() >= SimdLevel::V3 ? count_above_v3(p, n, threshold) : count_above_baseline(p, n, threshold);
}

// Statistics (kStats) and probe of one chunk of float values: the fused loop, or, for the rare
// chunk it declines, the statistics' own kernel and the probe's scalar accumulator in double.
template <bool kStats>
void float_chunk(const float* p, int64_t n, float min_normal, const Fp8ProbeParams& c, AbsStatsAccumulator<float>& acc,
                 Fp8ProbeResult& r) {
  ProbeSums sums;
  AbsStatsAccumulator<float> lanes(std::numeric_limits<float>::infinity());
  if (stats_and_probe_lanes<kStats>(p, n, min_normal, c, lanes, sums) &&
      !(static_cast<double>(lanes.abs_max) * c.scale < kTinyForFloatSums)) {
    if constexpr (kStats) acc.combine(lanes);
    r.count += n;
    r.underflow += sums.underflow;
    if (lanes.abs_max > c.overflow_above) r.overflow += count_above(p, n, c.overflow_above);
    r.add_scaled_sums(sums.sum_sq_error, sums.sum_a_q, sums.sum_q_sq, c.scale);
    return;
  }
  if constexpr (kStats) reduce_contiguous<float>(p, n, min_normal, acc);
  Fp8ProbeAccumulator<double> exact;
  for (int64_t i = 0; i < n; ++i) exact.reduce(p[i], c);
  r.count += exact.count;
  r.overflow += exact.overflow;
  r.underflow += exact.underflow;
  r.add_scaled_sums(exact.sum_sq_error, exact.sum_a_q, exact.sum_q_sq, c.scale);
}

// One read of the tensor from memory: each chunk is read (or widened into a buffer) once.
// float64 keeps its statistics in double and probes a float copy, as the cast sees it.
template <typename T>
void fused_run(const T* p, int64_t n, int64_t stride, const Fp8ProbeParams& c, TensorStats& stats,
               Fp8ProbeResult& probe, MomentsAccumulator* moments) {
  if constexpr (std::is_same_v<T, double>) {
    float buffer[kChunk];
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t len = std::min(kChunk, n - start);
      const double* q = p + start * stride;
      AbsStatsAccumulator<double> acc(std::numeric_limits<double>::infinity());
      for (int64_t i = 0; i < len; ++i) buffer[i] = static_cast<float>(q[i * stride]);
      if (stride == 1) {
        reduce_contiguous<double>(q, len, std::numeric_limits<double>::min(), acc);
      } else {
        for (int64_t i = 0; i < len; ++i) acc.reduce(q[i * stride], std::numeric_limits<double>::infinity(), std::numeric_limits<double>::min());
      }
      acc.project(len, stats);
      if (moments) {
        if (stride == 1) {
          moments_chunk(q, len, *moments);
        } else {
          for (int64_t i = 0; i < len; ++i) moments->add_chunk(q + i * stride, 1);
        }
      }
      AbsStatsAccumulator<float> narrowed(std::numeric_limits<float>::infinity());
      float_chunk<true>(buffer, len, std::numeric_limits<float>::min(), c, narrowed, probe);
    }
  } else {
    for_each_chunk_as<float, kChunk>(p, n, stride, [&](const float* values, int64_t len) {
      AbsStatsAccumulator<float> acc(std::numeric_limits<float>::infinity());
      float_chunk<true>(values, len, static_cast<float>(smallest_normal<T>()), c, acc, probe);
      acc.project(len, stats);
      if (moments) moments_chunk(values, len, *moments);  // the chunk is still in cache
    });
  }
}

// The probe alone over one run, read in chunks as fused_run reads them (other dtypes as floats,
// as the cast sees them).
template <typename T>
void probe_run(const T* p, int64_t n, int64_t stride, const Fp8ProbeParams& c, Fp8ProbeResult& probe) {
  AbsStatsAccumulator<float> unused(std::numeric_limits<float>::infinity());
  for_each_chunk_as<float, kChunk>(p, n, stride, [&](const float* values, int64_t len) {
    float_chunk<false>(values, len, std::numeric_limits<float>::min(), c, unused, probe);
  });
}

// Calls run(p, n, stride) with `t`'s element type for each run of a floating tensor.
template <typename F>
void for_each_floating_run(const at::Tensor& t, F&& run) {
  switch (t.scalar_type()) {
    case c10::kFloat: for_each_run<float>(t, run); break;
    case c10::kDouble: for_each_run<double>(t, run); break;
    case c10::kHalf: for_each_run<c10::Half>(t, run); break;
    default: for_each_run<c10::BFloat16>(t, run); break;
  }
}

// Whether the probe reads `t`: a floating tensor the statistics pass would read.
bool probed(const at::Tensor& t) {
  const auto dtype = t.defined() ? t.scalar_type() : c10::kFloat;
  const bool floating = dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kHalf || dtype == c10::kBFloat16;
  return floating && compute_readability(t) == Readability::Read;
}

// Probes of one slot run with the same scale until its history moves: the thresholds' searches
// (about 60 roundings) are made once per (scale, format) on each thread.
const Fp8ProbeParams& cached_params(float scale, fp8::Format format) {
  thread_local Fp8ProbeParams params = make_fp8_probe_params(1.0f, fp8::Format::E4M3);
  thread_local fp8::Format params_format = fp8::Format::E4M3;
  if (!(params.scale == scale) || params_format != format) {
    params = make_fp8_probe_params(scale, format);
    params_format = format;
  }
  return params;
}

}  // namespace

float fp8_quantize_dequantize(float x, float scale, fp8::Format format, bool& overflow) {
  const Fp8ProbeParams& c = cached_params(scale, format);
  const float v = x * scale;
  const float rounded = fp8_round_scaled(std::fabs(v), c);
  overflow = !(rounded <= c.max);
  return std::copysign(fp8_saturate(rounded, c.max), v) * (1.0f / scale);
}

bool compute_with_fp8_probe(const at::Tensor& t, float scale, fp8::Format format, TensorStats& stats,
                            Fp8ProbeResult& probe, Readability* readability, MomentsAccumulator* moments) {
  probe = Fp8ProbeResult{};
  if (!probed(t)) {
    const Readability r = compute(t, stats);
    if (readability) *readability = r;
    return false;
  }
  if (readability) *readability = Readability::Read;
  stats = TensorStats{};
  const Fp8ProbeParams c = cached_params(scale, format);
  for_each_floating_run(t, [&](const auto* p, int64_t n, int64_t s) { fused_run(p, n, s, c, stats, probe, moments); });
  return true;
}

bool compute_fp8_probe(const at::Tensor& t, float scale, fp8::Format format, Fp8ProbeResult& probe) {
  probe = Fp8ProbeResult{};
  if (!probed(t)) return false;
  const Fp8ProbeParams c = cached_params(scale, format);
  for_each_floating_run(t, [&](const auto* p, int64_t n, int64_t s) { probe_run(p, n, s, c, probe); });
  return true;
}

}  // namespace stats
}  // namespace sentinel
