// sentinel::fp8::encode/decode against CUDA's host-side conversions on a
// dense sweep: every FP8 value, every rounding midpoint +-1 ulp, every float
// binade from far below the subnormals to far above the max, specials and
// random bit patterns. The full 2^32 sweep is test_fp8_exhaustive.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_fp8_oracle.h"
#include "sentinel/fp8.h"

namespace sentinel {
namespace fp8 {
namespace {

using oracle::bits_of;
using oracle::CastMode;
using oracle::cuda_decode;
using oracle::cuda_encode;
using oracle::float_of;
using oracle::kAllModes;
using oracle::mode_name;

void add_with_neighbours(std::vector<uint32_t>& out, float x) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {x, std::nextafter(x, inf), std::nextafter(x, -inf)}) {
    out.push_back(bits_of(v));
    out.push_back(bits_of(-v));
  }
}

// Float bit patterns of the sweep, sorted, without duplicates.
std::vector<uint32_t> sweep_inputs() {
  std::vector<uint32_t> s;
  const float inf = std::numeric_limits<float>::infinity();

  // Specials: zeros, infinities, quiet and signalling NaNs of both signs,
  // float extremes.
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
                     0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FA00000u, 0x00000001u,
                     0x80000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0xFF7FFFFFu}) {
    s.push_back(b);
  }

  for (Format f : {Format::E4M3, Format::E5M2}) {
    // Every finite FP8 value, its float neighbours, and every midpoint
    // between adjacent values (exact in float) with its neighbours. The
    // midpoint above max is the rounding-to-max vs overflow boundary.
    const uint8_t max_code = encode(max_value(f), f, true);
    for (uint32_t c = 0; c <= max_code; ++c) {
      const float v = decode(static_cast<uint8_t>(c), f);
      const float next = c < max_code ? decode(static_cast<uint8_t>(c + 1), f)
                                      : 2.0f * max_value(f) - decode(static_cast<uint8_t>(c - 1), f);
      add_with_neighbours(s, v);
      add_with_neighbours(s, v + (next - v) / 2);
      add_with_neighbours(s, v + (next - v) / 4);
      add_with_neighbours(s, v + 3 * (next - v) / 4);
    }
    add_with_neighbours(s, min_subnormal(f) / 2);
    add_with_neighbours(s, min_subnormal(f) / 4);
    add_with_neighbours(s, 2 * max_value(f));
  }
  add_with_neighbours(s, inf);

  // Dense binade sweep from 2^-40 to 2^21: the top 10 mantissa bits take all
  // values (so every FP8 grid point and midpoint in the binade is hit) and
  // the low 13 bits take the patterns that straddle them.
  for (uint32_t exp_field = 127 - 40; exp_field <= 127 + 21; ++exp_field) {
    for (uint32_t prefix = 0; prefix < 1024; ++prefix) {
      for (uint32_t low : {0x0u, 0x1u, 0x2u, 0xFFFu, 0x1000u, 0x1001u, 0x1FFEu, 0x1FFFu}) {
        const uint32_t b = (exp_field << 23) | (prefix << 13) | low;
        s.push_back(b);
        s.push_back(b | 0x80000000u);
      }
    }
  }

  // Every float exponent, including float subnormals, huge values and NaNs.
  for (uint32_t exp_field = 0; exp_field < 256; ++exp_field) {
    for (uint32_t mant : {0x0u, 0x1u, 0x200000u, 0x400000u, 0x400001u, 0x7FFFFFu}) {
      s.push_back((exp_field << 23) | mant);
      s.push_back((exp_field << 23) | mant | 0x80000000u);
    }
  }

  // Random bit patterns, fixed seed.
  std::mt19937 rng(20240607u);
  for (int i = 0; i < (1 << 18); ++i) s.push_back(static_cast<uint32_t>(rng()));
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

const std::vector<uint32_t>& inputs() {
  static const std::vector<uint32_t> v = sweep_inputs();
  return v;
}

class CastVsCuda : public ::testing::TestWithParam<CastMode> {};

TEST_P(CastVsCuda, EncodeMatchesOnDenseSweep) {
  const CastMode m = GetParam();
  const std::vector<uint32_t>& in = inputs();
  ASSERT_GT(in.size(), 500000u);
  std::size_t mismatches = 0;
  for (uint32_t b : in) {
    const float x = float_of(b);
    const uint8_t ours = encode(x, m.format, m.saturate);
    const uint8_t cuda = cuda_encode(x, m.format, m.saturate);
    if (ours != cuda) {
      if (++mismatches <= 8) {
        std::printf("  %s: x=%.9g (0x%08x) ours=0x%02x cuda=0x%02x\n", mode_name(m),
                    static_cast<double>(x), b, ours, cuda);
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << mode_name(m) << " over " << in.size() << " inputs";
}

TEST_P(CastVsCuda, RoundTripMatches) {
  const CastMode m = GetParam();
  std::size_t mismatches = 0;
  for (uint32_t b : inputs()) {
    const float x = float_of(b);
    const float ours = round_trip(x, m.format, m.saturate);
    const float cuda = cuda_decode(cuda_encode(x, m.format, m.saturate), m.format);
    if (bits_of(ours) != bits_of(cuda)) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0u) << mode_name(m);
}

INSTANTIATE_TEST_SUITE_P(AllModes, CastVsCuda, ::testing::ValuesIn(kAllModes),
                         [](const ::testing::TestParamInfo<CastMode>& info) {
                           return std::string(mode_name(info.param));
                         });

TEST(DecodeVsCuda, AllCodesBothFormats) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    int mismatches = 0;
    for (int c = 0; c < 256; ++c) {
      const float ours = decode(static_cast<uint8_t>(c), f);
      const float cuda = cuda_decode(static_cast<uint8_t>(c), f);
      // NaN-ness must agree; beyond that the bits (canonical NaN included).
      const bool same = std::isnan(ours) == std::isnan(cuda) && bits_of(ours) == bits_of(cuda);
      if (!same && ++mismatches <= 8) {
        std::printf("  %s code 0x%02x: ours=%g (0x%08x) cuda=%g (0x%08x)\n", format_name(f), c,
                    static_cast<double>(ours), bits_of(ours), static_cast<double>(cuda),
                    bits_of(cuda));
      }
    }
    EXPECT_EQ(mismatches, 0) << format_name(f);
  }
}

// The CUDA behaviours the rest of the project relies on, spelled out so a
// change in a future CUDA release is caught by name.
TEST(CudaSpecialCases, NaNInfAndSignedZero) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const CastMode& m : kAllModes) {
    SCOPED_TRACE(mode_name(m));
    EXPECT_EQ(cuda_encode(nan, m.format, m.saturate), 0x7F);
    EXPECT_EQ(cuda_encode(-nan, m.format, m.saturate), 0x7F);  // sign of NaN dropped
    EXPECT_EQ(cuda_encode(-1e-30f, m.format, m.saturate), 0x80);
  }
  EXPECT_EQ(cuda_encode(inf, Format::E4M3, true), 0x7E);
  EXPECT_EQ(cuda_encode(-inf, Format::E4M3, true), 0xFE);
  EXPECT_EQ(cuda_encode(inf, Format::E5M2, true), 0x7B);
  EXPECT_EQ(cuda_encode(-inf, Format::E5M2, true), 0xFB);
  EXPECT_EQ(cuda_encode(-inf, Format::E4M3, false), 0xFF);  // negative NaN code
  EXPECT_EQ(cuda_encode(-inf, Format::E5M2, false), 0xFC);
  EXPECT_EQ(bits_of(cuda_decode(0xFF, Format::E4M3)), 0x7FFFFFFFu);
  EXPECT_EQ(bits_of(cuda_decode(0xFF, Format::E5M2)), 0x7FFFFFFFu);
}

}  // namespace
}  // namespace fp8
}  // namespace sentinel
