// The low-precision recipes beside delayed scaling, and the scale arithmetic of the block-scaled
// ones, as TransformerEngine and the OCP Microscaling (MX) v1.0 specification define them.
//
//   current  per-tensor FP8: scale = fp8_max / amax(this tensor) / 2^margin (1 when amax is 0
//            or not finite; FLT_MAX when it overflows), cast x * scale.
//   mxfp8    blocks of 32 elements along the GEMM's reduction dimension share a power-of-two
//            E8M0 scale; elements are E4M3 or E5M2.
//   nvfp4    blocks of 16 E2M1 elements share an E4M3 scale, on top of an FP32 scale per tensor;
//            weights use 16 x 16 tiles.
//   float8block  TransformerEngine's Float8BlockScaling (DeepSeek-V3's): 1 x 128 blocks along the
//            GEMM's reduction dimension for activations and gradients, 128 x 128 tiles for
//            weights, each with an FP32 scale fp8_max / amax (a power of two, rounded down, by
//            default); elements E4M3 (E5M2 for gradients under HYBRID).
//
// Every function reproduces the float operations of its reference in the same order, so that
// the scale codes match bit for bit (docs/fp8.md, "Recipes"). Header-only, host and device.
#ifndef SENTINEL_BLOCK_SCALING_H_
#define SENTINEL_BLOCK_SCALING_H_

#include <cfloat>
#include <cstdint>

#include "sentinel/fp8.h"
#include "sentinel/microscaling.h"

namespace sentinel {
namespace fp8 {

constexpr int kMxBlock = 32;
constexpr int kNvfp4Block = 16;
constexpr int kFloat8Block = 128;  // Float8BlockScaling's block length and tile side

// One block's scale: the stored code, the factor elements are multiplied by before the cast,
// and the factor a cast value is multiplied by to dequantize it.
struct BlockScale {
  uint8_t code = 0;       // E8M0 (mxfp8) or E4M3 (nvfp4) code of the block scale
  float encode = 1.0f;    // elements are cast as cast(x * encode)
  float decode = 1.0f;    // dequantized value = cast * decode (NaN: the block is lost)
  bool saturated = false; // the scale was clamped at its largest value
  bool at_min = false;    // the scale was clamped at its smallest value (nvfp4: it is zero)
};

// 1 / 2^(code - 127) = 2^(127 - code), built from its float bits (0 for code 0xFE, whose
// reciprocal 2^-127 is below float's normals: TransformerEngine's exp2f_rcp does the same).
SENTINEL_HOST_DEVICE inline float e8m0_reciprocal_bits(uint8_t code) {
  return detail::bits_to_float(static_cast<uint32_t>(254 - code) << 23);
}

// MXFP8: the scale of a block whose largest |x| (NaN elements ignored, as fmaxf does) is amax.
SENTINEL_HOST_DEVICE inline BlockScale mxfp8_block_scale(float amax, Format element, MxScaleRule rule) {
  BlockScale s;
  if (rule == MxScaleRule::RoundUp) {
    // TransformerEngine: the reciprocal of fp8_max is a float constant; code 0 encodes with 1
    // and code 0xFE (2^127, reached only from an infinite amax) with 0, as its exp2f_rcp does.
    const float max_norm_rcp = element == Format::E4M3 ? static_cast<float>(1.0 / 448.0) : static_cast<float>(1.0 / 57344.0);
    s.code = e8m0_encode(amax * max_norm_rcp, /*round_up=*/true, /*saturate=*/true);
    s.encode = s.code == 0 ? 1.0f : e8m0_reciprocal_bits(s.code);
    s.decode = e8m0_decode(s.code);
    s.saturated = s.code == kE8M0Max;
    s.at_min = s.code == 0 && amax > 0.0f;
    return s;
  }
  // OCP: floor(log2(amax)) is the exponent field of amax (float subnormals and 0 give the
  // clamp). A block holding inf or NaN has a NaN scale: all its elements are lost.
  if (!(amax <= FLT_MAX) || amax != amax) {
    s.code = kE8M0NaN;
    s.encode = 0.0f;
    s.decode = e8m0_decode(kE8M0NaN);
    return s;
  }
  const int emax = element == Format::E4M3 ? 8 : 15;
  int shared = static_cast<int>(e8m0_encode(amax, /*round_up=*/false, /*saturate=*/true)) - 127 - emax;
  if (shared < -127) {
    shared = -127;
    s.at_min = amax > 0.0f;
  }
  s.code = static_cast<uint8_t>(shared + 127);
  s.encode = e8m0_reciprocal_bits(s.code);
  s.decode = e8m0_decode(s.code);
  return s;
}

// NVFP4: the FP32 scale of the whole tensor, from its amax (TransformerEngine's
// compute_global_encode_scaling_factor_FP4): 448 * 6 / amax, at most FLT_MAX, and 1 when the
// amax is 0 or infinite.
SENTINEL_HOST_DEVICE inline float nvfp4_tensor_scale(float tensor_amax) {
  float s = 448.0f * kE2M1Max / tensor_amax;
  s = s < FLT_MAX ? s : FLT_MAX;  // fminf: NaN gives FLT_MAX
  if (tensor_amax == 0.0f || s == 0.0f) return 1.0f;
  return s;
}

// NVFP4: the scale of one block (or 16 x 16 tile) with the tensor's scale S_enc:
// S_dec_b = e4m3(amax * (S_enc * (1/6))) saturating; elements are cast as
// e2m1(x * min(1 / (S_dec_b * S_dec), FLT_MAX)) with S_dec = 1 / S_enc (computed in double, as
// TransformerEngine does), and dequantized as q * (S_dec_b * S_dec).
SENTINEL_HOST_DEVICE inline BlockScale nvfp4_block_scale(float block_amax, float tensor_scale) {
  BlockScale s;
  const float fp4_max_inv = 1.0f / kE2M1Max;
  const float wanted = block_amax * (tensor_scale * fp4_max_inv);
  s.code = encode(wanted < FLT_MAX ? wanted : FLT_MAX, Format::E4M3, /*saturate=*/true);
  s.saturated = encode(wanted, Format::E4M3, /*saturate=*/false) == detail::kNaNCode && wanted == wanted;
  const float block_decode = decode(s.code, Format::E4M3);
  const float tensor_decode = static_cast<float>(1.0 / static_cast<double>(tensor_scale));
  const float inverse = 1.0f / (block_decode * tensor_decode);
  s.encode = inverse < FLT_MAX ? inverse : FLT_MAX;
  s.decode = block_decode * tensor_decode;
  s.at_min = block_decode == 0.0f && block_amax > 0.0f;
  return s;
}

// Float8BlockScaling: the FP32 scale of a block (or 128 x 128 tile) whose largest |x| is amax,
// as TransformerEngine's compute_scale_from_amax gives it: amax raised to `epsilon`; 1 when that
// is 0 or inf; else fp8_max / amax (one float division), FLT_MAX where that overflows, and with
// `pow2` its mantissa cleared (the power of two at or below). Elements are cast as
// cast(x * scale) and dequantized with scale_inv = 1 / scale. The code is the exponent byte of
// scale_inv: its power of two, exact for pow2 scales (e8m0_decode gives its value back).
// `saturated`: the division overflowed (a tiny amax), so the scale was clamped at FLT_MAX.
SENTINEL_HOST_DEVICE inline BlockScale float8_block_scale(float amax, Format element, bool pow2, float epsilon) {
  BlockScale s;
  const float a = amax < epsilon ? epsilon : amax;
  float scale = 1.0f;
  if (!(a > FLT_MAX) && a != 0.0f) {
    scale = max_value(element) / a;
    if (scale > FLT_MAX) {
      scale = FLT_MAX;
      s.saturated = true;
    }
    if (scale != scale) scale = 1.0f;  // a NaN amax (never from an fmaxf amax)
    if (pow2) scale = detail::bits_to_float(detail::float_to_bits(scale) & 0xFF800000u);
  }
  s.encode = scale;
  s.decode = 1.0f / scale;
  s.code = static_cast<uint8_t>(detail::float_to_bits(s.decode) >> 23);
  return s;
}

}  // namespace fp8
}  // namespace sentinel

#endif  // SENTINEL_BLOCK_SCALING_H_
