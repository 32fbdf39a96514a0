#pragma once
// The statistics kernel's fast path, as plain code for the host and the device (so that the CPU
// tests run it against the CPU pass). A 16-byte vector whose magnitudes all lie in [smallest
// normal, infinity) adds nothing to any count (no NaN, infinity, zero or subnormal), only to the
// magnitudes' minimum and maximum, which for non-negative floats order as their bit patterns do
// as unsigned integers. So the vector's four words are reduced as integers, two 16-bit lanes at a
// time for the half types, and only a vector with a lane outside that range goes element by
// element through the accumulators. Tensors of ordinary numbers then cost a few integer
// instructions per word instead of a dozen float instructions per element (bfloat16 was bound by
// those, not by memory).
#include <sentinel/fp8.h>

#include <cstdint>

#include "stats/stats_accumulator.h"

namespace sentinel {
namespace cuda {

// Where a dtype's magnitude bits (the sign cleared) put infinity and the smallest normal, in each
// lane of a 32-bit word, and the float value of one lane's bits (normal numbers only: all the fast
// path keeps).
struct Float32Lanes {
  static constexpr int kLaneBits = 32;
  static constexpr uint32_t kAbsMask = 0x7fffffffu, kInfBits = 0x7f800000u, kMinNormalBits = 0x00800000u;
  SENTINEL_HOST_DEVICE static float value(uint32_t b) { return fp8::detail::bits_to_float(b); }
};
struct Float16Lanes {  // two lanes per word
  static constexpr int kLaneBits = 16;
  static constexpr uint32_t kAbsMask = 0x7fff7fffu, kInfBits = 0x7c007c00u, kMinNormalBits = 0x04000400u;
  // Exponent bias 15 -> 127, mantissa 10 -> 23 bits.
  SENTINEL_HOST_DEVICE static float value(uint32_t b) {
    return fp8::detail::bits_to_float((((b >> 10) + 112u) << 23) | ((b & 0x3ffu) << 13));
  }
};
struct BFloat16Lanes {
  static constexpr int kLaneBits = 16;
  static constexpr uint32_t kAbsMask = 0x7fff7fffu, kInfBits = 0x7f807f80u, kMinNormalBits = 0x00800080u;
  SENTINEL_HOST_DEVICE static float value(uint32_t b) { return fp8::detail::bits_to_float(b << 16); }
};

template <typename F>
struct LaneScan {
  uint32_t max_bits = 0, min_bits = 0xffffffffu;  // per lane; min's all-ones means "none yet"

  SENTINEL_HOST_DEVICE static uint32_t lane_max(uint32_t a, uint32_t b) {
    if (F::kLaneBits == 32) return a > b ? a : b;
#if defined(__CUDA_ARCH__)
    return __vmaxu2(a, b);
#else
    const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
    const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
    return (hi << 16) | lo;
#endif
  }
  SENTINEL_HOST_DEVICE static uint32_t lane_min(uint32_t a, uint32_t b) {
    if (F::kLaneBits == 32) return a < b ? a : b;
#if defined(__CUDA_ARCH__)
    return __vminu2(a, b);
#else
    const uint32_t lo = (a & 0xffffu) < (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
    const uint32_t hi = (a >> 16) < (b >> 16) ? (a >> 16) : (b >> 16);
    return (hi << 16) | lo;
#endif
  }
  // Whether every lane of `hi` is below infinity's bits and every lane of `lo` at least the
  // smallest normal's.
  SENTINEL_HOST_DEVICE static bool ordinary(uint32_t hi, uint32_t lo) {
    if (F::kLaneBits == 32) return hi < F::kInfBits && lo >= F::kMinNormalBits;
#if defined(__CUDA_ARCH__)
    return (__vcmpgeu2(hi, F::kInfBits) | __vcmpltu2(lo, F::kMinNormalBits)) == 0;
#else
    return (hi & 0xffffu) < (F::kInfBits & 0xffffu) && (hi >> 16) < (F::kInfBits >> 16) &&
           (lo & 0xffffu) >= (F::kMinNormalBits & 0xffffu) && (lo >> 16) >= (F::kMinNormalBits >> 16);
#endif
  }

  // Folds a vector's four words into the running lanes when every magnitude is ordinary; false
  // (and nothing folded) when the vector must go through the accumulators instead. `hi` and `lo`
  // get the vector's largest and smallest magnitude bits, per lane (the FP8 probe's fast path
  // reads its thresholds off them: cuda/probe_lanes.h).
  SENTINEL_HOST_DEVICE bool fold(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, uint32_t& hi, uint32_t& lo) {
    const uint32_t a0 = w0 & F::kAbsMask, a1 = w1 & F::kAbsMask, a2 = w2 & F::kAbsMask, a3 = w3 & F::kAbsMask;
    hi = lane_max(lane_max(a0, a1), lane_max(a2, a3));
    lo = lane_min(lane_min(a0, a1), lane_min(a2, a3));
    if (!ordinary(hi, lo)) return false;
    max_bits = lane_max(max_bits, hi);
    min_bits = lane_min(min_bits, lo);
    return true;
  }

  // The largest and the smallest of a word's lanes.
  SENTINEL_HOST_DEVICE static uint32_t widest(uint32_t bits) {
    if (F::kLaneBits == 32) return bits;
    return (bits >> 16) > (bits & 0xffffu) ? bits >> 16 : bits & 0xffffu;
  }
  SENTINEL_HOST_DEVICE static uint32_t narrowest(uint32_t bits) {
    if (F::kLaneBits == 32) return bits;
    return (bits >> 16) < (bits & 0xffffu) ? bits >> 16 : bits & 0xffffu;
  }

  // Hands the lanes' extremes to the accumulator (nothing when no vector was folded).
  SENTINEL_HOST_DEVICE void finish(stats::AbsStatsAccumulator<float>& acc) const {
    const uint32_t hi = widest(max_bits), lo = narrowest(min_bits);
    if (lo == (F::kLaneBits == 16 ? 0xffffu : 0xffffffffu)) return;
    const float a_max = F::value(hi), a_min = F::value(lo);
    acc.abs_max = a_max > acc.abs_max ? a_max : acc.abs_max;
    acc.abs_min = a_min < acc.abs_min ? a_min : acc.abs_min;
  }
};

}  // namespace cuda
}  // namespace sentinel
