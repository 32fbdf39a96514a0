// The CUDA kernels' host-side logic, run on the CPU: the same accumulators folded thread by
// thread, warp by warp and block by block into a DeviceSlot as the kernel does (with plain
// arithmetic instead of atomics), then decoded. The oracle is the CPU statistics pass and probe.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "cuda/slot_merge.h"
#include "fp8/fp8_probe.h"
#include "stats/tensor_stats.h"
#include "support/expect_stats.h"

namespace {

using sentinel::cuda::DeviceSlot;
using sentinel::fp8::Format;
namespace stats = sentinel::stats;
using sentinel_test::expect_same_stats;

// The kernel's scheme on the host: `threads` threads read the elements grid-stride, groups of
// 32 combine (a warp), and each group's result is merged into the slot.
DeviceSlot simulate(const std::vector<float>& values, float min_normal, const stats::Fp8ProbeParams* probe,
                    int threads) {
  DeviceSlot slot;
  std::memset(&slot, 0, sizeof slot);  // what the launcher's memset leaves
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<stats::AbsStatsAccumulator<float>> acc(threads, stats::AbsStatsAccumulator<float>(inf));
  std::vector<stats::Fp8ProbeAccumulator<double>> pro(threads);
  for (size_t i = 0; i < values.size(); ++i) {
    acc[i % threads].reduce(values[i], inf, min_normal);
    if (probe) pro[i % threads].reduce(values[i], *probe);
  }
  for (int w = 0; w < threads; w += 32) {
    for (int t = w + 1; t < std::min(threads, w + 32); ++t) {
      acc[w].combine(acc[t]);
      pro[w].combine(pro[t]);
    }
    sentinel::cuda::merge_stats<sentinel::cuda::PlainSlotOps>(slot, acc[w]);
    if (probe) sentinel::cuda::merge_probe<sentinel::cuda::PlainSlotOps>(slot, pro[w]);
  }
  slot.count = values.size();
  return slot;
}

std::vector<float> as_floats(const torch::Tensor& t) {
  auto f = t.to(torch::kFloat).contiguous();
  return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
}

struct SlotCase {
  torch::Dtype dtype;
  float min_normal;
};

class CudaSlotLogic : public ::testing::TestWithParam<SlotCase> {};

TEST_P(CudaSlotLogic, SlotDecodesToTheCpuStatistics) {
  const auto c = GetParam();
  torch::manual_seed(11);
  auto base = torch::randn({5000}) * torch::pow(10.0, torch::randint(-9, 6, {5000}).to(torch::kFloat));
  base[7] = 0.0f;
  base[8] = -0.0f;
  base[9] = std::numeric_limits<float>::infinity();
  base[10] = -std::numeric_limits<float>::infinity();
  base[11] = std::nanf("");
  base[12] = 1e-40f;  // float subnormal
  const auto t = base.to(c.dtype);
  for (int threads : {1, 33, 256}) {
    sentinel::TensorStats want;
    stats::compute(t, want);
    expect_same_stats(sentinel::cuda::decode_stats(simulate(as_floats(t), c.min_normal, nullptr, threads)), want);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaSlotLogic,
                         ::testing::Values(SlotCase{torch::kFloat, 1.17549435e-38f},
                                           SlotCase{torch::kHalf, 6.103515625e-05f},
                                           SlotCase{torch::kBFloat16, 1.17549435e-38f}));

TEST(CudaSlotLogic, EmptyAndAllNanSlotsDecodeAsTheCpuPassReportsThem) {
  for (const auto& t : {torch::full({3}, std::nanf("")), torch::ones({0})}) {
    sentinel::TensorStats want;
    stats::compute(t, want);
    auto got = sentinel::cuda::decode_stats(simulate(as_floats(t), 1.17549435e-38f, nullptr, 64));
    if (t.numel() == 0) {
      EXPECT_EQ(got.count, 0);
      EXPECT_EQ(got.abs_min, std::numeric_limits<double>::infinity());
      EXPECT_EQ(got.abs_max, 0.0);
    } else {
      expect_same_stats(got, want);
    }
  }
}

TEST(CudaSlotLogic, ProbeSlotDecodesToTheCpuProbe) {
  torch::manual_seed(12);
  auto t = torch::randn({9000}) * torch::pow(10.0, torch::randint(-7, 4, {9000}).to(torch::kFloat));
  for (Format f : {Format::E4M3, Format::E5M2}) {
    for (float scale : {1.0f, 448.0f / 30.0f}) {
      const auto params = stats::make_fp8_probe_params(scale, f);
      sentinel::TensorStats s;
      stats::Fp8ProbeResult want;
      ASSERT_TRUE(stats::compute_with_fp8_probe(t, scale, f, s, want));
      const auto got = sentinel::cuda::decode_probe(simulate(as_floats(t), 1.17549435e-38f, &params, 256), scale);
      EXPECT_EQ(got.count, want.count);
      EXPECT_EQ(got.overflow, want.overflow);
      EXPECT_EQ(got.underflow, want.underflow);
      EXPECT_GT(want.overflow + want.underflow, 0);
      EXPECT_NEAR(got.mse(), want.mse(), 1e-5 * want.mse());
      EXPECT_NEAR(got.cosine(), want.cosine(), 1e-7);
      EXPECT_NEAR(got.sqnr_db(), want.sqnr_db(), 1e-4);
    }
  }
}

}  // namespace
