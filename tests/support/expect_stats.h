#pragma once
// Two TensorStats equal field by field (exact: the passes compared are meant to agree bit for bit).
#include <gtest/gtest.h>

#include <sentinel/stats.h>

namespace sentinel_test {

inline void expect_same_stats(const sentinel::TensorStats& got, const sentinel::TensorStats& want) {
  EXPECT_EQ(got.count, want.count);
  EXPECT_EQ(got.nan, want.nan);
  EXPECT_EQ(got.pos_inf, want.pos_inf);
  EXPECT_EQ(got.neg_inf, want.neg_inf);
  EXPECT_EQ(got.zeros, want.zeros);
  EXPECT_EQ(got.subnormal, want.subnormal);
  EXPECT_EQ(got.abs_min, want.abs_min);
  EXPECT_EQ(got.abs_max, want.abs_max);
}

}  // namespace sentinel_test
