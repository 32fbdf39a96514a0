// The FP8 probe's rounding on a GPU of compute capability 8.9 or more (cuda/fp8_pair_round.h: the
// hardware's conversions to FP8 and back) against its arithmetic everywhere else
// (fp8_round_scaled, then fp8_saturate): CUDA's host emulation of the same conversions, the
// reference the instructions follow, stands in for them here. Equal values, both formats, on
// every float16 and bfloat16 magnitude at scales across the formats' range, and on every FP8
// value's neighbourhood: the value, the midpoints to its neighbours (ties to even), and the
// floats either side of each.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda/fp8_pair_round.h"
#include "cuda_fp8_oracle.h"
#include "fp8/fp8_probe_math.h"

namespace sentinel {
namespace {

using Kind = stats::Fp8ProbeParams::Fp8Kind;

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Every positive finite float16 and bfloat16 value, as float.
std::vector<float> half_magnitudes() {
  std::vector<float> out;
  for (uint32_t h = 1; h < 0x7c00u; ++h) {  // float16: exponent 31 is inf and NaN
    __half_raw raw;
    raw.x = static_cast<unsigned short>(h);
    out.push_back(__half2float(__half(raw)));
  }
  for (uint32_t b = 1; b < 0x7f80u; ++b) out.push_back(from_bits(b << 16));  // bfloat16
  return out;
}

// Each finite FP8 value, the midpoints to its neighbours, and the floats either side of both.
std::vector<float> grid_neighbourhoods(fp8::Format f) {
  std::vector<float> values;
  for (int code = 0; code < 0x80; ++code) {
    const float v = fp8::oracle::cuda_decode(static_cast<uint8_t>(code), f);
    if (std::isfinite(v)) values.push_back(v);
  }
  std::vector<float> out;
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < values.size(); ++i) {
    const float next = i + 1 < values.size() ? values[i + 1] : values[i] * 2;  // past the max: saturates
    for (float x : {values[i], (values[i] + next) / 2}) {
      out.push_back(x);
      out.push_back(std::nextafter(x, inf));
      if (x > 0) out.push_back(std::nextafter(x, 0.0f));
    }
  }
  out.push_back(std::numeric_limits<float>::max());
  return out;
}

void expect_equal_rounding(const std::vector<float>& magnitudes, float scale, fp8::Format f) {
  const stats::Fp8ProbeParams p = stats::make_fp8_probe_params(scale, f);
  ASSERT_EQ(p.fp8_kind, f == fp8::Format::E4M3 ? Kind::kE4M3 : Kind::kE5M2);
  int64_t mismatches = 0, compared = 0;
  for (size_t i = 0; i + 1 < magnitudes.size(); i += 2) {
    const float a0 = stats::rounded_product(magnitudes[i], scale);
    const float a1 = stats::rounded_product(magnitudes[i + 1], scale);
    if (!std::isfinite(a0) || !std::isfinite(a1)) continue;  // the fast path takes finite products only
    compared += 2;
    float q0 = 0, q1 = 0;
    cuda::fp8_pair_round(a0, a1, p.fp8_kind, q0, q1);
    const float want0 = stats::fp8_saturate(stats::fp8_round_scaled(a0, p), p.max);
    const float want1 = stats::fp8_saturate(stats::fp8_round_scaled(a1, p), p.max);
    if (q0 != want0 || q1 != want1) {
      if (++mismatches <= 5) {
        ADD_FAILURE() << "a " << a0 << ", " << a1 << ": converted " << q0 << ", " << q1 << ", the probe's arithmetic "
                      << want0 << ", " << want1;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(compared, static_cast<int64_t>(magnitudes.size()) / 2) << "too few finite products: the test proves little";
}

TEST(Fp8PairRound, TheConversionsEqualTheProbesArithmeticOnEveryHalfMagnitude) {
  const auto magnitudes = half_magnitudes();
  for (fp8::Format f : {fp8::Format::E4M3, fp8::Format::E5M2}) {
    for (float scale : {1.0f, 448.0f / 3.0f, 0.37f, 0x1p40f, 0x1p-40f}) {
      SCOPED_TRACE((f == fp8::Format::E4M3 ? "e4m3, scale " : "e5m2, scale ") + std::to_string(scale));
      expect_equal_rounding(magnitudes, scale, f);
    }
  }
}

TEST(Fp8PairRound, TheConversionsEqualTheProbesArithmeticAroundEveryFp8Value) {
  for (fp8::Format f : {fp8::Format::E4M3, fp8::Format::E5M2}) {
    SCOPED_TRACE(f == fp8::Format::E4M3 ? "e4m3" : "e5m2");
    const auto around = grid_neighbourhoods(f);
    ASSERT_GT(around.size(), 600u);
    expect_equal_rounding(around, 1.0f, f);
    // Shifted by one element, so that every value is also the pair's second.
    expect_equal_rounding(std::vector<float>(around.begin() + 1, around.end()), 1.0f, f);
  }
}

}  // namespace
}  // namespace sentinel
