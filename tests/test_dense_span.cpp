// The dense span a device reader takes for a strided tensor (src/device/dense_span.h): its verdict
// against LibTorch's own notion of dense memory, and an expanded view's statistics taken from the
// span and scaled, against the CPU pass over the view materialised by torch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "device/dense_span.h"
#include "fp8/fp8_probe.h"
#include "stats/tensor_stats.h"
#include "support/expect_stats.h"

namespace {

namespace device = sentinel::device;
namespace stats = sentinel::stats;

c10::optional<device::DenseSpan> span_of(const torch::Tensor& t) { return device::dense_span(t.sizes(), t.strides()); }

TEST(DenseSpan, WithoutExpandedDimensionsItIsLibTorchsDenseVerdict) {
  const auto base = torch::randn({4, 6, 5});
  const std::vector<torch::Tensor> views = {
      base,
      base.permute({2, 0, 1}),
      base.transpose(0, 1),
      base.select(1, 2),                       // gaps between rows
      base.slice(2, 0, 5, 2),                  // every other element
      base.narrow(0, 1, 2),                    // whole rows: dense
      base.unsqueeze(1),                       // a size-1 dimension
      torch::randn({3, 1, 4}).transpose(0, 2),  // size-1 dimension with any stride
  };
  for (const auto& v : views) {
    SCOPED_TRACE(::testing::PrintToString(v.sizes()) + " " + ::testing::PrintToString(v.strides()));
    const auto span = span_of(v);
    ASSERT_EQ(span.has_value(), v.is_non_overlapping_and_dense());
    if (span) {
      EXPECT_EQ(span->numel, v.numel());
      EXPECT_EQ(span->repeats, 1);
    }
  }
  const auto empty = span_of(torch::empty({3, 0, 2}));
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->numel, 0);
}

TEST(DenseSpan, AnExpandedViewIsItsDenseTensorRepeated) {
  const auto grad = torch::ones({}).expand({8});  // what SumBackward0 hands on
  auto span = span_of(grad);
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(span->numel, 1);
  EXPECT_EQ(span->repeats, 8);

  const auto rows = torch::randn({5, 1}).expand({5, 7}).t();  // expanded, then transposed
  span = span_of(rows);
  ASSERT_TRUE(span.has_value());
  EXPECT_EQ(span->numel, 5);
  EXPECT_EQ(span->repeats, 7);

  EXPECT_FALSE(span_of(torch::randn({4, 6}).select(1, 0).unsqueeze(1).expand({4, 3}).slice(0, 0, 4, 2)));
}

// The view's numbers, from the span: the CPU pass over the span's memory, scaled, against the
// CPU pass over the view as torch materialises it.
TEST(DenseSpan, ScaledSpanStatisticsEqualTheViewsOwn) {
  const float inf = std::numeric_limits<float>::infinity();
  auto base = torch::randn({3, 1, 5}) * 1e4;
  auto a = base.accessor<float, 3>();
  a[0][0][1] = inf;
  a[1][0][2] = -inf;
  a[2][0][3] = std::numeric_limits<float>::quiet_NaN();
  a[0][0][4] = 0.0f;
  a[1][0][0] = 1e-40f;  // float32 subnormal
  a[2][0][0] = 7e4f;    // above float16's range
  const auto view = base.expand({3, 4, 5}).permute({1, 2, 0});
  const auto span = span_of(view);
  ASSERT_TRUE(span.has_value());
  ASSERT_EQ(span->numel, 15);
  ASSERT_EQ(span->repeats, 4);
  const auto memory = torch::from_blob(view.data_ptr(), {span->numel});  // what the kernel reads

  device::SlotResult got;
  stats::compute(memory, got.stats);
  ASSERT_TRUE(stats::compute_headroom(memory, got.headroom));
  const float scale = 0.01f;
  ASSERT_TRUE(stats::compute_fp8_probe(memory, scale, sentinel::fp8::Format::E4M3, got.probe));
  device::scale_by_repeats(got, span->repeats);

  const auto materialised = view.contiguous();
  sentinel::TensorStats want;
  stats::compute(materialised, want);
  sentinel_test::expect_same_stats(got.stats, want);
  sentinel::HeadroomCounts h;
  ASSERT_TRUE(stats::compute_headroom(materialised, h));
  EXPECT_EQ(got.headroom.fp16_overflow, h.fp16_overflow);
  EXPECT_EQ(got.headroom.fp16_underflow, h.fp16_underflow);
  EXPECT_EQ(got.headroom.bf16_overflow, h.bf16_overflow);
  EXPECT_EQ(got.headroom.bf16_underflow, h.bf16_underflow);
  stats::Fp8ProbeResult p;
  ASSERT_TRUE(stats::compute_fp8_probe(materialised, scale, sentinel::fp8::Format::E4M3, p));
  EXPECT_EQ(got.probe.count, p.count);
  EXPECT_EQ(got.probe.overflow, p.overflow);
  EXPECT_EQ(got.probe.underflow, p.underflow);
  // The same terms, summed in another order: equal to rounding.
  EXPECT_NEAR(got.probe.sum_sq_error, p.sum_sq_error, 1e-12 * p.sum_sq_error);
  EXPECT_NEAR(got.probe.sum_x_q, p.sum_x_q, 1e-12 * std::abs(p.sum_x_q));
  EXPECT_NEAR(got.probe.sum_x_sq, p.sum_x_sq, 1e-12 * p.sum_x_sq);
  EXPECT_NEAR(got.probe.sum_q_sq, p.sum_q_sq, 1e-12 * p.sum_q_sq);
}

}  // namespace
