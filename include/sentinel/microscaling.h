// Bit-exact software conversions for the block-scaled formats: the E8M0 scale of MXFP8 (OCP
// Microscaling v1.0) and the E2M1 element of NVFP4.
//
//   E8M0: 8 exponent bits, bias 127, no sign and no mantissa: the value is 2^(code - 127), from
//         2^-127 (code 0x00) to 2^127 (code 0xFE); 0xFF is NaN. There is no zero.
//   E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
//         negatives. No inf, no NaN.
//
// e8m0_encode() matches CUDA's __nv_cvt_float_to_e8m0(x, saturate, rounding) for
// rounding cudaRoundZero (round_up = false: the power of two at or below |x|) and
// cudaRoundPosInf (round_up = true: at or above |x|), and e2m1_encode() matches
// __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest), on every float input
// (tests/fp8/test_fp8_exhaustive.cpp). Header-only and free of CUDA headers, like fp8.h.
#ifndef SENTINEL_MICROSCALING_H_
#define SENTINEL_MICROSCALING_H_

#include <cstdint>

#include "sentinel/fp8.h"

namespace sentinel {
namespace fp8 {

constexpr uint8_t kE8M0NaN = 0xFF;
constexpr uint8_t kE8M0Max = 0xFE;  // 2^127

// |x| -> E8M0, the sign ignored. NaN gives 0xFF. Results below 2^-127 (zero and tiny values
// included) are clipped to 2^-127 (code 0). Above 2^127 (inf included): 2^127 when saturating,
// NaN otherwise.
SENTINEL_HOST_DEVICE inline uint8_t e8m0_encode(float x, bool round_up, bool saturate) {
  const uint32_t a = detail::float_to_bits(x) & detail::kFloatAbsMask;
  if (a > detail::kFloatInfBits) return kE8M0NaN;
  uint32_t e = a >> 23;
  // Rounding up moves to the next exponent whenever a mantissa bit is set, except for float
  // subnormals at or below 2^-127 (bits 0x00400000), which are clipped to 2^-127 anyway.
  if (round_up && a < detail::kFloatInfBits && (a & 0x7FFFFFu) != 0u && a > 0x00400000u) ++e;
  if (e == 0xFFu && saturate) e = kE8M0Max;
  return static_cast<uint8_t>(e);
}

// E8M0 -> float, exact: 2^(code - 127) (code 0 is the float subnormal 2^-127), NaN for 0xFF.
SENTINEL_HOST_DEVICE inline float e8m0_decode(uint8_t code) {
  if (code == kE8M0NaN) return detail::bits_to_float(detail::kFloatCanonicalNaN);
  if (code == 0) return detail::bits_to_float(0x00400000u);
  return detail::bits_to_float(static_cast<uint32_t>(code) << 23);
}

constexpr float kE2M1Max = 6.0f;

// Float -> E2M1 code (4 bits in the low nibble), round to nearest, ties to even, saturating to
// +-6. NaN gives +6 (0x7), as CUDA does; the sign of zero and of values rounding to zero is kept.
SENTINEL_HOST_DEVICE inline uint8_t e2m1_encode(float x) {
  const uint32_t bits = detail::float_to_bits(x);
  const uint32_t abs_bits = bits & detail::kFloatAbsMask;
  if (abs_bits > detail::kFloatInfBits) return 0x7;
  const uint8_t sign = static_cast<uint8_t>((bits >> 28) & 0x8u);
  const float a = detail::bits_to_float(abs_bits);
  // The midpoints between neighbouring codes; at a midpoint the even code (an even last bit)
  // wins, so crossing into code k needs a > bound when k is odd and a >= bound when k is even.
  const float bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t code = 0;
  for (int k = 1; k <= 7; ++k) {
    const float b = bounds[k - 1];
    code = static_cast<uint8_t>(code + ((k & 1) ? (a > b) : (a >= b)));
  }
  return static_cast<uint8_t>(sign | code);
}

SENTINEL_HOST_DEVICE inline float e2m1_decode(uint8_t code) {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = magnitudes[code & 0x7u];
  return (code & 0x8u) ? -m : m;
}

}  // namespace fp8
}  // namespace sentinel

#endif  // SENTINEL_MICROSCALING_H_
