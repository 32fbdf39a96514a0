// The FP8 probe against an independent oracle: fp8::encode/decode (bit-exact with CUDA's casts
// on all 2^32 floats) and float64 sums written out here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/fp8.h>

#include <cmath>

#include "stats/fp8_probe.h"
#include "stats/tensor_stats.h"

namespace {

using sentinel::fp8::Format;
using sentinel::stats::Fp8ProbeResult;

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
  for (const auto& view : {t, t.t(), t.slice(1, 0, 515, 3)}) {
    sentinel::TensorStats stats, plain;
    Fp8ProbeResult probe;
    ASSERT_TRUE(sentinel::stats::compute_with_fp8_probe(view, c.scale, c.format, stats, probe));
    sentinel::stats::compute(view, plain);
    EXPECT_EQ(stats.count, plain.count);
    EXPECT_EQ(stats.nan, plain.nan);
    EXPECT_EQ(stats.pos_inf, plain.pos_inf);
    EXPECT_EQ(stats.zeros, plain.zeros);
    EXPECT_EQ(stats.subnormal, plain.subnormal);
    EXPECT_EQ(stats.abs_max, plain.abs_max);
    const Oracle o = oracle(view, c.scale, c.format);
    EXPECT_EQ(probe.count, o.count);
    EXPECT_EQ(probe.overflow, o.overflow);
    EXPECT_EQ(probe.underflow, o.underflow);
    EXPECT_GT(o.overflow + o.underflow, 0);  // the case exercises both
    EXPECT_NEAR(probe.mse(), o.se / o.count, 1e-4 * o.se / o.count);
    EXPECT_NEAR(probe.cosine(), o.xq / std::sqrt(o.xx * o.qq), 1e-6);
    EXPECT_NEAR(probe.sqnr_db(), 10 * std::log10(o.xx / o.se), 1e-3);
  }
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
}

}  // namespace
