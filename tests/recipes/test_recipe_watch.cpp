// Several recipes on one watched model: one set of metrics per slot and recipe, each equal to
// the probe of the same tensors laid out as the GEMM reads them; options, config, reports, CLI.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "fp8/block_probe.h"
#include "fp8/recipe_probe.h"
#include "stats/tensor_stats.h"
#include "support/test_paths.h"

namespace sentinel {
namespace {

using fp8::ScalingRecipe;

const Fp8SlotMetrics* find(const std::vector<Fp8SlotMetrics>& all, const std::string& role, const std::string& recipe) {
  for (const auto& m : all) {
    if (m.role == role && m.recipe == recipe) return &m;
  }
  return nullptr;
}

// What the monitor should report for one tensor under one recipe: the probe on its own.
Fp8SlotMetrics expected(const torch::Tensor& t, ScalingRecipe recipe, fp8::Role role, const std::string& op, int arg,
                        const Fp8Options& options) {
  TensorStats stats;
  stats::compute(t, stats);
  recipes::RecipeTally tally{recipe, {}};
  EXPECT_TRUE(recipes::probe_recipe(t, options, role, op, arg, stats, tally));
  Fp8SlotMetrics base;
  base.cur_amax = stats.abs_max;
  return recipes::recipe_metrics(tally, options, role, base);
}

TEST(RecipeWatch, EveryRecipeReportsEverySlotAsItsProbeOfTheGemmOperands) {
  torch::manual_seed(1);
  auto linear = torch::nn::Linear(37, 24);  // K = 37: blocks do not divide it
  const auto options = Fp8Options()
                           .enabled(true)
                           .recipes({ScalingRecipe::Delayed, ScalingRecipe::Current, ScalingRecipe::MXFP8,
                                     ScalingRecipe::NVFP4, ScalingRecipe::Float8Block})
                           .mx_scale_rule(fp8::MxScaleRule::OcpFloor);
  DebugUnderflowOverflow<torch::nn::Linear> debug(linear, Options().fp8(options));
  torch::NoGradGuard no_grad;
  auto x = torch::randn({8, 37}) * 30;
  x[0][0] = 500.0f;  // E4M3's top binade: OCP's exponent 0 leaves it above 464, and it saturates
  debug.forward(x);
  const auto metrics = debug.fp8_metrics();
  ASSERT_EQ(metrics.size(), 10u);  // activation and weight, five recipes each
  // The C++ frontend's Linear runs aten::addmm(bias, x, weight.t()): x along its rows, the
  // weight's transpose along its columns (the weight's rows), NVFP4's weight in 16 x 16 tiles.
  const auto w = linear->weight.detach().t();
  for (ScalingRecipe r : {ScalingRecipe::Current, ScalingRecipe::MXFP8, ScalingRecipe::NVFP4, ScalingRecipe::Float8Block}) {
    for (const auto& [role, t, arg, name] :
         {std::make_tuple(fp8::Role::Activation, x, 1, "activation"), std::make_tuple(fp8::Role::Weight, w, 2, "weight")}) {
      SCOPED_TRACE(std::string(fp8::recipe_name(r)) + " " + name);
      const Fp8SlotMetrics* got = find(metrics, name, fp8::recipe_name(r));
      ASSERT_NE(got, nullptr);
      const Fp8SlotMetrics want = expected(t, r, role, "aten::addmm", arg, options);
      EXPECT_EQ(got->count, t.numel());
      EXPECT_EQ(got->count, want.count);
      EXPECT_EQ(got->overflow, want.overflow);
      EXPECT_EQ(got->underflow, want.underflow);
      EXPECT_EQ(got->blocks, want.blocks);
      EXPECT_EQ(got->block_scales, want.block_scales);
      EXPECT_DOUBLE_EQ(got->mse, want.mse);
      EXPECT_EQ(got->format, r == ScalingRecipe::NVFP4 ? "E2M1" : "E4M3");
    }
  }
  // Blocks as the GEMM reads them: the activation's 8 rows of 37 in 2 MXFP8 blocks each; the
  // weight [24, 37] in 24 rows of 2; NVFP4's weight in 2 x 3 tiles of 16 x 16.
  EXPECT_EQ(find(metrics, "activation", "mxfp8")->blocks, 16);
  EXPECT_EQ(find(metrics, "weight", "mxfp8")->blocks, 48);
  EXPECT_EQ(find(metrics, "activation", "nvfp4")->blocks, 8 * 3);
  EXPECT_EQ(find(metrics, "weight", "nvfp4")->blocks, 2 * 3);
  // Float8Block: each activation row of 37 is one 1 x 128 block; the weight one 128 x 128 tile.
  EXPECT_EQ(find(metrics, "activation", "float8block")->blocks, 8);
  EXPECT_EQ(find(metrics, "weight", "float8block")->blocks, 1);
  EXPECT_EQ(find(metrics, "activation", "float8block")->overflow, 0);  // scaled to its block's amax
  EXPECT_GT(find(metrics, "activation", "mxfp8")->overflow, 0);  // OCP floor: 448..512 saturates
  EXPECT_EQ(find(metrics, "activation", "current")->overflow, 0);  // current scaling never overflows
  EXPECT_NE(fp8_metrics_json_line(*find(metrics, "weight", "nvfp4")).find("\"block_scales\":[["), std::string::npos);
  EXPECT_NE(render_fp8_metrics_text(*find(metrics, "weight", "mxfp8")).find("weight E4M3 mxfp8: "), std::string::npos);
  const std::string table = render_fp8_recipe_table(metrics);
  for (const char* name : {"delayed", "current", "mxfp8", "nvfp4", "float8block", "activation", "weight"}) {
    EXPECT_NE(table.find(name), std::string::npos) << table;
  }
}

TEST(RecipeWatch, WithoutDelayedTheOtherRecipesStillReportAndTheModelIsUnchanged) {
  torch::manual_seed(2);
  auto linear = torch::nn::Linear(64, 32);
  const auto x = torch::randn({16, 64});
  torch::NoGradGuard no_grad;
  const auto unwatched = linear(x);
  DebugUnderflowOverflow<torch::nn::Linear> debug(
      linear, Options().fp8(Fp8Options().enabled(true).recipes({ScalingRecipe::MXFP8})));
  const auto watched = debug.forward(x);
  EXPECT_TRUE(torch::equal(watched, unwatched));
  const auto metrics = debug.fp8_metrics();
  ASSERT_EQ(metrics.size(), 2u);
  for (const auto& m : metrics) EXPECT_EQ(m.recipe, "mxfp8");
}

TEST(RecipeWatch, TrainingStepProbesGradientsAlongTheirLastDimension) {
  torch::manual_seed(3);
  auto linear = torch::nn::Linear(40, 20);
  DebugUnderflowOverflow<torch::nn::Linear> debug(
      linear, Options().fp8(Fp8Options().enabled(true).recipes({ScalingRecipe::NVFP4, ScalingRecipe::MXFP8})));
  const auto x = torch::randn({6, 40});
  auto loss = debug.forward(x).pow(2).sum();
  debug.backward(loss);
  const auto metrics = debug.fp8_metrics();
  const Fp8SlotMetrics* g = find(metrics, "gradient", "mxfp8");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->count, 6 * 20);
  EXPECT_EQ(g->blocks, 6);  // rows of 20: one block each
  EXPECT_EQ(g->format, "E5M2");  // HYBRID: gradients in E5M2
  EXPECT_EQ(find(metrics, "gradient", "nvfp4")->blocks, 6 * 2);
}

TEST(RecipeWatch, RecipeNamesAreCheckedInOptionsAndConfig) {
  EXPECT_EQ(parse_recipes("delayed,MXFP8,nvfp4").size(), 3u);
  EXPECT_EQ(parse_recipes("Float8BlockScaling,current").front(), ScalingRecipe::Float8Block);
  EXPECT_EQ(parse_recipe("float8block"), ScalingRecipe::Float8Block);
  EXPECT_THROW(Options().fp8(Fp8Options().enabled(true).block_scaling_amax_epsilon(-1)).validate(), OptionError);
  EXPECT_THROW(parse_recipes("delayed,bogus"), OptionError);
  EXPECT_THROW(parse_recipes("mxfp8,mxfp8"), OptionError);
  EXPECT_THROW(parse_recipes(""), OptionError);
  EXPECT_THROW(Options().fp8(Fp8Options().enabled(true).recipes({})).validate(), OptionError);
  const std::string path = ::testing::TempDir() + "recipes.yaml";
  std::ofstream(path) << "sentinel:\n  fp8:\n    enabled: true\n    recipes: [delayed, nvfp4, float8block]\n"
                          "    mx_scale_rule: ocp_floor\n    block_scaling_pow2_scales: false\n"
                          "    block_scaling_amax_epsilon: 1.0e-6\n";
  const Options o = Options::from_yaml(path);
  ASSERT_EQ(o.fp8().recipes().size(), 3u);
  EXPECT_EQ(o.fp8().recipes()[1], ScalingRecipe::NVFP4);
  EXPECT_EQ(o.fp8().recipes()[2], ScalingRecipe::Float8Block);
  EXPECT_FALSE(o.fp8().block_scaling_pow2_scales());
  EXPECT_DOUBLE_EQ(o.fp8().block_scaling_amax_epsilon(), 1e-6);
  EXPECT_EQ(o.fp8().mx_scale_rule(), fp8::MxScaleRule::OcpFloor);
  std::ofstream(path) << "sentinel:\n  fp8:\n    recipes: [delayed, mxfp9]\n";
  try {
    Options::from_yaml(path);
    ADD_FAILURE() << "mxfp9 accepted";
  } catch (const OptionError& e) {
    EXPECT_NE(std::string(e.what()).find(":3: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("mxfp9"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(RecipeWatch, DemoPrintsTheRecipesSideBySide) {
  const std::string out_path = ::testing::TempDir() + "demo_recipes.txt";
  const std::string cmd = sentinel_test::cli_program() + " demo fp8 --recipes delayed,current,mxfp8,nvfp4,float8block > " + out_path;
  const int rc = std::system(cmd.c_str());
  ASSERT_NE(rc, -1);
  std::ifstream in(out_path);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("The recipes side by side at the last step"), std::string::npos) << out;
  EXPECT_NE(out.find("proj activation"), std::string::npos) << out;
  EXPECT_NE(out.find("| nvfp4"), std::string::npos) << out;
  EXPECT_NE(out.find("| float8block"), std::string::npos) << out;
  EXPECT_NE(out.find("blocks,"), std::string::npos) << out;
  const std::string bad = sentinel_test::cli_program() + " demo fp8 --recipes delayed,fp6 > /dev/null 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(bad.c_str())), 2);
  std::remove(out_path.c_str());
}

}  // namespace
}  // namespace sentinel
