#pragma once
// Every recipe run by a device (device::Request::recipes) against the CPU replay of the same
// tensor, bit for bit: counts, block tallies, scale histograms and the error sums, on random
// tensors and on the blocks that break naive code (ties between grid points, float subnormals,
// saturation, all-zero blocks, inf and NaN inside a block). Shared by the CPU deferring device's
// test and the CUDA one (which runs once the CUDA device replays the recipes).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <functional>
#include <vector>

#include "device/stats_device.h"
#include "fp8/group_math.h"
#include "fp8/recipe_probe.h"
#include "stats/tensor_stats.h"

namespace sentinel_test {

// [rows, cols] float values: Gaussian at spread magnitudes, then planted edge cases.
inline torch::Tensor adversarial_operand(int64_t rows, int64_t cols, uint64_t seed) {
  torch::manual_seed(seed);
  auto t = torch::randn({rows, cols}) * torch::pow(2.0, torch::randint(-10, 10, {rows, 1}).to(torch::kFloat));
  auto flat = t.view({-1});
  const int64_t n = flat.numel();
  auto set = [&](int64_t i, float v) {
    if (i < n) flat[i] = v;
  };
  for (int64_t i = 0; i < 128 && i < n; ++i) flat[i] = 0.0f;   // all-zero blocks of every size
  set(130, 3e38f);                                                  // saturation
  set(131, 1e-40f);                                                 // a float subnormal
  set(160, 0.5f * (448.0f + 416.0f));                               // an E4M3 tie at the top
  set(161, 2.5f);                                                   // an E2M1 tie
  set(300, INFINITY);
  set(301, NAN);
  set(420, -0.0f);
  return t;
}

// `sums_relative`: how far the error sums may stray, relative to the CPU's (a device that adds
// in another order: recipes::kDeviceSumsRelativeBound); the counts may not.
inline void expect_same_block_result(const sentinel::recipes::BlockProbeResult& got,
                                     const sentinel::recipes::BlockProbeResult& want, double sums_relative = 1e-9) {
  EXPECT_EQ(got.cast.count, want.cast.count);
  EXPECT_EQ(got.cast.overflow, want.cast.overflow);
  EXPECT_EQ(got.cast.underflow, want.cast.underflow);
  EXPECT_EQ(got.blocks, want.blocks);
  EXPECT_EQ(got.blocks_zero, want.blocks_zero);
  EXPECT_EQ(got.blocks_saturated, want.blocks_saturated);
  EXPECT_EQ(got.blocks_at_min, want.blocks_at_min);
  EXPECT_EQ(got.blocks_nonfinite, want.blocks_nonfinite);
  EXPECT_EQ(got.lost, want.lost);
  EXPECT_EQ(got.scale_codes, want.scale_codes);
  // Sums whose order of addition may differ between a device and the CPU lanes.
  for (auto [g, w, what] : {std::tuple{got.cast.sum_sq_error, want.cast.sum_sq_error, "sum of squared errors"},
                            {got.cast.sum_x_q, want.cast.sum_x_q, "sum x * x_hat"},
                            {got.cast.sum_x_sq, want.cast.sum_x_sq, "sum x^2"},
                            {got.cast.sum_q_sq, want.cast.sum_q_sq, "sum x_hat^2"}}) {
    EXPECT_NEAR(g, w, sums_relative * std::fabs(w) + 1e-300) << what;
  }
}

// The operands the harness reads, each [rows, cols] and its transpose (a view whose blocked
// dimension is not the innermost), and one with a batch dimension.
inline std::vector<torch::Tensor> recipe_operands(torch::ScalarType dtype) {
  std::vector<torch::Tensor> out;
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{8, 256}, {37, 300}, {130, 200}, {1, 1}}) {
    const torch::Tensor t = adversarial_operand(rows, cols, 11).to(dtype);
    out.push_back(t);
    out.push_back(t.t());
  }
  out.push_back(adversarial_operand(2 * 37, 300, 12).to(dtype).view({2, 37, 300}));
  return out;
}

// Runs every recipe job, MXFP8 under both rules, on `dev` (reading tensors moved by `to_device`)
// and compares each slot's results with run_recipe_job on the CPU copy, the error sums within
// `sums_relative`. Returns the number of (tensor, recipe) pairs checked.
inline int expect_device_recipes_match_cpu(sentinel::device::StatsDevice& dev,
                                           const std::function<torch::Tensor(const torch::Tensor&)>& to_device,
                                           double sums_relative = 1e-9) {
  using sentinel::fp8::ScalingRecipe;
  namespace recipes = sentinel::recipes;
  int checked = 0;
  int64_t slot = 0;
  for (auto rule : {sentinel::fp8::MxScaleRule::OcpFloor, sentinel::fp8::MxScaleRule::RoundUp}) {
    const auto options = sentinel::Fp8Options().mx_scale_rule(rule);
    for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      for (const torch::Tensor& cpu : recipe_operands(dtype)) {
        // The same view of the device's copy: a transpose stays a transpose.
        const torch::Tensor device_view = cpu.is_contiguous() ? to_device(cpu) : to_device(cpu.t().contiguous()).t();
        for (auto role : {sentinel::fp8::Role::Activation, sentinel::fp8::Role::Weight}) {
          SCOPED_TRACE(c10::str(cpu.sizes(), " strides ", cpu.strides()) + " " + c10::toString(dtype) + " " +
                       sentinel::fp8::role_name(role) + " " + sentinel::fp8::mx_scale_rule_name(rule));
          std::vector<recipes::RecipeJob> jobs;
          for (ScalingRecipe r : {ScalingRecipe::Current, ScalingRecipe::MXFP8, ScalingRecipe::NVFP4, ScalingRecipe::Float8Block}) {
            jobs.push_back(recipes::recipe_job(r, options, role, "aten::linear", role == sentinel::fp8::Role::Weight ? 1 : 0, cpu.dim()));
          }
          sentinel::device::Request request;
          request.recipes = &jobs;
          const int64_t s = slot++ % dev.capacity();
          dev.enqueue(device_view, s, request);
          dev.read_back(s, s + 1);
          const sentinel::device::SlotResult r = dev.result(s);
          EXPECT_EQ(r.recipes.size(), jobs.size());
          sentinel::TensorStats stats;
          sentinel::stats::compute(cpu, stats);
          for (size_t j = 0; j < jobs.size() && j < r.recipes.size(); ++j) {
            SCOPED_TRACE(sentinel::fp8::recipe_name(jobs[j].recipe));
            recipes::BlockProbeResult want;
            EXPECT_TRUE(recipes::run_recipe_job(cpu, jobs[j], stats, want));
            expect_same_block_result(r.recipes[j], want, sums_relative);
            ++checked;
          }
        }
      }
    }
  }
  return checked;
}

// Pairs the harness checks: two rules x three dtypes x nine operands x two roles x four recipes.
constexpr int kRecipePairsChecked = 2 * 3 * 9 * 2 * 4;

}  // namespace sentinel_test
