#include "stats/fp8_probe.h"

#include <ATen/core/Tensor.h>

#include <cmath>
#include <limits>

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

double Fp8ProbeResult::sqnr_db() const {
  if (sum_sq_error == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(sum_x_sq / sum_sq_error);
}

namespace {

using namespace kernels;

struct FormatConstants {
  float max;
  float min_normal;
  float min_subnormal;
  float inv_min_subnormal;
  int drop_bits;  // float32 mantissa bits the format does not keep
};

FormatConstants constants(fp8::Format f) {
  return {fp8::max_value(f), fp8::min_normal(f), fp8::min_subnormal(f), 1.0f / fp8::min_subnormal(f),
          f == fp8::Format::E4M3 ? 20 : 21};
}

// 1.5 * 2^23: adding and subtracting it rounds a float below 2^22 to an integer, ties to even.
constexpr float kRintMagic = 12582912.0f;

// |v| rounded to the format, before saturation. Subnormal range: a multiple of the smallest
// subnormal; normal range: the float's mantissa rounded to the format's bits, ties to even
// (carry into the exponent is the correct result). Inf and values rounding past the largest
// exponent come out above max (or NaN), which the caller counts as overflow.
float round_abs(float a, const FormatConstants& c) {
  if (a < c.min_normal) return ((a * c.inv_min_subnormal + kRintMagic) - kRintMagic) * c.min_subnormal;
  uint32_t bits;
  std::memcpy(&bits, &a, sizeof bits);
  bits += (1u << (c.drop_bits - 1)) - 1 + ((bits >> c.drop_bits) & 1);
  bits &= ~((1u << c.drop_bits) - 1);
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

struct ProbeSums {
  uint32_t overflow = 0, underflow = 0, count = 0;
  double sum_sq_error = 0, sum_x_q = 0, sum_x_sq = 0, sum_q_sq = 0;
};

// One chunk (n <= 4096). The cast is computed in float, as the cast itself is. Sums run in float
// lanes over sub-blocks of 256 elements and are added in double after each, which keeps them
// accurate; `huge` (the chunk holds values whose square overflows float) takes double lanes.
// `clean` (the statistics found no inf/nan in the chunk) skips the masking of non-finite values.
template <bool kClean, bool kHuge>
__attribute__((target_clones("avx2", "default"))) void probe_chunk_impl(const float* p, int64_t n, float scale,
                                                                        const FormatConstants& c, ProbeSums& out) {
  typedef float V __attribute__((vector_size(32)));
  typedef int32_t M __attribute__((vector_size(32)));
  typedef double D __attribute__((vector_size(32)));
  constexpr int L = 8;
  constexpr int64_t kSubBlock = 256;
  const V vscale = V{} + scale, vinv = V{} + 1.0f / scale, vmax = V{} + c.max;
  const V vfmax = V{} + std::numeric_limits<float>::max();
  const V vmin_normal = V{} + c.min_normal, vinv_sub = V{} + c.inv_min_subnormal, vsub = V{} + c.min_subnormal;
  const V magic = V{} + kRintMagic, zero = V{};
  const M abs_mask = M{} + 0x7fffffff;
  const M drop_half = M{} + ((1 << (c.drop_bits - 1)) - 1), keep_mask = M{} + ~((1 << (c.drop_bits - 1) << 1) - 1);
  M ovf = M{}, unf = M{}, cnt = M{};
  D dse = D{}, dxq = D{}, dxx = D{}, dqq = D{};
  int64_t i = 0;
  while (i + L <= n) {
    const int64_t end = std::min(n - (n - i) % L, i + kSubBlock);
    V se = V{}, sxq = V{}, sxx = V{}, sqq = V{};
    for (; i < end; i += L) {
      // Magnitudes throughout: the cast keeps the sign (or gives zero), so the error, the
      // products and the counts are the same for |x| as for x.
      M xbits;
      std::memcpy(&xbits, p + i, sizeof xbits);
      xbits &= abs_mask;
      V x;
      std::memcpy(&x, &xbits, sizeof x);
      M finite = M{} - 1;
      if constexpr (!kClean) {
        finite = (x <= vfmax);
        x = finite ? x : zero;  // non-finite elements are the statistics' business, not the probe's
      }
      const V a = x * vscale;
      M abits;
      std::memcpy(&abits, &a, sizeof abits);
      const V sub = ((a * vinv_sub + magic) - magic) * vsub;
      const M nbits = (abits + drop_half + ((abits >> c.drop_bits) & 1)) & keep_mask;
      V nor;
      std::memcpy(&nor, &nbits, sizeof nor);
      V q = a < vmin_normal ? sub : nor;
      const M over = ~(q <= vmax);  // above max, inf or NaN: the saturating cast gives max
      q = q < vmax ? q : vmax;      // (NaN, from inf, compares false: max)
      const V qx = q * vinv;
      ovf -= over & finite;
      unf -= (x != zero) & (q == zero);
      cnt -= finite;
      if constexpr (kHuge) {
        const D xs[2] = {__builtin_convertvector(__builtin_shufflevector(x, x, 0, 1, 2, 3), D),
                         __builtin_convertvector(__builtin_shufflevector(x, x, 4, 5, 6, 7), D)};
        const D qs[2] = {__builtin_convertvector(__builtin_shufflevector(qx, qx, 0, 1, 2, 3), D),
                         __builtin_convertvector(__builtin_shufflevector(qx, qx, 4, 5, 6, 7), D)};
        for (int h = 0; h < 2; ++h) {
          const D err = xs[h] - qs[h];
          dse += err * err;
          dxq += xs[h] * qs[h];
          dxx += xs[h] * xs[h];
          dqq += qs[h] * qs[h];
        }
      } else {
        const V err = x - qx;
        se += err * err;
        sxq += x * qx;
        sxx += x * x;
        sqq += qx * qx;
      }
    }
    if constexpr (!kHuge) {
      for (int l = 0; l < L; ++l) {
        out.sum_sq_error += se[l];
        out.sum_x_q += sxq[l];
        out.sum_x_sq += sxx[l];
        out.sum_q_sq += sqq[l];
      }
    }
  }
  for (int l = 0; l < L; ++l) {
    out.overflow += static_cast<uint32_t>(ovf[l]);
    out.underflow += static_cast<uint32_t>(unf[l]);
    out.count += static_cast<uint32_t>(cnt[l]);
  }
  for (int l = 0; l < 4; ++l) {
    out.sum_sq_error += dse[l];
    out.sum_x_q += dxq[l];
    out.sum_x_sq += dxx[l];
    out.sum_q_sq += dqq[l];
  }
  for (; i < n; ++i) {
    const float x = p[i];
    if (!(std::fabs(x) <= std::numeric_limits<float>::max())) continue;
    bool over = false;
    const float qx = fp8_quantize_dequantize(x, scale, c.max == 448.0f ? fp8::Format::E4M3 : fp8::Format::E5M2, over);
    out.overflow += over;
    out.underflow += (x != 0) & (qx == 0);
    out.count += 1;
    const double xd = x, qd = qx;
    out.sum_sq_error += (xd - qd) * (xd - qd);
    out.sum_x_q += xd * qd;
    out.sum_x_sq += xd * xd;
    out.sum_q_sq += qd * qd;
  }
}

// Squares of values above this overflow float (sums of 256 of them: a margin of 2^8).
constexpr double kHugeForFloatSums = 1e18;

void probe_chunk(const float* p, int64_t n, float scale, const FormatConstants& c, bool clean, double abs_max,
                 ProbeSums& out) {
  const bool huge = !(abs_max < kHugeForFloatSums) || !(abs_max * scale < kHugeForFloatSums);
  if (clean && !huge) probe_chunk_impl<true, false>(p, n, scale, c, out);
  else if (!huge) probe_chunk_impl<false, false>(p, n, scale, c, out);
  else probe_chunk_impl<false, true>(p, n, scale, c, out);
}

void add(const ProbeSums& s, Fp8ProbeResult& r) {
  r.count += s.count;
  r.overflow += s.overflow;
  r.underflow += s.underflow;
  r.sum_sq_error += s.sum_sq_error;
  r.sum_x_q += s.sum_x_q;
  r.sum_x_sq += s.sum_x_sq;
  r.sum_q_sq += s.sum_q_sq;
}

constexpr int64_t kChunk = 4096;

// Statistics then probe on each chunk while it is in L1: one read of the tensor from memory.
template <typename T>
void fused_run(const T* p, int64_t n, int64_t stride, float scale, const FormatConstants& c, TensorStats& stats,
               Fp8ProbeResult& probe) {
  using acc_t = typename Widen<T>::acc_t;
  const acc_t inf = std::numeric_limits<acc_t>::infinity();
  const acc_t min_normal = static_cast<acc_t>(smallest_normal<T>());
  acc_t wide[kChunk];
  float narrow[kChunk];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t len = std::min(kChunk, n - start);
    const T* q = p + start * stride;
    const acc_t* values = nullptr;
    if constexpr (std::is_same_v<T, acc_t>) {
      if (stride == 1) values = q;
    }
    if (!values) {
      for (int64_t i = 0; i < len; ++i) wide[i] = Widen<T>::get(q[i * stride]);
      values = wide;
    }
    AbsStatsAccumulator<acc_t> acc(inf);
    reduce_contiguous<acc_t>(values, len, min_normal, acc);
    acc.project(len, stats);
    const bool clean = acc.nan == 0 && acc.inf == 0;
    const float* as_float;
    if constexpr (std::is_same_v<acc_t, float>) {
      as_float = values;
    } else {
      for (int64_t i = 0; i < len; ++i) narrow[i] = static_cast<float>(values[i]);
      as_float = narrow;
    }
    ProbeSums sums;
    probe_chunk(as_float, len, scale, c, clean, static_cast<double>(acc.abs_max), sums);
    add(sums, probe);
  }
}

}  // namespace

float fp8_quantize_dequantize(float x, float scale, fp8::Format format, bool& overflow) {
  const FormatConstants c = constants(format);
  const float v = x * scale;
  float q = round_abs(std::fabs(v), c);
  overflow = !(q <= c.max);
  if (overflow) q = c.max;
  return std::copysign(q, v) * (1.0f / scale);
}

bool compute_with_fp8_probe(const at::Tensor& t, float scale, fp8::Format format, TensorStats& stats,
                            Fp8ProbeResult& probe, Readability* readability) {
  probe = Fp8ProbeResult{};
  const auto dtype = t.defined() ? t.scalar_type() : c10::kFloat;
  const bool floating = dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kHalf || dtype == c10::kBFloat16;
  if (!floating || compute_readability(t) != Readability::Read) {
    const Readability r = compute(t, stats);
    if (readability) *readability = r;
    return false;
  }
  if (readability) *readability = Readability::Read;
  stats = TensorStats{};
  const FormatConstants c = constants(format);
  switch (dtype) {
    case c10::kFloat:
      for_each_run<float>(t, [&](const float* p, int64_t n, int64_t s) { fused_run(p, n, s, scale, c, stats, probe); });
      break;
    case c10::kDouble:
      for_each_run<double>(t, [&](const double* p, int64_t n, int64_t s) { fused_run(p, n, s, scale, c, stats, probe); });
      break;
    case c10::kHalf:
      for_each_run<c10::Half>(t, [&](const c10::Half* p, int64_t n, int64_t s) { fused_run(p, n, s, scale, c, stats, probe); });
      break;
    default:
      for_each_run<c10::BFloat16>(t, [&](const c10::BFloat16* p, int64_t n, int64_t s) {
        fused_run(p, n, s, scale, c, stats, probe);
      });
      break;
  }
  return true;
}

}  // namespace stats
}  // namespace sentinel
