// The FP8 probe against an independent oracle: fp8::encode/decode (bit-exact with CUDA's casts
// on all 2^32 floats) and float64 sums written out here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/fp8.h>

#include <cmath>
#include <iostream>

#include <sentinel/errors.h>

#include "fp8/fp8_probe.h"
#include "fp8/fp8_probe_math.h"
#include "support/expect_stats.h"
#include "stats/tensor_stats.h"
#include "support/simd_levels.h"

namespace {

using sentinel::fp8::Format;
using sentinel::stats::Fp8ProbeResult;
using sentinel_test::at_every_simd_level;
using sentinel_test::ForcedSimdLevel;
using sentinel_test::runnable_simd_levels;

struct Oracle {
  int64_t count = 0, overflow = 0, underflow = 0;
  double se = 0, xq = 0, xx = 0, qq = 0;
};

Oracle oracle(const torch::Tensor& t, float scale, Format f) {
  Oracle o;
  auto flat = t.to(torch::kFloat).contiguous().view({-1});
  const float* p = flat.data_ptr<float>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    const float x = p[i];
    if (!std::isfinite(x)) continue;
    const float v = x * scale;  // in float32, as the cast sees it
    const float q = sentinel::fp8::decode(sentinel::fp8::encode(v, f, /*saturate=*/true), f);
    // The non-saturating cast says what overflows: it gives NaN (E4M3) or inf (E5M2) there.
    const bool over = !std::isfinite(sentinel::fp8::decode(sentinel::fp8::encode(v, f, false), f));
    const double qx = static_cast<double>(q * (1.0f / scale));
    ++o.count;
    o.overflow += over;
    o.underflow += (x != 0 && q == 0);
    o.se += (x - qx) * (x - qx);
    o.xq += x * qx;
    o.xx += double(x) * x;
    o.qq += qx * qx;
  }
  return o;
}

// Probes `t` and checks everything against the oracle; returns the oracle for further checks.
Oracle expect_matches_oracle(const torch::Tensor& t, float scale, Format format) {
  sentinel::TensorStats stats, plain;
  Fp8ProbeResult probe;
  EXPECT_TRUE(sentinel::stats::compute_with_fp8_probe(t, scale, format, stats, probe));
  sentinel::stats::compute(t, plain);
  sentinel_test::expect_same_stats(stats, plain);
  const Oracle o = oracle(t, scale, format);
  EXPECT_EQ(probe.count, o.count);
  EXPECT_EQ(probe.overflow, o.overflow);
  EXPECT_EQ(probe.underflow, o.underflow);
  EXPECT_NEAR(probe.mse(), o.se / o.count, 1e-4 * o.se / o.count);
  if (o.qq > 0) EXPECT_NEAR(probe.cosine(), o.xq / std::sqrt(o.xx * o.qq), 1e-6);
  else EXPECT_EQ(probe.cosine(), 0.0);  // everything flushed: nothing in common with x
  EXPECT_NEAR(probe.sqnr_db(), 10 * std::log10(o.xx / o.se), 1e-3);
  // The probe alone (a tensor whose statistics are known) finds the same.
  Fp8ProbeResult alone;
  EXPECT_TRUE(sentinel::stats::compute_fp8_probe(t, scale, format, alone));
  EXPECT_EQ(alone.count, o.count);
  EXPECT_EQ(alone.overflow, o.overflow);
  EXPECT_EQ(alone.underflow, o.underflow);
  EXPECT_NEAR(alone.mse(), o.se / o.count, 1e-4 * o.se / o.count);
  if (o.qq > 0) EXPECT_NEAR(alone.cosine(), o.xq / std::sqrt(o.xx * o.qq), 1e-6);
  else EXPECT_EQ(alone.cosine(), 0.0);
  EXPECT_NEAR(alone.sqnr_db(), 10 * std::log10(o.xx / o.se), 1e-3);
  return o;
}

TEST(Fp8Probe, ScalarCastMatchesTheBitExactCastOnADenseSweep) {
  int64_t mismatches = 0, checked = 0;
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (uint32_t bits = 0x2F800000u; bits < 0x4A000000u; bits += 97) {  // 2^-32 .. 2^21, dense
      float x;
      std::memcpy(&x, &bits, sizeof x);
      for (float sign : {1.0f, -1.0f}) {
        bool over = false;
        const float got = sentinel::stats::fp8_quantize_dequantize(sign * x, 1.0f, f, over);
        const float want = sentinel::fp8::decode(sentinel::fp8::encode(sign * x, f, true), f);
        const bool want_over = !std::isfinite(sentinel::fp8::decode(sentinel::fp8::encode(sign * x, f, false), f));
        ++checked;
        if (std::memcmp(&got, &want, sizeof got) != 0 || over != want_over) {
          if (++mismatches < 5) ADD_FAILURE() << sentinel::fp8::format_name(f) << " x=" << sign * x << " got " << got << " want " << want;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
}

struct ProbeCase {
  torch::ScalarType dtype;
  Format format;
  float scale;
};

class Fp8ProbeOracle : public ::testing::TestWithParam<ProbeCase> {};

TEST_P(Fp8ProbeOracle, CountsExactAndErrorsMatchFloat64) {
  const auto& c = GetParam();
  torch::manual_seed(3);
  // Values over many binades, with zeros, tiny values that flush, huge ones that overflow, and
  // non-finite values the probe must leave to the statistics.
  auto base = torch::randn({37, 515}) * torch::pow(10.0, torch::randint(-8, 6, {37, 515}).to(torch::kFloat));
  base[0][0] = 0.0f;
  base[1][1] = std::numeric_limits<float>::infinity();
  base[2][2] = std::nanf("");
  base[3][3] = 1e30f;
  auto t = base.to(c.dtype);
  at_every_simd_level([&] {
    for (const auto& view : {t, t.t(), t.slice(1, 0, 515, 3)}) {
      const Oracle o = expect_matches_oracle(view, c.scale, c.format);
      EXPECT_GT(o.overflow + o.underflow, 0);  // the case exercises both
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    DtypesFormatsScales, Fp8ProbeOracle,
    ::testing::Values(ProbeCase{torch::kFloat, Format::E4M3, 1.0f}, ProbeCase{torch::kFloat, Format::E4M3, 448.0f / 3.0f},
                      ProbeCase{torch::kFloat, Format::E5M2, 0.25f}, ProbeCase{torch::kBFloat16, Format::E4M3, 2.0f},
                      ProbeCase{torch::kHalf, Format::E5M2, 1.0f}, ProbeCase{torch::kDouble, Format::E4M3, 16.0f}));

TEST(Fp8Probe, TensorsTheStatisticsCannotReadAreNotProbed) {
  sentinel::TensorStats s;
  Fp8ProbeResult p;
  EXPECT_FALSE(sentinel::stats::compute_with_fp8_probe(torch::tensor({1, 2}), 1.0f, Format::E4M3, s, p));
  EXPECT_FALSE(sentinel::stats::compute_with_fp8_probe(torch::ones({0}), 1.0f, Format::E4M3, s, p));
  EXPECT_EQ(p.count, 0);
  EXPECT_FALSE(sentinel::stats::compute_fp8_probe(torch::tensor({1, 2}), 1.0f, Format::E4M3, p));
  EXPECT_FALSE(sentinel::stats::compute_fp8_probe(torch::ones({0}), 1.0f, Format::E4M3, p));
  EXPECT_FALSE(sentinel::stats::compute_fp8_probe(torch::ones({2}, torch::kMeta), 1.0f, Format::E4M3, p));
  EXPECT_EQ(p.count, 0);
}

// Overflow and underflow are counted by comparing |x| with two thresholds found once per
// (scale, format): each must sit exactly on the cast's boundary, for scales that are not powers
// of two (where x * scale rounds in float before the cast does).
TEST(Fp8Probe, ThresholdsSitExactlyOnTheCastsBoundaries) {
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (float scale : {1.0f, 448.0f / 3.0f, 0.7f, 1.0f / 3.0f, 57344.0f / 1e-3f, 3e-30f}) {
      const auto p = sentinel::stats::make_fp8_probe_params(scale, f);
      auto cast = [&](float x, bool saturate) {
        return sentinel::fp8::decode(sentinel::fp8::encode(x * scale, f, saturate), f);
      };
      const float above = p.overflow_above, below = p.underflow_below;
      EXPECT_TRUE(std::isfinite(cast(above, false))) << scale;
      if (above < std::numeric_limits<float>::max()) {
        EXPECT_FALSE(std::isfinite(cast(std::nextafter(above, INFINITY), false))) << scale;
      }
      EXPECT_NE(cast(below, true), 0.0f) << scale;
      EXPECT_EQ(cast(std::nextafter(below, 0.0f), true), 0.0f) << scale;
    }
  }
}

// Chunks whose scaled squares leave float's range take the exact double path: values so large
// that their squares overflow float, and values so small that theirs underflow it.
TEST(Fp8Probe, HugeAndTinyChunksMatchTheOracle) {
  torch::manual_seed(5);
  auto base = torch::randn({3 * 4096 + 77});
  at_every_simd_level([&] {
    expect_matches_oracle(base * 1e25, 1.0f, Format::E4M3);
    expect_matches_oracle(base * 1e-20, 1.0f, Format::E5M2);
    expect_matches_oracle(base * 1e-20, 1e15f, Format::E4M3);  // scaled into range: the fast path
    const Oracle o = expect_matches_oracle(base.abs() + 500.0f, 1.0f, Format::E4M3);  // every element overflows
    EXPECT_EQ(o.overflow, o.count);
  });
}

// Every variant of the loops this CPU can run is forced by the tests above; the baseline always,
// and a level the CPU cannot run is refused rather than crashing.
TEST(SimdLevels, TheBaselineAndTheCpusBestLevelAreForcedAndOthersRefused) {
  using sentinel::stats::SimdLevel;
  const auto levels = runnable_simd_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), SimdLevel::Baseline);
  EXPECT_EQ(levels.back(), sentinel::stats::simd_level()) << "the default is the CPU's best";
  for (auto l : {SimdLevel::V3, SimdLevel::V4}) {
    if (sentinel::stats::cpu_supports(l)) continue;
    EXPECT_THROW(sentinel::stats::force_simd_level_for_testing(l), sentinel::InputError);
    std::cout << "[ info ] this CPU cannot run " << sentinel::stats::to_string(l) << " code: that variant is untested here\n";
  }
  {
    ForcedSimdLevel baseline(SimdLevel::Baseline);
    EXPECT_EQ(sentinel::stats::simd_level(), SimdLevel::Baseline);
  }
  EXPECT_EQ(sentinel::stats::simd_level(), levels.back());
}

}  // namespace
