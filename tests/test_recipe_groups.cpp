// The GPU's recipe pass, run on the CPU: the kernels' arithmetic (fp8/group_math.h: where the
// groups lie, each group's scale, each element's cast) walked one group after another as the
// warps walk them, against the CPU replay (run_recipe_job) through the harness the CUDA suite
// runs on a GPU. What a GPU adds to this is the lanes' split of the work and the order of the
// sums; the logic is checked here on any machine.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/fp8_scaling.h>

#include <array>
#include <map>
#include <sstream>
#include <vector>

#include "device/stats_device.h"
#include "fp8/block_kernels.h"
#include "fp8/group_math.h"
#include "support/recipe_device_compare.h"

namespace {

using sentinel::fp8::ScalingRecipe;
namespace recipes = sentinel::recipes;

// One job on a CPU tensor, group by group, as cuda/recipe_launch.cu's kernel computes it.
recipes::BlockProbeResult emulate_device_recipe(const torch::Tensor& t, const recipes::RecipeJob& job, float tensor_amax) {
  const torch::Tensor f = t.to(torch::kFloat);  // exact for float16 and bfloat16; the view's strides kept
  const float* p = f.data_ptr<float>();
  recipes::GroupGeometry geo;
  EXPECT_TRUE(recipes::make_group_geometry(f.sizes().data(), f.strides().data(), static_cast<int>(f.dim()), job.layout,
                                           recipes::group_length(job.recipe), geo));
  const bool nvfp4 = job.recipe == ScalingRecipe::NVFP4;
  const sentinel::stats::Fp8ProbeParams e = nvfp4 ? recipes::e2m1_format() : recipes::element_format(job.element);
  float tensor_scale = 1.0f;
  if (nvfp4) tensor_scale = sentinel::fp8::nvfp4_tensor_scale(tensor_amax);
  if (job.recipe == ScalingRecipe::Current) tensor_scale = sentinel::fp8::scale_for_amax(tensor_amax, e.max, job.margin, 1.0f);
  const recipes::GroupRule rule = recipes::group_rule(job.block);
  recipes::CastTally cast;
  recipes::GroupTally groups;
  std::array<int64_t, 256> codes{};
  for (int64_t g = 0; g < geo.groups; ++g) {
    int64_t height = 0, width = 0;
    const int64_t start = geo.group_start(g, height, width);
    auto each = [&](auto&& f) {
      for (int64_t r = 0; r < height; ++r) {
        for (int64_t c = 0; c < width; ++c) f(p[geo.at(start, r, c)]);
      }
    };
    if (job.recipe == ScalingRecipe::Current) {
      each([&](float x) { cast.add_scaled(x, tensor_scale, e); });
      continue;
    }
    float amax = 0.0f;
    bool special = false;
    each([&](float x) {
      const float ax = std::fabs(x);
      amax = std::fmax(amax, ax);
      special = special || !(ax <= FLT_MAX);
    });
    const sentinel::fp8::BlockScale s = recipes::group_scale(rule, amax, special, tensor_scale);
    groups.add(s, amax, special);
    ++codes[s.code];
    each([&](float x) { cast.add(x, s.encode, s.decode, e); });
  }
  if (job.recipe == ScalingRecipe::Current) cast.unscale(tensor_scale);
  recipes::BlockProbeResult out;
  recipes::add_tallies(cast, groups, out);
  out.scale_codes = codes;
  return out;
}

// The CPU deferring device for the statistics, and the emulated kernels for the recipes.
class EmulatedRecipeDevice final : public sentinel::device::StatsDevice {
 public:
  EmulatedRecipeDevice() : inner_(sentinel::device::make_cpu_deferred_device(16)) {}
  bool owns(const at::Tensor& t) const override { return inner_->owns(t); }
  sentinel::stats::Readability readability(const at::Tensor& t) const override { return inner_->readability(t); }
  bool replays_recipes() const override { return true; }
  void enqueue(const at::Tensor& t, int64_t slot, const sentinel::device::Request& request) override {
    sentinel::device::Request stats_only = request;
    stats_only.recipes = nullptr;
    inner_->enqueue(t, slot, stats_only);
    std::vector<recipes::BlockProbeResult>& into = computed_[slot];
    if (!request.accumulate) into.clear();
    if (!request.recipes) return;
    sentinel::TensorStats stats;
    sentinel::stats::compute(t, stats);
    into.resize(std::max(into.size(), request.recipes->size()));
    for (size_t j = 0; j < request.recipes->size(); ++j) {
      into[j].add(emulate_device_recipe(t, (*request.recipes)[j], recipes::recipe_amax(stats.abs_max)));
    }
  }
  void read_back(int64_t first, int64_t end) override {
    inner_->read_back(first, end);
    for (int64_t s = first; s < end; ++s) published_[s] = std::move(computed_[s]), computed_.erase(s);
  }
  sentinel::device::SlotResult result(int64_t slot) const override {
    sentinel::device::SlotResult r = inner_->result(slot);
    const auto it = published_.find(slot);
    if (it != published_.end()) r.recipes = it->second;
    return r;
  }
  int64_t capacity() const override { return inner_->capacity(); }
  int64_t synchronisations() const override { return inner_->synchronisations(); }

 private:
  std::unique_ptr<sentinel::device::StatsDevice> inner_;
  std::map<int64_t, std::vector<recipes::BlockProbeResult>> computed_, published_;
};

TEST(RecipeGroups, TheKernelsArithmeticEqualsTheCpuReplayOnEveryAdversarialOperand) {
  EmulatedRecipeDevice dev;
  EXPECT_EQ(sentinel_test::expect_device_recipes_match_cpu(dev, [](const torch::Tensor& t) { return t; },
                                                           recipes::kDeviceSumsRelativeBound),
            sentinel_test::kRecipePairsChecked);
}

// The bound is not loose: the CPU's float-lane sums do differ from the double ones, by far less.
TEST(RecipeGroups, TheSumsBoundIsWellAboveTheDifferenceItCovers) {
  torch::manual_seed(3);
  const torch::Tensor t = torch::randn({64, 4096});
  sentinel::TensorStats stats;
  sentinel::stats::compute(t, stats);
  const auto options = sentinel::Fp8Options();
  double worst = 0.0;
  for (ScalingRecipe r : {ScalingRecipe::Current, ScalingRecipe::MXFP8, ScalingRecipe::NVFP4, ScalingRecipe::Float8Block}) {
    const recipes::RecipeJob job = recipes::recipe_job(r, options, sentinel::fp8::Role::Activation, "aten::linear", 0, 2);
    recipes::BlockProbeResult cpu;
    ASSERT_TRUE(recipes::run_recipe_job(t, job, stats, cpu));
    const recipes::BlockProbeResult device = emulate_device_recipe(t, job, recipes::recipe_amax(stats.abs_max));
    EXPECT_EQ(device.cast.count, cpu.cast.count);
    for (auto [d, c] : {std::pair{device.cast.sum_sq_error, cpu.cast.sum_sq_error}, {device.cast.sum_x_q, cpu.cast.sum_x_q},
                        {device.cast.sum_x_sq, cpu.cast.sum_x_sq}, {device.cast.sum_q_sq, cpu.cast.sum_q_sq}}) {
      ASSERT_GT(c, 0.0);
      worst = std::max(worst, std::fabs(d - c) / c);
    }
  }
  EXPECT_LT(worst, recipes::kDeviceSumsRelativeBound / 10) << "the bound covers differences this large";
  std::ostringstream shown;
  shown << std::scientific << worst;
  RecordProperty("worst_relative_difference", shown.str());
}

}  // namespace
