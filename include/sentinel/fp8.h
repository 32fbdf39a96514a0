// Bit-exact software casts between float and the two OCP FP8 formats.
//
//   E4M3 (the "FN" variant): 1 sign, 4 exponent (bias 7), 3 mantissa bits.
//        No infinities; S.1111.111 is NaN. Max 448, min normal 2^-6,
//        min subnormal 2^-9.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits. IEEE-like: has
//        +-inf (S.11111.00) and NaNs. Max 57344, min normal 2^-14,
//        min subnormal 2^-16.
//
// encode() rounds to nearest, ties to even, and matches CUDA's
// __nv_cvt_float_to_fp8() bit for bit on every one of the 2^32 float inputs
// (tests/fp8/test_fp8_exhaustive.cpp), including its special cases:
//   * every NaN input, whatever its sign or payload, encodes to 0x7F;
//   * saturating mode maps finite overflow AND +-inf to +-max;
//   * non-saturating mode maps overflow and +-inf to 0x7F / 0xFF (E4M3 NaN,
//     sign kept) or 0x7C / 0xFC (E5M2 +-inf);
//   * values that round below half the smallest subnormal keep their sign
//     (-1e-30f encodes to 0x80, negative zero).
// decode() is exact (every FP8 value is a float) and, like CUDA, returns the
// canonical NaN 0x7FFFFFFF for every NaN code.
//
// Header-only and free of CUDA headers so that host code, CUDA kernels and
// the statistics accumulators can all share one definition.
#ifndef SENTINEL_FP8_H_
#define SENTINEL_FP8_H_

#include <cstdint>
#include <cstring>

#include "sentinel/fp8_types.h"

namespace sentinel {
namespace fp8 {

// Largest finite magnitude.
SENTINEL_HOST_DEVICE constexpr float max_value(Format f) {
  return f == Format::E4M3 ? 448.0f : 57344.0f;
}

// Smallest positive normal value (2^-6 and 2^-14).
SENTINEL_HOST_DEVICE constexpr float min_normal(Format f) {
  return f == Format::E4M3 ? 0.015625f : 6.103515625e-05f;
}

// Smallest positive subnormal value (2^-9 and 2^-16).
SENTINEL_HOST_DEVICE constexpr float min_subnormal(Format f) {
  return f == Format::E4M3 ? 0.001953125f : 1.52587890625e-05f;
}


namespace detail {

// memcpy is the portable type pun on the host; device code has an intrinsic
// for it. A union would be undefined behaviour in C++.
SENTINEL_HOST_DEVICE inline uint32_t float_to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

SENTINEL_HOST_DEVICE inline float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

constexpr uint32_t kFloatAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInfBits = 0x7F800000u;
constexpr uint32_t kFloatCanonicalNaN = 0x7FFFFFFFu;  // what CUDA's decode returns
constexpr uint8_t kNaNCode = 0x7F;                    // NaN code of both formats

// Shift right by s (1 <= s <= 31) with round to nearest, ties to even.
SENTINEL_HOST_DEVICE inline uint32_t shift_right_rne(uint32_t v, uint32_t s) {
  const uint32_t q = v >> s;
  const uint32_t rest = v & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  return (rest > half || (rest == half && (q & 1u))) ? q + 1u : q;
}

}  // namespace detail

// Float -> FP8 code, round to nearest even. saturate=true is CUDA's
// __NV_SATFINITE, saturate=false is __NV_NOSAT.
SENTINEL_HOST_DEVICE inline uint8_t encode(float x, Format f, bool saturate) {
  const bool e4m3 = (f == Format::E4M3);
  const uint32_t mant_bits = e4m3 ? 3u : 2u;
  const uint32_t bias = e4m3 ? 7u : 15u;
  const uint8_t max_code = e4m3 ? 0x7E : 0x7B;
  const uint8_t overflow_code = e4m3 ? 0x7F : 0x7C;  // NaN resp. inf
  // Float bits of max + half an ulp of the FP8 format (464 resp. 61440): the
  // point where rounding leaves the finite range. At exactly this point the
  // tie goes to the even neighbour: 448 (mantissa 110) for E4M3, but the
  // next power of two (= overflow) for E5M2, whose max has mantissa 11.
  const uint32_t overflow_bits = e4m3 ? 0x43E80000u : 0x47700000u;
  // Float bits of the smallest FP8 normal (2^-6 resp. 2^-14).
  const uint32_t min_normal_bits = e4m3 ? 0x3C800000u : 0x38800000u;

  const uint32_t bits = detail::float_to_bits(x);
  const uint32_t abs_bits = bits & detail::kFloatAbsMask;
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);

  if (abs_bits > detail::kFloatInfBits) {
    // CUDA canonicalises every NaN to a positive one before converting, so
    // the sign of a NaN input is lost.
    return detail::kNaNCode;
  }
  const bool overflows = e4m3 ? abs_bits > overflow_bits : abs_bits >= overflow_bits;
  if (overflows) {  // includes +-inf
    return static_cast<uint8_t>(sign | (saturate ? max_code : overflow_code));
  }
  if (abs_bits >= min_normal_bits) {
    // Re-bias the exponent in place, then drop the extra mantissa bits with
    // rounding; a mantissa carry correctly bumps the exponent.
    const uint32_t rebiased = abs_bits - ((127u - bias) << 23);
    const uint32_t code = detail::shift_right_rne(rebiased, 23u - mant_bits);
    return static_cast<uint8_t>(sign | code);
  }
  // FP8 subnormal range (or below). The code is |x| / min_subnormal rounded
  // to an integer; rounding up to 2^mant_bits yields the smallest normal.
  // Float subnormals are far below half the FP8 min subnormal: they give 0.
  const uint32_t exp_field = abs_bits >> 23;
  if (exp_field == 0u) return sign;
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | 0x800000u;  // m * 2^(e-23)
  // |x| / 2^(1 - bias - mant_bits) = significand >> shift, with
  // shift = 23 - (e - (1 - bias - mant_bits)), e = exp_field - 127.
  const uint32_t shift = 23u + 1u + 127u - bias - mant_bits - exp_field;
  if (shift >= 25u) return sign;  // |x| < half the smallest subnormal
  return static_cast<uint8_t>(sign | detail::shift_right_rne(significand, shift));
}

// FP8 code -> float. Exact; NaN codes give the canonical NaN 0x7FFFFFFF.
SENTINEL_HOST_DEVICE inline float decode(uint8_t code, Format f) {
  const uint32_t sign = (code & 0x80u) << 24;
  if (f == Format::E4M3) {
    const uint32_t exp = (code >> 3) & 0xFu;
    const uint32_t mant = code & 0x7u;
    if ((code & 0x7Fu) == 0x7Fu) return detail::bits_to_float(detail::kFloatCanonicalNaN);
    if (exp == 0u) {
      const float magnitude = static_cast<float>(mant) * min_subnormal(Format::E4M3);
      return detail::bits_to_float(detail::float_to_bits(magnitude) | sign);
    }
    return detail::bits_to_float(sign | ((exp + 127u - 7u) << 23) | (mant << 20));
  }
  const uint32_t exp = (code >> 2) & 0x1Fu;
  const uint32_t mant = code & 0x3u;
  if (exp == 0x1Fu) {
    return detail::bits_to_float(mant == 0u ? (sign | detail::kFloatInfBits)
                                            : detail::kFloatCanonicalNaN);
  }
  if (exp == 0u) {
    const float magnitude = static_cast<float>(mant) * min_subnormal(Format::E5M2);
    return detail::bits_to_float(detail::float_to_bits(magnitude) | sign);
  }
  return detail::bits_to_float(sign | ((exp + 127u - 15u) << 23) | (mant << 21));
}

// The value x becomes after a cast to FP8 and back (quantize-dequantize).
SENTINEL_HOST_DEVICE inline float round_trip(float x, Format f, bool saturate) {
  return decode(encode(x, f, saturate), f);
}

}  // namespace fp8
}  // namespace sentinel

#endif  // SENTINEL_FP8_H_
