#pragma once
// The FP8 probe's fast path, as plain code for the host and the device (so that the CPU tests run
// it against the probe's per-element arithmetic). It takes the vectors the statistics' fast path
// folded (cuda/lane_scan.h): every magnitude in them is a normal, finite number. So no element
// needs the probe's test for inf and NaN; the overflow and underflow counts are read off the
// vector's extremes, and counted element by element only when an extreme crosses a threshold;
// and the three sums are kept in float over a few vectors, then added to the double accumulator,
// as the CPU pass's lanes keep them (src/fp8/fp8_probe.cpp). A vector whose scaled magnitudes
// lie outside the range where float squares keep their precision takes the per-element double
// arithmetic instead. In float64 per element, the probe cost the bfloat16 kernel three quarters
// of its bandwidth. On a GPU that converts to FP8 itself (compute capability 8.9 and up) the
// rounding is its conversions, a pair of lanes at a time (cuda/fp8_pair_round.h: equal to the
// arithmetic the CPU tests run here, by tests/fp8/test_fp8_pair_round.cpp).
#include <cstdint>

#include "cuda/lane_scan.h"
#include "fp8/fp8_probe_math.h"
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#include "cuda/fp8_pair_round.h"
#define SENTINEL_FP8_CONVERSIONS 1  // the GPU converts to FP8 and back itself
#endif

// Loops over a vector's lanes, unrolled on the device so that the lanes stay in registers.
#if defined(__CUDA_ARCH__)
#define SENTINEL_UNROLL _Pragma("unroll")
#else
#define SENTINEL_UNROLL
#endif

namespace sentinel {
namespace cuda {

template <typename F>
struct ProbeLanes {
  // Scaled magnitudes whose squares (and the sums of kVectorsPerFlush vectors of them) are
  // normal floats: 2^60 and 2^-40 (the CPU's lanes take chunks whose scaled maximum is 1e-12
  // or more).
  static constexpr float kFloatSumsBelow = 1.152921504606846976e18f;
  static constexpr float kFloatSumsFrom = 9.094947017729282379e-13f;
  static constexpr int kVectorsPerFlush = 4;
  static constexpr int kLanes = 128 / F::kLaneBits;

  float sum_sq_error = 0, sum_a_q = 0, sum_q_sq = 0;  // since the last flush
  int vectors = 0;

  // One ordinary vector: its four words, and `hi` and `lo`, the lanes' largest and smallest
  // magnitude bits (LaneScan::fold's).
  SENTINEL_HOST_DEVICE void take(const uint32_t (&w)[4], uint32_t hi, uint32_t lo, const stats::Fp8ProbeParams& p,
                                 stats::Fp8ProbeAccumulator<double>& probe) {
    using Scan = LaneScan<F>;
    const float top = F::value(Scan::widest(hi)), bottom = F::value(Scan::narrowest(lo));
    float ax[kLanes];
    SENTINEL_UNROLL
    for (int k = 0; k < 4; ++k) {
      if (F::kLaneBits == 32) {
        ax[k] = F::value(w[k] & F::kAbsMask);
      } else {
        ax[2 * k] = F::value(w[k] & 0x7fffu);
        ax[2 * k + 1] = F::value((w[k] >> 16) & 0x7fffu);
      }
    }
    const float scaled_top = stats::rounded_product(top, p.scale);
    if (!(scaled_top < kFloatSumsBelow && scaled_top >= kFloatSumsFrom)) {
      SENTINEL_UNROLL
      for (int k = 0; k < kLanes; ++k) probe.reduce(ax[k], p);
      return;
    }
    probe.count += kLanes;
    if (top > p.overflow_above) {
      SENTINEL_UNROLL
      for (int k = 0; k < kLanes; ++k) probe.overflow += ax[k] > p.overflow_above;
    }
    if (bottom < p.underflow_below) {  // every magnitude here is above zero
      SENTINEL_UNROLL
      for (int k = 0; k < kLanes; ++k) probe.underflow += ax[k] < p.underflow_below;
    }
    float a[kLanes], q[kLanes];
    SENTINEL_UNROLL
    for (int k = 0; k < kLanes; ++k) a[k] = stats::rounded_product(ax[k], p.scale);
#ifdef SENTINEL_FP8_CONVERSIONS
    if (p.fp8_kind != stats::Fp8ProbeParams::Fp8Kind::kOther) {
      SENTINEL_UNROLL
      for (int k = 0; k < kLanes; k += 2) fp8_pair_round(a[k], a[k + 1], p.fp8_kind, q[k], q[k + 1]);
    } else
#endif
    {
      SENTINEL_UNROLL
      for (int k = 0; k < kLanes; ++k) q[k] = stats::fp8_saturate(stats::fp8_round_scaled(a[k], p), p.max);
    }
    SENTINEL_UNROLL
    for (int k = 0; k < kLanes; ++k) {
      const float err = a[k] - q[k];  // exact, but where q saturated: q is a rounded to a few bits
      sum_sq_error += err * err;
      sum_a_q += a[k] * q[k];
      sum_q_sq += q[k] * q[k];
    }
    if (++vectors == kVectorsPerFlush) flush(probe);
  }

  // The float sums into the double accumulator (also when the thread's elements end).
  SENTINEL_HOST_DEVICE void flush(stats::Fp8ProbeAccumulator<double>& probe) {
    probe.sum_sq_error += sum_sq_error;
    probe.sum_a_q += sum_a_q;
    probe.sum_q_sq += sum_q_sq;
    sum_sq_error = sum_a_q = sum_q_sq = 0;
    vectors = 0;
  }
};

}  // namespace cuda
}  // namespace sentinel
