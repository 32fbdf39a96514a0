// The statistics menu (min, max, mean, std, norms, amax, dynamic range) from the one read of the
// statistics pass, against a float64 reference computed here with long double sums, for every
// dtype and layout, at every SIMD level of the pass; and from the FP8 probe's fused read.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/options.h>

#include <cmath>
#include <limits>

#include "collect/stats_collector.h"
#include "fp8/fp8_probe.h"
#include "stats/tensor_stats.h"
#include "support/simd_levels.h"

namespace {

using sentinel::Stat;
using sentinel::stats::MomentsAccumulator;

struct Reference {
  double min, max, mean, std, l1, l2, amax, dynamic_range;
};

// Straight from the definitions, on the float64 values of the tensor (torch's widening cast).
Reference reference(const torch::Tensor& t) {
  auto d = t.to(torch::kDouble).contiguous().reshape({-1});
  const double* p = d.data_ptr<double>();
  const int64_t n = d.numel();
  long double sum = 0, l1 = 0, l2 = 0;
  double mn = INFINITY, mx = -INFINITY, amax = 0, min_nonzero = INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    sum += p[i];
    l1 += std::fabs(p[i]);
    l2 += static_cast<long double>(p[i]) * p[i];
    mn = std::min(mn, p[i]);
    mx = std::max(mx, p[i]);
    amax = std::max(amax, std::fabs(p[i]));
    if (p[i] != 0) min_nonzero = std::min(min_nonzero, std::fabs(p[i]));
  }
  const long double mean = sum / n;
  long double m2 = 0;
  for (int64_t i = 0; i < n; ++i) m2 += (p[i] - mean) * (p[i] - mean);
  Reference r;
  r.min = mn;
  r.max = mx;
  r.mean = static_cast<double>(mean);
  r.std = n > 1 ? std::sqrt(static_cast<double>(m2 / (n - 1))) : NAN;
  r.l1 = static_cast<double>(l1);
  r.l2 = std::sqrt(static_cast<double>(l2));
  r.amax = amax;
  r.dynamic_range = std::isinf(min_nonzero) ? 0.0 : std::log2(amax / min_nonzero);
  return r;
}

void expect_close(double got, double want, const char* what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what;
    return;
  }
  EXPECT_NEAR(got, want, 1e-9 * std::max(1.0, std::fabs(want))) << what;
}

void expect_menu(const MomentsAccumulator& m, const torch::Tensor& t) {
  const Reference r = reference(t);
  ASSERT_EQ(m.n, t.numel());
  using sentinel::collect::stat_value;
  EXPECT_EQ(stat_value(Stat::Min, m), r.min);  // extremes are exact: no arithmetic
  EXPECT_EQ(stat_value(Stat::Max, m), r.max);
  EXPECT_EQ(stat_value(Stat::CurAmax, m), r.amax);
  expect_close(stat_value(Stat::Mean, m), r.mean, "mean");
  expect_close(stat_value(Stat::Std, m), r.std, "std");
  expect_close(stat_value(Stat::L1Norm, m), r.l1, "l1_norm");
  expect_close(stat_value(Stat::L2Norm, m), r.l2, "l2_norm");
  expect_close(stat_value(Stat::DynamicRange, m), r.dynamic_range, "dynamic_range");
}

// Values with a large common offset (a mean far above the spread: the case where
// sum(x^2) - n mean^2 loses every digit), zeros, subnormals and both signs.
torch::Tensor awkward(int64_t n, torch::ScalarType dtype) {
  auto t = torch::randn({n}, torch::kDouble) * 3 + 1000;
  t.index_put_({torch::indexing::Slice(0, n, 7)}, 0.0);
  t.index_put_({torch::indexing::Slice(3, n, 11)}, -2.5e-3);
  return t.to(dtype);
}

TEST(StatsMenu, EqualsTheFloat64ReferenceForEveryDtypeAndLayout) {
  torch::manual_seed(0);
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    // Sizes around the 4096-element chunks and the vector widths; a strided view; a transpose.
    const std::vector<torch::Tensor> cases = {
        awkward(1, dtype), awkward(2, dtype), awkward(4095, dtype), awkward(4096, dtype), awkward(12289, dtype),
        awkward(20000, dtype).reshape({100, 200}).slice(1, 0, 200, 3),
        awkward(6000, dtype).reshape({60, 100}).t()};
    for (const auto& t : cases) {
      sentinel_test::at_every_simd_level([&] {
        sentinel::TensorStats s;
        MomentsAccumulator m;
        ASSERT_EQ(sentinel::stats::compute_with_moments(t, s, m), sentinel::stats::Readability::Read);
        expect_menu(m, t);
        sentinel::TensorStats plain;
        sentinel::stats::compute(t, plain);  // the statistics are those of the plain pass
        EXPECT_EQ(s.count, plain.count);
        EXPECT_EQ(s.zeros, plain.zeros);
        EXPECT_EQ(s.abs_max, plain.abs_max);
        EXPECT_EQ(s.abs_min, plain.abs_min);
      });
    }
  }
}

TEST(StatsMenu, TheFp8ProbesFusedReadGivesTheSameMenu) {
  torch::manual_seed(1);
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    for (const auto& t : {awkward(9000, dtype), awkward(9000, dtype).reshape({90, 100}).slice(1, 1, 100, 2)}) {
      sentinel_test::at_every_simd_level([&] {
        sentinel::TensorStats s;
        sentinel::stats::Fp8ProbeResult probe, probe_alone;
        MomentsAccumulator m;
        ASSERT_TRUE(sentinel::stats::compute_with_fp8_probe(t, 0.25f, sentinel::fp8::Format::E4M3, s, probe, nullptr, &m));
        expect_menu(m, t);
        sentinel::TensorStats s2;
        sentinel::stats::compute_with_fp8_probe(t, 0.25f, sentinel::fp8::Format::E4M3, s2, probe_alone);
        EXPECT_EQ(probe.overflow, probe_alone.overflow);  // the menu changes nothing of the probe
        EXPECT_EQ(probe.underflow, probe_alone.underflow);
        EXPECT_EQ(probe.sum_sq_error, probe_alone.sum_sq_error);
      });
    }
  }
}

TEST(StatsMenu, NonFiniteValuesPropagateAsTorchsReductionsDo) {
  auto t = torch::tensor({1.0f, -2.0f, INFINITY, 4.0f});
  sentinel::TensorStats s;
  MomentsAccumulator m;
  sentinel::stats::compute_with_moments(t, s, m);
  using sentinel::collect::stat_value;
  EXPECT_EQ(stat_value(Stat::Max, m), torch::max(t).item<double>());
  EXPECT_EQ(stat_value(Stat::Min, m), torch::min(t).item<double>());
  EXPECT_EQ(stat_value(Stat::Mean, m), torch::mean(t).item<double>());
  EXPECT_TRUE(std::isnan(stat_value(Stat::Std, m)));
  EXPECT_TRUE(std::isnan(torch::std(t).item<double>()));
  EXPECT_EQ(stat_value(Stat::CurAmax, m), INFINITY);

  auto with_nan = torch::tensor({1.0f, NAN, 3.0f});
  MomentsAccumulator mn;
  sentinel::stats::compute_with_moments(with_nan, s, mn);
  EXPECT_TRUE(std::isnan(stat_value(Stat::Min, mn)));  // torch.min propagates NaN
  EXPECT_TRUE(std::isnan(torch::min(with_nan).item<double>()));
  EXPECT_TRUE(std::isnan(stat_value(Stat::Mean, mn)));
  EXPECT_TRUE(std::isnan(stat_value(Stat::DynamicRange, mn)));
}

TEST(StatsMenu, SingleValuesZerosAndIntegers) {
  sentinel::TensorStats s;
  using sentinel::collect::stat_value;
  MomentsAccumulator one;
  sentinel::stats::compute_with_moments(torch::tensor({-3.0f}), s, one);
  EXPECT_EQ(stat_value(Stat::Mean, one), -3.0);
  EXPECT_TRUE(std::isnan(stat_value(Stat::Std, one)));  // n - 1 = 0, as torch.std
  EXPECT_EQ(stat_value(Stat::DynamicRange, one), 0.0);

  MomentsAccumulator zeros;
  sentinel::stats::compute_with_moments(torch::zeros({5}), s, zeros);
  EXPECT_EQ(stat_value(Stat::DynamicRange, zeros), 0.0);  // no non-zero element
  EXPECT_EQ(stat_value(Stat::L2Norm, zeros), 0.0);

  MomentsAccumulator ints;
  EXPECT_EQ(sentinel::stats::compute_with_moments(torch::arange(5), s, ints), sentinel::stats::Readability::Read);
  EXPECT_EQ(ints.n, 0);  // integers: statistics only
  EXPECT_EQ(s.count, 5);
}

}  // namespace
