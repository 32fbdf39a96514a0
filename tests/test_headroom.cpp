// fp16/bf16 headroom against torch's own casts, and "can this model run in fp16?".
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <cstring>
#include <sstream>

#include "stats/tensor_stats.h"
#include "support/test_models.h"

namespace {

using namespace sentinel_test;

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

sentinel::HeadroomCounts oracle(const torch::Tensor& t) {
  auto finite = torch::isfinite(t);
  auto h = t.to(torch::kHalf), b = t.to(torch::kBFloat16);
  return {(torch::isinf(h) & finite).sum().item<int64_t>(), ((t != 0) & (h == 0)).sum().item<int64_t>(),
          (torch::isinf(b) & finite).sum().item<int64_t>(), ((t != 0) & (b == 0)).sum().item<int64_t>()};
}

void expect_same(const sentinel::HeadroomCounts& got, const sentinel::HeadroomCounts& want, const std::string& what) {
  EXPECT_EQ(got.fp16_overflow, want.fp16_overflow) << what;
  EXPECT_EQ(got.fp16_underflow, want.fp16_underflow) << what;
  EXPECT_EQ(got.bf16_overflow, want.bf16_overflow) << what;
  EXPECT_EQ(got.bf16_underflow, want.bf16_underflow) << what;
}

TEST(Headroom, BoundariesRoundAsTorchsCastsDo) {
  std::vector<float> values;
  // Each boundary, its neighbours one float ulp away, both signs.
  for (float b : {65504.0f, 65519.0f, 65520.0f, 65536.0f, 5.9604645e-08f /*2^-24*/, 2.9802322e-08f /*2^-25*/,
                  from_bits(0x7F7F0000u), from_bits(0x7F7F8000u), from_bits(0x7F7F7FFFu), 9.18355e-41f /*2^-133*/,
                  4.5917748e-41f /*2^-134*/, 1e-45f, 0.0f}) {
    for (float v : {b, std::nextafter(b, 0.0f), std::nextafter(b, INFINITY)}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  values.push_back(INFINITY);
  values.push_back(NAN);
  for (float v : values) {  // one by one, so that a failure names the value
    auto one = torch::tensor({v});
    sentinel::HeadroomCounts got;
    ASSERT_TRUE(sentinel::stats::compute_headroom(one, got));
    std::ostringstream what;
    what.precision(9);
    what << "value " << v;
    expect_same(got, oracle(one), what.str());
  }
  auto t = torch::tensor(values);
  sentinel::HeadroomCounts got;
  ASSERT_TRUE(sentinel::stats::compute_headroom(t, got));
  const auto want = oracle(t);
  expect_same(got, want, "boundaries");
  EXPECT_GT(want.fp16_overflow, 0);
  EXPECT_GT(want.fp16_underflow, 0);
  EXPECT_GT(want.bf16_overflow, 0);
  EXPECT_GT(want.bf16_underflow, 0);
}

TEST(Headroom, RandomBitPatternsOverTheWholeFloatRange) {
  torch::manual_seed(11);
  auto bits = torch::randint(0, 1LL << 31, {200000}, torch::kLong).to(torch::kInt);
  auto t = bits.view(torch::kFloat);  // every exponent, both signs; inf/nan included
  sentinel::HeadroomCounts got;
  ASSERT_TRUE(sentinel::stats::compute_headroom(t, got));
  expect_same(got, oracle(t), "random bits");
  ASSERT_TRUE(sentinel::stats::compute_headroom(t.view({400, 500}).t(), got));  // strided too
  expect_same(got, oracle(t), "transposed");
}

TEST(Headroom, TheSummaryNamesTheFirstFrameThatWouldOverflowFp16) {
  torch::manual_seed(0);
  Mlp model;
  {
    torch::NoGradGuard g;
    model->fc2->weight.fill_(3000.0f);  // batch 1: fc2 reaches ~3e5: fine in fp32 and bf16, inf in fp16
  }
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).headroom(true).trace_batch_nums({1}));
  torch::NoGradGuard no_grad;
  debug.forward(small_input(2, 4, 0.01));  // small: nothing overflows
  debug.forward(small_input(2, 4, 50.0));  // fc2 overflows fp16
  const auto h = debug.headroom();
  ASSERT_TRUE(h.first_fp16_overflow.has_value());
  EXPECT_EQ(h.first_fp16_overflow->module_path, "fc2");
  EXPECT_EQ(h.first_fp16_overflow->batch_number, 1);
  EXPECT_FALSE(h.first_bf16_overflow.has_value());
  EXPECT_EQ(h.frames_checked, 6);
  EXPECT_GE(h.frames_fp16_overflow, 1);
  EXPECT_NE(out.str().find(" fp16_overflow="), std::string::npos) << out.str();  // traced batch 1
  EXPECT_FALSE(debug.last_report().has_value());  // headroom is information, not a detection
}

}  // namespace
