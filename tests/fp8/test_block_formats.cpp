// E8M0 and E2M1 conversions and the block scales of MXFP8 and NVFP4, against CUDA's host
// conversions. Every exponent with the mantissas where rounding turns (and random ones) here;
// every float in test_fp8_exhaustive.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda_block_oracle.h"
#include "cuda_fp8_oracle.h"
#include "float8_block_oracle.h"
#include "sentinel/block_scaling.h"

namespace sentinel {
namespace fp8 {
namespace {

using oracle::bits_of;
using oracle::float_of;

// Both signs, every exponent field, and the mantissas at the edges of each rounding decision
// (bfloat16's 16 dropped bits, the subnormal 2^-127 boundary) plus random ones.
std::vector<uint32_t> structured_floats() {
  std::vector<uint32_t> out;
  const uint32_t edges[] = {0, 1, 2, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x10001, 0x3FFFFF, 0x400000,
                            0x400001, 0x40FFFF, 0x410000, 0x7F0000, 0x7FFFFE, 0x7FFFFF, 0x200000, 0x600000};
  std::mt19937 rng(7);
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t e = 0; e < 256; ++e) {
      for (uint32_t m : edges) out.push_back(sign << 31 | e << 23 | m);
      for (int i = 0; i < 48; ++i) out.push_back(sign << 31 | e << 23 | (rng() & 0x7FFFFF));
    }
  }
  return out;
}

TEST(E8M0, EncodeMatchesCudaInEveryMode) {
  int64_t checked = 0;
  for (uint32_t b : structured_floats()) {
    for (int mode = 0; mode < 4; ++mode) {
      const bool up = mode & 1, sat = mode & 2;
      ASSERT_EQ(e8m0_encode(float_of(b), up, sat), oracle::cuda_e8m0(float_of(b), up, sat))
          << "bits 0x" << std::hex << b << " round_up " << up << " saturate " << sat;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100000);
}

TEST(E8M0, DecodeMatchesCudaForEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float ours = e8m0_decode(static_cast<uint8_t>(c)), cuda = oracle::cuda_e8m0_value(static_cast<uint8_t>(c));
    if (c == 0xFF) {
      EXPECT_TRUE(std::isnan(ours) && std::isnan(cuda));
    } else {
      EXPECT_EQ(bits_of(ours), bits_of(cuda)) << "code " << c;
      EXPECT_EQ(ours, std::ldexp(1.0f, c - 127)) << "code " << c;
    }
  }
}

TEST(E2M1, EncodeMatchesCuda) {
  for (uint32_t b : structured_floats()) {
    ASSERT_EQ(e2m1_encode(float_of(b)), oracle::cuda_e2m1(float_of(b))) << "bits 0x" << std::hex << b;
  }
  // Every float from 0 to 8 a few ulps apart at the ties (0.25, 0.75, ..., 5, 7) and beyond.
  for (float x = 0.0f; x < 8.0f; x = std::nextafter(x + 1.0f / 4096, 9.0f)) {
    for (float y : {x, -x, std::nextafter(x, 0.0f), std::nextafter(x, 9.0f)}) {
      ASSERT_EQ(e2m1_encode(y), oracle::cuda_e2m1(y)) << y;
    }
  }
}

TEST(E2M1, DecodeMatchesCudaForEveryCode) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(bits_of(e2m1_decode(static_cast<uint8_t>(c))), bits_of(oracle::cuda_e2m1_value(static_cast<uint8_t>(c))))
        << "code " << c;
  }
}

// Amaxes where the scales turn: powers of two around each format's max, their neighbours,
// zero, subnormals, the largest float, inf and NaN, and random magnitudes.
std::vector<float> interesting_amaxes() {
  std::vector<float> out = {0.0f, FLT_MIN, FLT_TRUE_MIN, 1e-40f, FLT_MAX, INFINITY, NAN, 1.0f, 6.0f, 448.0f, 57344.0f};
  for (int e = -140; e <= 127; ++e) {
    for (float m : {1.0f, 1.5f, 1.75f, 448.0f / 256, 57344.0f / 32768, 61440.0f / 32768, 464.0f / 256}) {
      const float x = std::ldexp(m, e);
      out.push_back(x);
      out.push_back(std::nextafter(x, 0.0f));
      out.push_back(std::nextafter(x, INFINITY));
    }
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int i = 0; i < 2000; ++i) out.push_back(std::ldexp(mant(rng), static_cast<int>(rng() % 270) - 140));
  return out;
}

TEST(MxBlockScale, RoundUpIsTransformerEnginesRule) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    const float rcp = static_cast<float>(1.0 / max_value(f));
    for (float amax : interesting_amaxes()) {
      const BlockScale s = mxfp8_block_scale(amax, f, MxScaleRule::RoundUp);
      const uint8_t want = oracle::cuda_e8m0(amax * rcp, /*round_up=*/true, /*saturate=*/true);
      ASSERT_EQ(s.code, want) << amax;
      if (amax == amax) {
        // exp2f_rcp: 1 for code 0, 2^(127 - code) = 1 / 2^(code - 127) otherwise (0 for code 254).
        const float enc = want == 0 ? 1.0f : (want == 254 ? 0.0f : std::ldexp(1.0f, 127 - want));
        EXPECT_EQ(s.encode, enc) << amax;
        EXPECT_EQ(s.decode, oracle::cuda_e8m0_value(want)) << amax;
      }
      // No finite element of the block overflows under this rule unless the scale saturated.
      if (std::isfinite(amax) && amax > 0 && want != 0) {  // code 0 encodes with 1: tiny blocks
        EXPECT_LE(round_trip(amax * s.encode, f, true), max_value(f));
        EXPECT_LE(amax * s.encode, max_value(f)) << amax;
      }
    }
  }
}

TEST(MxBlockScale, OcpFloorIsTheSpecificationsRule) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    const int emax = f == Format::E4M3 ? 8 : 15;
    for (float amax : interesting_amaxes()) {
      const BlockScale s = mxfp8_block_scale(amax, f, MxScaleRule::OcpFloor);
      if (!std::isfinite(amax)) {
        EXPECT_EQ(s.code, 0xFF) << amax;  // a block with inf or NaN has a NaN scale
        EXPECT_TRUE(std::isnan(s.decode));
        continue;
      }
      // floor(log2(amax)) from CUDA's round-toward-zero E8M0 (zero and tiny values: -127).
      const int floor_log2 = static_cast<int>(oracle::cuda_e8m0(amax, false, true)) - 127;
      const int shared = std::max(floor_log2 - emax, -127);
      ASSERT_EQ(s.code, shared + 127) << amax;
      EXPECT_EQ(s.encode, std::ldexp(1.0f, -shared)) << amax;
      EXPECT_EQ(s.decode, std::ldexp(1.0f, shared)) << amax;
      EXPECT_EQ(s.at_min, floor_log2 - emax < -127 && amax > 0) << amax;
      if (amax > 0) {
        EXPECT_LT(amax * s.encode, std::ldexp(1.0f, emax + 1)) << amax;
      }
    }
  }
}

TEST(Nvfp4Scale, TensorAndBlockScalesAreTransformerEnginesRules) {
  for (float tensor_amax : interesting_amaxes()) {
    const float s_enc = nvfp4_tensor_scale(tensor_amax);
    const float q = std::fmin(448.0f * 6.0f / tensor_amax, FLT_MAX);
    const float want = (tensor_amax == 0.0f || q == 0.0f) ? 1.0f : q;
    ASSERT_EQ(bits_of(s_enc), bits_of(want)) << tensor_amax;
    if (!std::isfinite(tensor_amax)) continue;
    for (float frac : {1.0f, 0.5f, 0.1f, 1e-3f, 1e-6f, 1e-9f, 0.0f}) {
      const float amax = tensor_amax * frac;
      const BlockScale s = nvfp4_block_scale(amax, s_enc);
      const uint8_t code = oracle::cuda_encode(amax * (s_enc * (1.0f / 6.0f)), Format::E4M3, true);
      ASSERT_EQ(s.code, code) << amax << " in " << tensor_amax;
      const float block = oracle::cuda_decode(code, Format::E4M3);
      const float s_dec = static_cast<float>(1.0 / static_cast<double>(s_enc));
      EXPECT_EQ(s.encode, std::fmin(1.0f / (block * s_dec), FLT_MAX));
      EXPECT_EQ(s.decode, block * s_dec);
      EXPECT_EQ(s.at_min, block == 0.0f && amax > 0.0f);
    }
  }
}

TEST(Float8BlockScale, IsTransformerEnginesComputeScaleFromAmax) {
  int saturated = 0;
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (bool pow2 : {true, false}) {
      for (float epsilon : {0.0f, 1e-3f}) {
        for (float amax : interesting_amaxes()) {
          if (amax != amax || amax < 0) continue;  // block amaxes are taken by fmaxf from 0
          const BlockScale s = float8_block_scale(amax, f, pow2, epsilon);
          const auto want = oracle::float8_block_reference(amax, f, pow2, epsilon);
          ASSERT_EQ(bits_of(s.encode), bits_of(want.scale)) << amax << " pow2 " << pow2 << " eps " << epsilon;
          EXPECT_EQ(bits_of(s.decode), bits_of(want.scale_inv)) << amax;
          EXPECT_EQ(s.code, want.code) << amax;
          EXPECT_EQ(s.saturated, want.saturated) << amax;
          saturated += s.saturated;
          if (pow2) {
            EXPECT_EQ(s.encode * s.decode, 1.0f) << amax;  // powers of two: exact inverses
          }
        }
      }
    }
  }
  EXPECT_GT(saturated, 0);  // tiny amaxes reached FLT_MAX
}

}  // namespace
}  // namespace fp8
}  // namespace sentinel
