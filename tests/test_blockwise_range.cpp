// TransformerEngine's max_blockwise_dynamic_range: the statistic on tensors against its
// definition written with torch's own ops in float64 (TE's reshape, amax, masked amin and where),
// in the watchdog's collections under its TE name, and from a YAML config.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/loggers.h>
#include <sentinel/sentinel.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "stats/blockwise_range.h"

namespace {

using sentinel::stats::BlockwiseRange;
constexpr auto Computed = sentinel::stats::BlockwiseOutcome::Computed;
constexpr auto NotRead = sentinel::stats::BlockwiseOutcome::NotRead;
constexpr auto Undivided = sentinel::stats::BlockwiseOutcome::Undivided;

// TE's compute, step by step, in float64 on the values as float (TE's `.float()`).
double reference(const torch::Tensor& t, const BlockwiseRange& r) {
  auto one = [&](torch::Tensor x) {
    x = x.abs().to(torch::kFloat).to(torch::kDouble);
    const int64_t b = r.block_size;
    if (r.dims == 1) {
      x = x.reshape({-1, b});
    } else {
      x = x.reshape({-1, b, x.size(-1) / b, b}).permute({0, 2, 1, 3}).reshape({-1, b * b});
    }
    const auto amax = std::get<0>(x.max(1));
    const auto amin = std::get<0>(x.masked_fill(x == 0, INFINITY).min(1));
    const auto range = torch::where(amax != 0, torch::log2(amax) - torch::log2(amin), torch::zeros_like(amax));
    return range.max().item<double>();
  };
  const auto m = t.reshape({-1, t.size(-1)});
  if (!r.max_over_orientations) return one(m);
  const double row = one(m), col = one(m.transpose(-2, -1));
  return std::isnan(row) || std::isnan(col) ? NAN : std::max(row, col);
}

// Magnitudes spread over 24 binades (finite in float16), exact zeros, an all-zero block, a float
// subnormal (0 in the 16-bit types).
torch::Tensor spread(std::vector<int64_t> shape, uint64_t seed) {
  torch::manual_seed(seed);
  auto t = torch::randn(shape, torch::kDouble) * torch::pow(2.0, torch::randint(-12, 12, shape, torch::kDouble));
  auto flat = t.view({-1});
  flat.slice(0, 0, 64).zero_();
  flat[100] = 0.0;
  flat[130] = 1e-40;
  return t;
}

TEST(BlockwiseRange, EqualsTheDefinitionOnEveryLayoutDtypeAndBlockShape) {
  struct Case {
    std::vector<int64_t> shape;
    BlockwiseRange range;
    bool transpose;
  };
  const Case cases[] = {{{64, 96}, {32, 1, false}, false},  {{5, 64, 48}, {32, 1, false}, false},  // blocks cross rows
                        {{64, 96}, {32, 2, false}, false},  {{96, 64}, {16, 2, false}, true},
                        {{64, 96}, {32, 1, true}, false},   {{128, 64}, {128, 1, true}, true},
                        {{3, 32, 64}, {32, 2, false}, false}, {{256}, {32, 1, false}, false}};
  int checked = 0;
  for (const Case& c : cases) {
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf}) {
      auto t = spread(c.shape, 7).to(dtype);
      if (c.transpose) t = t.t();
      SCOPED_TRACE(c10::str(t.sizes()) + " " + c10::toString(dtype) + " block " + std::to_string(c.range.block_size) +
                   " dims " + std::to_string(c.range.dims) + (c.range.max_over_orientations ? " both" : ""));
      double got = -1;
      std::string why;
      ASSERT_EQ(Computed, sentinel::stats::max_blockwise_dynamic_range(t, c.range, got, why)) << why;
      const double want = reference(t, c.range);
      EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, std::fabs(want)));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 32);
}

TEST(BlockwiseRange, ZerosInfNanAndShapesTheBlocksDoNotDivide) {
  const BlockwiseRange r{32, 1, false};
  double v = -1;
  std::string why;
  ASSERT_EQ(Computed, sentinel::stats::max_blockwise_dynamic_range(torch::zeros({4, 64}), r, v, why));
  EXPECT_EQ(v, 0.0);  // every block all zero
  auto t = torch::ones({4, 64});
  t[1][3] = 0.25;  // one block spans 2 binades, the others none
  ASSERT_EQ(Computed, sentinel::stats::max_blockwise_dynamic_range(t, r, v, why));
  EXPECT_EQ(v, 2.0);
  t[2][5] = INFINITY;
  ASSERT_EQ(Computed, sentinel::stats::max_blockwise_dynamic_range(t, r, v, why));
  EXPECT_TRUE(std::isinf(v));
  t[3][7] = NAN;
  ASSERT_EQ(Computed, sentinel::stats::max_blockwise_dynamic_range(t, r, v, why));
  EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(Undivided, sentinel::stats::max_blockwise_dynamic_range(torch::ones({3, 10}), r, v, why));
  EXPECT_EQ(why, "30 elements are not a multiple of 32");
  EXPECT_EQ(Undivided, sentinel::stats::max_blockwise_dynamic_range(torch::ones({32, 48}), {32, 2, false}, v, why));
  EXPECT_EQ(why, "32 x 48 is not made of 32 x 32 tiles");
  EXPECT_EQ(NotRead, sentinel::stats::max_blockwise_dynamic_range(torch::ones({4, 32}, torch::kInt), r, v, why));
  EXPECT_EQ(NotRead, sentinel::stats::max_blockwise_dynamic_range(torch::empty({0, 32}), r, v, why));
  EXPECT_EQ(sentinel::stats::blockwise_range_name({32, 2, true}),
            "max_blockwise_dynamic_range_block_size_32_dims_2_max_over_orientations");
}

struct Recorder : sentinel::StatsLogger {
  std::vector<sentinel::StatRecord> records;
  void log(const std::vector<sentinel::StatRecord>& r) override { records.insert(records.end(), r.begin(), r.end()); }
};

TEST(BlockwiseRange, CollectedPerSlotAndStepUnderItsTransformerEngineName) {
  torch::manual_seed(3);
  auto linear = torch::nn::Linear(64, 32);
  auto recorder = std::make_shared<Recorder>();
  std::ostringstream out;
  const auto collection = sentinel::StatsCollection()
                              .stats({sentinel::Stat::Max, sentinel::Stat::MaxBlockwiseDynamicRange})
                              .blockwise_block_size(16)
                              .blockwise_dims(2);
  sentinel::DebugUnderflowOverflow<torch::nn::Linear> debug(
      linear, sentinel::Options().output(out).add_logger(recorder).stats_collections({collection}));
  torch::NoGradGuard no_grad;
  const auto x = spread({48, 64}, 9).to(torch::kFloat);
  debug.forward(x);
  debug.forward(x * 2);  // closes step 0
  const std::string name = "max_blockwise_dynamic_range_block_size_16_dims_2";
  int found = 0;
  for (const auto& rec : recorder->records) {
    if (rec.stat != name || rec.step != 0) continue;
    const auto& t = rec.tensor == "activation" ? x : linear->weight.detach();
    EXPECT_NEAR(rec.value, reference(t, {16, 2, false}), 1e-12 * std::max(1.0, std::fabs(rec.value))) << rec.tensor;
    ++found;
  }
  EXPECT_EQ(found, 2);  // activation and weight

  // A shape the blocks do not divide: said once, no record, the model runs on.
  std::ostringstream said;
  auto odd = torch::nn::Linear(10, 4);
  auto none = std::make_shared<Recorder>();
  sentinel::DebugUnderflowOverflow<torch::nn::Linear> watched(
      odd, sentinel::Options().output(said).add_logger(none).stats_collections({collection}));
  for (int i = 0; i < 3; ++i) watched.forward(torch::randn({3, 10}));
  const std::string text = said.str();
  EXPECT_NE(text.find("max_blockwise_dynamic_range of  activation is not computed: 3 x 10 is not made of 16 x 16 tiles"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("not computed", text.find("not computed") + 1), text.find("weight is not computed"));
  for (const auto& rec : none->records) EXPECT_NE(rec.stat, name);
}

TEST(BlockwiseRange, ReadFromAConfigAsTransformerEngineWritesIt) {
  const std::string path = ::testing::TempDir() + "blockwise.yaml";
  std::ofstream(path) << "section:\n  enabled: true\n  layers:\n    layer_name_regex_pattern: .*\n"
                         "  transformer_engine:\n    collect_tensor_stats:\n      enabled: true\n"
                         "      tensors: [activation]\n      type:\n        - max\n"
                         "        - max_blockwise_dynamic_range: {block_size: 64, dims: 2, max_over_orientations: true}\n";
  const auto o = sentinel::Options::from_yaml(path);
  ASSERT_EQ(o.stats_collections().size(), 1u);
  const auto& c = o.stats_collections()[0];
  ASSERT_EQ(c.stats().size(), 2u);
  EXPECT_EQ(c.stats()[1], sentinel::Stat::MaxBlockwiseDynamicRange);
  EXPECT_EQ(c.blockwise_block_size(), 64);
  EXPECT_EQ(c.blockwise_dims(), 2);
  EXPECT_TRUE(c.blockwise_max_over_orientations());
  std::ofstream(path) << "section:\n  enabled: true\n  layers:\n    layer_name_regex_pattern: .*\n"
                         "  transformer_engine:\n    collect_tensor_stats:\n      enabled: true\n"
                         "      tensors: [activation]\n      type:\n        - max_blockwise_dynamic_range: {dims: 3}\n";
  try {
    sentinel::Options::from_yaml(path);
    ADD_FAILURE() << "dims 3 accepted";
  } catch (const sentinel::OptionError& e) {
    EXPECT_NE(std::string(e.what()).find("blockwise.yaml:10: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dims"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

}  // namespace
