// The CUDA kernels' host-side logic, run on the CPU: the same accumulators folded thread by
// thread, warp by warp and block by block into a DeviceSlot as the kernel does (with plain
// arithmetic instead of atomics), then decoded. The oracle is the CPU statistics pass and probe.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "cuda/lane_scan.h"
#include "cuda/probe_lanes.h"
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

// The kernel's fast path on the host, as one thread runs it: each 16-byte vector folded as
// integer lanes when its magnitudes are all ordinary, else element by element through the
// accumulator; the elements past the last whole vector one by one. With `probe`, the FP8 probe
// too, into `probed`: a folded vector through the probe's lanes, the others element by element.
template <typename Lanes, typename T>
sentinel::TensorStats scan_as_the_kernel(const torch::Tensor& t, float min_normal, int64_t* folded = nullptr,
                                         const stats::Fp8ProbeParams* probe = nullptr,
                                         stats::Fp8ProbeAccumulator<double>* probed = nullptr) {
  const float inf = std::numeric_limits<float>::infinity();
  stats::AbsStatsAccumulator<float> acc(inf);
  sentinel::cuda::LaneScan<Lanes> lanes;
  sentinel::cuda::ProbeLanes<Lanes> probe_lanes;
  const auto c = t.contiguous();
  const auto* data = static_cast<const T*>(c.data_ptr());
  const auto as_float = [&](int64_t i) { return static_cast<float>(data[i]); };
  const auto visit = [&](int64_t i) {
    acc.reduce(as_float(i), inf, min_normal);
    if (probe) probed->reduce(as_float(i), *probe);
  };
  constexpr int64_t kVec = 16 / sizeof(T);
  const int64_t n = c.numel(), vectors = n / kVec;
  for (int64_t v = 0; v < vectors; ++v) {
    uint32_t w[4], hi, lo;
    std::memcpy(w, data + v * kVec, sizeof w);
    if (lanes.fold(w[0], w[1], w[2], w[3], hi, lo)) {
      if (folded) ++*folded;
      if (probe) probe_lanes.take(w, hi, lo, *probe, *probed);
      continue;
    }
    for (int64_t k = 0; k < kVec; ++k) visit(v * kVec + k);
  }
  for (int64_t i = vectors * kVec; i < n; ++i) visit(i);
  lanes.finish(acc);
  if (probe) probe_lanes.flush(*probed);
  sentinel::TensorStats out;
  acc.project(n, out);
  return out;
}

sentinel::TensorStats scan_as_the_kernel(const torch::Tensor& t, int64_t* folded = nullptr,
                                         const stats::Fp8ProbeParams* probe = nullptr,
                                         stats::Fp8ProbeAccumulator<double>* probed = nullptr) {
  using namespace sentinel::cuda;
  switch (t.scalar_type()) {
    case torch::kHalf: return scan_as_the_kernel<Float16Lanes, c10::Half>(t, 6.103515625e-05f, folded, probe, probed);
    case torch::kBFloat16:
      return scan_as_the_kernel<BFloat16Lanes, c10::BFloat16>(t, 1.17549435e-38f, folded, probe, probed);
    default: return scan_as_the_kernel<Float32Lanes, float>(t, 1.17549435e-38f, folded, probe, probed);
  }
}

// Every 16-bit pattern of float16 and bfloat16 (NaNs, infinities, zeros, subnormals, normals of
// both signs), shuffled into vectors, and float32 patterns drawn from every exponent: the scan
// equals the CPU pass, field by field.
TEST(CudaSlotLogic, TheFastPathOverEveryHalfBitPatternEqualsTheCpuPass) {
  torch::manual_seed(13);
  const auto every_pattern = torch::arange(0, 1 << 16, torch::kInt32).to(torch::kInt16);
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    const auto t = every_pattern.index_select(0, torch::randperm(1 << 16)).view(dtype);
    sentinel::TensorStats want;
    stats::compute(t, want);
    expect_same_stats(scan_as_the_kernel(t), want);
  }
  const auto f32 = torch::randint(0, int64_t{1} << 32, {1 << 16}, torch::kInt64).to(torch::kInt32).view(torch::kFloat);
  sentinel::TensorStats want;
  stats::compute(f32, want);
  expect_same_stats(scan_as_the_kernel(f32), want);
}

// Ordinary tensors are folded whole; one special value anywhere sends its vector (and only it)
// through the accumulator, and is counted; an ordinary tensor's extremes come from the lanes alone.
TEST(CudaSlotLogic, TheFastPathFoldsOrdinaryVectorsAndCountsASpecialValueAnywhere) {
  const float specials[] = {std::nanf(""), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 0.0f, -0.0f, 1e-40f, 3e-6f};
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (int64_t n : {int64_t{40}, int64_t{4099}}) {
      torch::manual_seed(n);
      const auto ordinary = (torch::rand({n}) * 1.5 + 0.5) * (torch::randint(0, 2, {n}) * 2 - 1);
      const int64_t per_vector = 16 / static_cast<int64_t>(torch::elementSize(dtype));
      const int64_t vectors = n / per_vector;
      int64_t folded = 0;
      sentinel::TensorStats want;
      stats::compute(ordinary.to(dtype), want);
      expect_same_stats(scan_as_the_kernel(ordinary.to(dtype), &folded), want);
      EXPECT_EQ(folded, vectors);
      // The extremes in every lane and word of a vector: |3| above every ordinary value, 0.25 below.
      for (int64_t k = 0; k < per_vector; ++k) {
        auto t = ordinary.clone();
        t[k] = -3.0f;
        t[per_vector + k] = 0.25f;
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " extremes at element " + std::to_string(k));
        stats::compute(t.to(dtype), want);
        expect_same_stats(scan_as_the_kernel(t.to(dtype)), want);
      }
      for (int64_t at : {int64_t{0}, n / 2, vectors * per_vector - 1, n - 1}) {
        for (float special : specials) {
          auto t = ordinary.clone();
          t[at] = special;
          t = t.to(dtype);
          SCOPED_TRACE(std::string(c10::toString(dtype)) + " n=" + std::to_string(n) + " at=" + std::to_string(at) +
                       " special=" + std::to_string(special));
          stats::compute(t, want);
          expect_same_stats(scan_as_the_kernel(t), want);
        }
      }
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

// The probe's fast path against its per-element arithmetic in float64 (Fp8ProbeAccumulator, as
// the probe's own tests check it against torch's casts), over every float16 and bfloat16 bit
// pattern and float32 values of every exponent, at scales that put the values across the
// formats' range (counts of overflow and underflow in folded vectors), and at scales that send
// them outside the float sums' range (the per-element path): equal counts, sums within float
// rounding.
TEST(CudaSlotLogic, TheProbesFastPathEqualsItsPerElementArithmetic) {
  torch::manual_seed(14);
  const auto every_pattern = torch::arange(0, 1 << 16, torch::kInt32).to(torch::kInt16).index_select(0, torch::randperm(1 << 16));
  const auto wide = torch::randn({1 << 16}) * torch::pow(10.0, torch::randint(-30, 30, {1 << 16}).to(torch::kFloat));
  const std::vector<torch::Tensor> tensors = {every_pattern.view(torch::kHalf), every_pattern.view(torch::kBFloat16),
                                              wide, (torch::randn({4099}) * 300).to(torch::kBFloat16),
                                              torch::randn({4099}) * 1e-3};
  for (const auto& t : tensors) {
    for (Format f : {Format::E4M3, Format::E5M2}) {
      for (float scale : {1.0f, 448.0f / 3.0f, 0.37f, 0x1p100f, 0x1p-100f}) {
        SCOPED_TRACE(std::string(c10::toString(t.scalar_type())) + " scale " + std::to_string(scale) +
                     (f == Format::E4M3 ? " e4m3" : " e5m2"));
        const auto params = stats::make_fp8_probe_params(scale, f);
        stats::Fp8ProbeAccumulator<double> want, got;
        for (float x : as_floats(t)) want.reduce(x, params);
        int64_t folded = 0;
        scan_as_the_kernel(t, &folded, &params, &got);
        EXPECT_GT(folded, t.numel() / 16 / 2) << "too few vectors on the fast path: the test proves little";
        EXPECT_EQ(got.count, want.count);
        EXPECT_EQ(got.overflow, want.overflow);
        EXPECT_EQ(got.underflow, want.underflow);
        EXPECT_NEAR(got.sum_sq_error, want.sum_sq_error, 1e-6 * want.sum_sq_error);
        EXPECT_NEAR(got.sum_a_q, want.sum_a_q, 1e-6 * want.sum_a_q);
        EXPECT_NEAR(got.sum_q_sq, want.sum_q_sq, 1e-6 * want.sum_q_sq);
      }
    }
  }
}

}  // namespace
