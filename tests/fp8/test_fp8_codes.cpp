// sentinel::fp8 casts against the format definitions alone (no CUDA needed):
// known codes, the special cases, and a float64 nearest-value oracle that
// rounds by searching the table of all FP8 values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "sentinel/fp8.h"

namespace sentinel {
namespace fp8 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

static_assert(max_value(Format::E4M3) == 448.0f, "E4M3 max");
static_assert(max_value(Format::E5M2) == 57344.0f, "E5M2 max");

TEST(Fp8Constants, MatchFormatDefinitions) {
  EXPECT_EQ(min_subnormal(Format::E4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(min_subnormal(Format::E5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(min_normal(Format::E4M3), std::ldexp(1.0f, -6));
  EXPECT_EQ(min_normal(Format::E5M2), std::ldexp(1.0f, -14));
  EXPECT_EQ(max_value(Format::E4M3), 1.75f * 256.0f);
  EXPECT_EQ(max_value(Format::E5M2), 1.75f * 32768.0f);
  EXPECT_STREQ(format_name(Format::E4M3), "E4M3");
  EXPECT_STREQ(format_name(Format::E5M2), "E5M2");
}

// Value of a code from the format definition, in float64.
double reference_decode(int code, Format f) {
  const int mant_bits = f == Format::E4M3 ? 3 : 2;
  const int exp_bits = f == Format::E4M3 ? 4 : 5;
  const int bias = f == Format::E4M3 ? 7 : 15;
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int exp = (code >> mant_bits) & ((1 << exp_bits) - 1);
  const int mant = code & ((1 << mant_bits) - 1);
  if (f == Format::E4M3 && (code & 0x7F) == 0x7F) return std::nan("");
  if (f == Format::E5M2 && exp == 31) return mant == 0 ? sign * HUGE_VAL : std::nan("");
  if (exp == 0) return sign * std::ldexp(mant, 1 - bias - mant_bits);
  return sign * std::ldexp(1.0 + std::ldexp(mant, -mant_bits), exp - bias);
}

TEST(Fp8Decode, AllCodesMatchDefinition) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (int c = 0; c < 256; ++c) {
      SCOPED_TRACE(testing::Message() << format_name(f) << " code " << c);
      const double expected = reference_decode(c, f);
      const float got = decode(static_cast<uint8_t>(c), f);
      if (std::isnan(expected)) {
        EXPECT_EQ(bits_of(got), 0x7FFFFFFFu);  // canonical NaN, like CUDA
      } else {
        EXPECT_EQ(static_cast<double>(got), expected);
        EXPECT_EQ(std::signbit(got), (c & 0x80) != 0);  // -0 included
      }
    }
  }
}

TEST(Fp8Encode, KnownCodes) {
  EXPECT_EQ(encode(1.0f, Format::E4M3, true), 0x38);
  EXPECT_EQ(encode(1.0f, Format::E5M2, true), 0x3C);
  EXPECT_EQ(encode(-2.0f, Format::E4M3, true), 0xC0);
  EXPECT_EQ(encode(448.0f, Format::E4M3, false), 0x7E);
  EXPECT_EQ(encode(57344.0f, Format::E5M2, false), 0x7B);
  EXPECT_EQ(encode(0.0f, Format::E4M3, true), 0x00);
  EXPECT_EQ(encode(-0.0f, Format::E4M3, true), 0x80);
  EXPECT_EQ(encode(-0.0f, Format::E5M2, true), 0x80);
  EXPECT_EQ(encode(min_subnormal(Format::E4M3), Format::E4M3, true), 0x01);
  EXPECT_EQ(encode(min_subnormal(Format::E5M2), Format::E5M2, true), 0x01);
  EXPECT_EQ(encode(min_normal(Format::E4M3), Format::E4M3, true), 0x08);
  EXPECT_EQ(encode(min_normal(Format::E5M2), Format::E5M2, true), 0x04);
}

TEST(Fp8Encode, RoundsToNearestEven) {
  const float s = min_subnormal(Format::E4M3);
  EXPECT_EQ(encode(0.5f * s, Format::E4M3, true), 0x00);   // tie -> even (0)
  EXPECT_EQ(encode(0.75f * s, Format::E4M3, true), 0x01);
  EXPECT_EQ(encode(1.5f * s, Format::E4M3, true), 0x02);   // tie -> even (2)
  EXPECT_EQ(encode(2.5f * s, Format::E4M3, true), 0x02);   // tie -> even (2)
  EXPECT_EQ(encode(7.5f * s, Format::E4M3, true), 0x08);   // carries into the min normal
  EXPECT_EQ(encode(1.0625f, Format::E4M3, true), 0x38);    // 1 + 1/16: tie -> 1.0
  EXPECT_EQ(encode(1.1875f, Format::E4M3, true), 0x3A);    // 1 + 3/16: tie -> 1.25
  EXPECT_EQ(encode(std::nextafter(1.0625f, 2.0f), Format::E4M3, true), 0x39);
  EXPECT_EQ(encode(1.125f, Format::E5M2, true), 0x3C);     // tie -> 1.0
  EXPECT_EQ(encode(1.375f, Format::E5M2, true), 0x3E);     // tie -> 1.5
  EXPECT_EQ(encode(1e-30f, Format::E5M2, true), 0x00);
  EXPECT_EQ(encode(-1e-30f, Format::E5M2, true), 0x80);    // sign survives underflow
  EXPECT_EQ(encode(std::numeric_limits<float>::denorm_min(), Format::E4M3, true), 0x00);
}

TEST(Fp8Encode, OverflowBoundary) {
  // E4M3: 464 = 448 + half an ulp; the tie goes to 448 (even mantissa 110).
  EXPECT_EQ(encode(464.0f, Format::E4M3, false), 0x7E);
  EXPECT_EQ(encode(464.0f, Format::E4M3, true), 0x7E);
  EXPECT_EQ(encode(std::nextafter(464.0f, kInf), Format::E4M3, false), 0x7F);
  EXPECT_EQ(encode(std::nextafter(464.0f, kInf), Format::E4M3, true), 0x7E);
  EXPECT_EQ(encode(-std::nextafter(464.0f, kInf), Format::E4M3, false), 0xFF);
  // E5M2: 61440 = 57344 + half an ulp; the tie goes to 65536, i.e. overflows.
  EXPECT_EQ(encode(std::nextafter(61440.0f, 0.0f), Format::E5M2, false), 0x7B);
  EXPECT_EQ(encode(61440.0f, Format::E5M2, false), 0x7C);
  EXPECT_EQ(encode(61440.0f, Format::E5M2, true), 0x7B);
  EXPECT_EQ(encode(-61440.0f, Format::E5M2, false), 0xFC);
}

TEST(Fp8Encode, InfinityAndNaN) {
  EXPECT_EQ(encode(kInf, Format::E4M3, true), 0x7E);    // saturates like any overflow
  EXPECT_EQ(encode(-kInf, Format::E4M3, true), 0xFE);
  EXPECT_EQ(encode(kInf, Format::E5M2, true), 0x7B);
  EXPECT_EQ(encode(-kInf, Format::E5M2, true), 0xFB);
  EXPECT_EQ(encode(kInf, Format::E4M3, false), 0x7F);   // no inf in E4M3: NaN
  EXPECT_EQ(encode(-kInf, Format::E4M3, false), 0xFF);
  EXPECT_EQ(encode(kInf, Format::E5M2, false), 0x7C);
  EXPECT_EQ(encode(-kInf, Format::E5M2, false), 0xFC);
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (bool sat : {true, false}) {
      EXPECT_EQ(encode(kNaN, f, sat), 0x7F);
      EXPECT_EQ(encode(-kNaN, f, sat), 0x7F);  // the sign of a NaN is dropped
    }
  }
  EXPECT_TRUE(std::isnan(decode(0x7F, Format::E4M3)));
  EXPECT_TRUE(std::isnan(decode(0xFF, Format::E4M3)));
  EXPECT_TRUE(std::isnan(decode(0x7D, Format::E5M2)));
  EXPECT_EQ(decode(0x7C, Format::E5M2), kInf);
  EXPECT_EQ(decode(0xFC, Format::E5M2), -kInf);
}

TEST(Fp8Encode, RoundTripIsIdentityOnCodes) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (int c = 0; c < 256; ++c) {
      const float v = decode(static_cast<uint8_t>(c), f);
      if (std::isnan(v)) continue;
      EXPECT_EQ(encode(v, f, false), c) << format_name(f) << " code " << c;
    }
  }
}

// Nearest FP8 value by search over the table of all finite values, ties to
// the even code. One entry above max stands for "overflow" so that the
// tie at max + half ulp is decided by the same rule.
uint8_t reference_encode(float x, Format f, bool saturate) {
  const uint8_t max_code = f == Format::E4M3 ? 0x7E : 0x7B;
  std::vector<double> values;
  for (int c = 0; c <= max_code + 1; ++c) {
    values.push_back(c <= max_code ? reference_decode(c, f)
                                   : 2 * reference_decode(max_code, f) -
                                         reference_decode(max_code - 1, f));
  }
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  std::size_t code = values.size();  // past the end: overflow
  if (a <= values.back()) {
    const std::size_t hi =
        static_cast<std::size_t>(std::lower_bound(values.begin(), values.end(), a) - values.begin());
    if (values[hi] == a || hi == 0) {
      code = hi;
    } else {
      const double dlo = a - values[hi - 1];
      const double dhi = values[hi] - a;
      code = dlo < dhi ? hi - 1 : dhi < dlo ? hi : ((hi - 1) % 2 == 0 ? hi - 1 : hi);
    }
  }
  if (code > max_code) {
    const uint8_t overflow = saturate ? max_code : (f == Format::E4M3 ? 0x7F : 0x7C);
    return static_cast<uint8_t>(sign | overflow);
  }
  return static_cast<uint8_t>(sign | code);
}

TEST(Fp8Encode, MatchesNearestValueSearch) {
  std::mt19937 rng(7u);
  // Log-uniform magnitudes from 2^-20 to 2^18 cover every FP8 binade of both
  // formats plus underflow and overflow.
  std::uniform_real_distribution<double> log2_mag(-20.0, 18.0);
  int mismatches = 0;
  for (int i = 0; i < 100000; ++i) {
    float x = static_cast<float>(std::exp2(log2_mag(rng)));
    if (i % 2) x = -x;
    for (Format f : {Format::E4M3, Format::E5M2}) {
      for (bool sat : {true, false}) {
        const uint8_t ours = encode(x, f, sat);
        const uint8_t ref = reference_encode(x, f, sat);
        if (ours != ref && ++mismatches <= 8) {
          ADD_FAILURE() << format_name(f) << (sat ? " sat" : " nosat") << " x=" << x
                        << " ours=" << int(ours) << " ref=" << int(ref);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Fp8Encode, MatchesNearestValueSearchAtMidpoints) {
  int mismatches = 0;
  for (Format f : {Format::E4M3, Format::E5M2}) {
    const int max_code = f == Format::E4M3 ? 0x7E : 0x7B;
    for (int c = 0; c <= max_code; ++c) {
      const double lo = reference_decode(c, f);
      const double hi = c < max_code ? reference_decode(c + 1, f)
                                     : 2 * lo - reference_decode(c - 1, f);
      const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf), -mid}) {
        for (bool sat : {true, false}) {
          if (encode(x, f, sat) != reference_encode(x, f, sat) && ++mismatches <= 8) {
            ADD_FAILURE() << format_name(f) << " x=" << x;
          }
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace fp8
}  // namespace sentinel
