#pragma once
// The FP8 probe's arithmetic for one element, written once for the CPU and, under nvcc, for the
// GPU. Definitions (docs/fp8.md): a = |x| * scale in float32, as the cast sees it; q = the
// saturating round-to-nearest-even cast of a; overflow when a rounds above the format's max;
// underflow when x != 0 and q == 0. Sums are kept in the scaled domain (a and q) and divided by
// scale^2 once per block.
#include <sentinel/fp8.h>

#include <cfloat>
#include <cstdint>

#include "stats/stats_accumulator.h"

namespace sentinel {
namespace stats {

struct Fp8ProbeParams {
  float scale = 1.0f;
  float max = 448.0f;       // largest finite value of the format
  float magic_floor = 0;    // min_subnormal * 2^23: the rounding magic of the subnormal range
  uint32_t magic_offset = 0;  // (23 - mantissa bits) << 23: a's exponent bits plus this is its binade's magic
  // Rounding is monotonic in |x|, so each count is one comparison: |x| > overflow_above
  // overflows, 0 < |x| < underflow_below flushes to zero. Found once per (scale, format).
  float overflow_above = FLT_MAX;
  float underflow_below = 0;
  // Which FP8 format these are of, for a GPU's own conversions (cuda/fp8_pair_round.h); another
  // element format (the block recipes' E2M1) is rounded by the arithmetic below alone.
  enum class Fp8Kind : uint8_t { kOther, kE4M3, kE5M2 } fp8_kind = Fp8Kind::kOther;
};

// a (finite, >= 0) rounded to the format's grid, before saturation. Adding a magic number M
// whose ulp is the format's quantum at a rounds a to that quantum, ties to even, in one float
// addition; subtracting M gives the rounded value exactly. The quantum is 2^(e - mantissa bits)
// in a normal binade [2^e, 2^(e+1)) and the smallest subnormal below the smallest normal, hence
// the max with magic_floor. Values too large for their magic come out above max (or NaN), which
// saturation turns into max.
// On the device the two selections below are one min/max instruction each (a compare and a select
// otherwise), with the same results: magic's mantissa bits are zero, so it is never NaN, and a NaN
// q is the one case where fminf and the selection both give max.
SENTINEL_HOST_DEVICE inline float fp8_round_scaled(float a, const Fp8ProbeParams& p) {
  float magic = fp8::detail::bits_to_float((fp8::detail::float_to_bits(a) & fp8::detail::kFloatInfBits) + p.magic_offset);
#if defined(__CUDA_ARCH__)
  magic = fmaxf(magic, p.magic_floor);
#else
  magic = magic > p.magic_floor ? magic : p.magic_floor;
#endif
  return (a + magic) - magic;
}

// x * scale rounded to float on its own, as a cast sees it: nvcc would otherwise fuse the product
// into the rounding's first addition (a fused multiply-add rounds once, and differently). On the
// host the product has another use (its exponent bits choose the rounding's magic), which keeps
// GCC from fusing it where contraction is on (src/fp8/fp8_probe.cpp).
SENTINEL_HOST_DEVICE inline float rounded_product(float x, float scale) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, scale);
#else
  return x * scale;
#endif
}

SENTINEL_HOST_DEVICE inline float fp8_saturate(float q, float max) {  // NaN: max
#if defined(__CUDA_ARCH__)
  return fminf(q, max);
#else
  return q < max ? q : max;
#endif
}

// Sums in the scaled domain; sum_t is double where the squares could leave float's range.
template <typename sum_t>
struct Fp8ProbeAccumulator {
  uint32_t count = 0, overflow = 0, underflow = 0;
  sum_t sum_sq_error = 0, sum_a_q = 0, sum_q_sq = 0;

  SENTINEL_HOST_DEVICE void reduce(float x, const Fp8ProbeParams& p) {
    const float ax = abs_value(x);
    if (!(ax <= FLT_MAX)) return;  // inf and NaN are the statistics' business
    ++count;
    overflow += ax > p.overflow_above;
    underflow += (ax < p.underflow_below) & (ax != 0);
    const float q = fp8_saturate(fp8_round_scaled(rounded_product(ax, p.scale), p), p.max);
    // The error against the exact |x| * scale (a float product is exact in double).
    const sum_t a = static_cast<sum_t>(ax) * static_cast<sum_t>(p.scale);
    const sum_t err = a - static_cast<sum_t>(q);
    sum_sq_error += err * err;
    sum_a_q += a * static_cast<sum_t>(q);
    sum_q_sq += static_cast<sum_t>(q) * static_cast<sum_t>(q);
  }

  SENTINEL_HOST_DEVICE void combine(const Fp8ProbeAccumulator& o) {
    count += o.count;
    overflow += o.overflow;
    underflow += o.underflow;
    sum_sq_error += o.sum_sq_error;
    sum_a_q += o.sum_a_q;
    sum_q_sq += o.sum_q_sq;
  }
};

// Host side: the constants and both thresholds for a scale and an element format with
// subnormals and saturation (FP8's, and the block recipes' E2M1: its largest value, smallest
// subnormal and mantissa bits), each threshold by a binary search over float bit patterns
// (rounding |x| * scale is monotonic in |x|).
inline Fp8ProbeParams make_element_params(float scale, float max, float min_subnormal, int mantissa_bits) {
  Fp8ProbeParams p;
  p.scale = scale;
  p.max = max;
  p.magic_floor = min_subnormal * 8388608.0f;  // * 2^23
  p.magic_offset = static_cast<uint32_t>(23 - mantissa_bits) << 23;
  auto rounded = [&](uint32_t bits) { return fp8_round_scaled(fp8::detail::bits_to_float(bits) * scale, p); };
  constexpr uint32_t kMaxFiniteBits = 0x7F7FFFFFu;
  // The first bit pattern in (0, kMaxFiniteBits] where `pred` turns true (kMaxFiniteBits + 1
  // if it never does); `pred` is false at 0 and monotonic.
  auto first_true = [](auto&& pred) {
    uint32_t lo = 0, hi = kMaxFiniteBits + 1;  // !pred(lo); pred(hi) or hi past the end
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      (pred(mid) ? hi : lo) = mid;
    }
    return hi;
  };
  // Overflow: the first |x| that does not fit (NaN does not); above the last one that does.
  const uint32_t first_over = first_true([&](uint32_t bits) { return !(rounded(bits) <= p.max); });
  p.overflow_above = first_over > kMaxFiniteBits ? FLT_MAX : fp8::detail::bits_to_float(first_over - 1);
  // Underflow: below the first |x| that does not round to zero (+inf when every finite one does).
  p.underflow_below = fp8::detail::bits_to_float(first_true([&](uint32_t bits) { return rounded(bits) != 0.0f; }));
  return p;
}

inline Fp8ProbeParams make_fp8_probe_params(float scale, fp8::Format f) {
  Fp8ProbeParams p = make_element_params(scale, fp8::max_value(f), fp8::min_subnormal(f), f == fp8::Format::E4M3 ? 3 : 2);
  p.fp8_kind = f == fp8::Format::E4M3 ? Fp8ProbeParams::Fp8Kind::kE4M3 : Fp8ProbeParams::Fp8Kind::kE5M2;
  return p;
}

}  // namespace stats
}  // namespace sentinel
