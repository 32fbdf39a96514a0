#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/detect.h>

#include <sstream>

namespace {

TEST(DetectOverflow, PrintsHfsMessagesAndReturnsWhetherItFoundAny) {
  std::ostringstream out;
  EXPECT_FALSE(sentinel::detect_overflow(torch::ones({3}), "clean", out));
  EXPECT_EQ(out.str(), "");
  auto t = torch::ones({4});
  t[1] = std::nanf("");
  t[2] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(sentinel::detect_overflow(t, "after layer_norm", out));
  EXPECT_EQ(out.str(), "after layer_norm has nans\nafter layer_norm has infs\n");
  out.str("");
  auto only_inf = torch::ones({2}, torch::kBFloat16);
  only_inf[0] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(sentinel::detect_overflow(only_inf, "x", out));
  EXPECT_EQ(out.str(), "x has infs\n");
}

TEST(DetectOverflow, TensorsItCannotReadAreNotOverflows) {
  std::ostringstream out;
  EXPECT_FALSE(sentinel::detect_overflow(torch::empty({2}, torch::device(torch::kMeta)), "meta", out));
  EXPECT_FALSE(sentinel::detect_overflow(torch::ones({0}), "empty", out));
  EXPECT_FALSE(sentinel::detect_overflow(torch::tensor({1, 2}), "ints", out));
  EXPECT_EQ(out.str(), "");
}

}  // namespace
