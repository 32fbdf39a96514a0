// The delayed-scaling simulator against scale sequences worked out by hand
// from TransformerEngine's recipe (docs/fp8.md states the rules).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "sentinel/fp8.h"
#include "sentinel/fp8_scaling.h"

namespace sentinel {
namespace fp8 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Feeds amaxes[t] at step t and returns the scale used AT each step t, i.e.
// scale() read before update(amaxes[t]).
std::vector<float> scales_used(DelayedScaler& s, const std::vector<float>& amaxes) {
  std::vector<float> used;
  for (float a : amaxes) {
    used.push_back(s.scale());
    s.update(a);
  }
  used.push_back(s.scale());  // the scale the next step would use
  return used;
}

TEST(Recipe, DefaultsFollowTransformerEngine) {
  const Recipe r;
  EXPECT_EQ(r.format(), FormatPolicy::HYBRID);
  EXPECT_EQ(r.amax_history_len(), 1024);
  EXPECT_EQ(r.amax_compute_algo(), AmaxAlgo::Max);
  EXPECT_EQ(r.margin(), 0);
}

TEST(Recipe, ChainedSetters) {
  const Recipe r = Recipe()
                       .format(FormatPolicy::E5M2)
                       .amax_history_len(16)
                       .amax_compute_algo(AmaxAlgo::MostRecent)
                       .margin(2);
  EXPECT_EQ(r.format(), FormatPolicy::E5M2);
  EXPECT_EQ(r.amax_history_len(), 16);
  EXPECT_EQ(r.amax_compute_algo(), AmaxAlgo::MostRecent);
  EXPECT_EQ(r.margin(), 2);
}

TEST(Recipe, FormatForRole) {
  const Recipe hybrid;
  EXPECT_EQ(format_for(hybrid, Role::Activation), Format::E4M3);
  EXPECT_EQ(format_for(hybrid, Role::Weight), Format::E4M3);
  EXPECT_EQ(format_for(hybrid, Role::Gradient), Format::E5M2);
  for (Role r : {Role::Activation, Role::Weight, Role::Gradient}) {
    EXPECT_EQ(format_for(Recipe().format(FormatPolicy::E4M3), r), Format::E4M3);
    EXPECT_EQ(format_for(Recipe().format(FormatPolicy::E5M2), r), Format::E5M2);
  }
  EXPECT_STREQ(role_name(Role::Activation), "activation");
  EXPECT_STREQ(role_name(Role::Weight), "weight");
  EXPECT_STREQ(role_name(Role::Gradient), "gradient");
}

TEST(DelayedScaler, FirstScaleIsOne) {
  DelayedScaler s(Recipe(), Format::E4M3);
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_EQ(s.steps(), 0);
  EXPECT_TRUE(s.history().empty());
}

TEST(DelayedScaler, MaxOverShortHistory) {
  DelayedScaler s(Recipe().amax_history_len(3), Format::E4M3);
  // window after each update:  [1] [1,4] [1,4,0] [4,0,inf] [0,inf,2] [inf,2,2] [2,2,1] [2,1,.5] [1,.5,.25]
  const std::vector<float> used = scales_used(s, {1, 4, 0, kInf, 2, 2, 1, 0.5f, 0.25f});
  const std::vector<float> expected = {
      1.0f,            // step 0: nothing seen yet
      448.0f / 1.0f,   // from amax 1
      448.0f / 4.0f,   // max(1, 4)
      448.0f / 4.0f,   // max(1, 4, 0): the zero does not matter
      448.0f / 4.0f,   // max(4, 0, inf) = inf: previous scale kept
      448.0f / 4.0f,   // inf still in the window
      448.0f / 4.0f,   // inf still in the window
      448.0f / 2.0f,   // inf left: max(2, 2, 1)
      448.0f / 2.0f,   // max(2, 1, 0.5)
      448.0f / 1.0f,   // max(1, 0.5, 0.25)
  };
  EXPECT_EQ(used, expected);
  EXPECT_EQ(s.steps(), 9);
  EXPECT_EQ(s.history(), (std::vector<float>{1.0f, 0.5f, 0.25f}));
  EXPECT_EQ(s.history_amax(), 1.0f);
}

TEST(DelayedScaler, MostRecentIgnoresOlderHistory) {
  DelayedScaler s(Recipe().amax_history_len(3).amax_compute_algo(AmaxAlgo::MostRecent),
                  Format::E4M3);
  const std::vector<float> used = scales_used(s, {1, 4, 0, kInf, 2, 2, 1, 0.5f, 0.25f});
  const std::vector<float> expected = {
      1.0f,            448.0f / 1.0f, 448.0f / 4.0f,
      448.0f / 4.0f,   // amax 0: kept
      448.0f / 4.0f,   // amax inf: kept
      448.0f / 2.0f,   448.0f / 2.0f, 448.0f / 1.0f, 448.0f / 0.5f, 448.0f / 0.25f,
  };
  EXPECT_EQ(used, expected);
}

TEST(DelayedScaler, ScaleAtStepTUsesHistoryUpToTMinusOne) {
  DelayedScaler s(Recipe().amax_history_len(4), Format::E4M3);
  s.update(2.0f);
  // A much larger amax at this step cannot change the scale it is cast with.
  const float before = s.scale();
  EXPECT_EQ(before, 448.0f / 2.0f);
  s.update(100.0f);
  EXPECT_EQ(s.scale(), 448.0f / 100.0f);  // only the next step sees it
}

TEST(DelayedScaler, OldAmaxLeavesTheWindowAfterLSteps) {
  DelayedScaler s(Recipe().amax_history_len(2), Format::E4M3);
  s.update(8.0f);
  EXPECT_EQ(s.scale(), 448.0f / 8.0f);
  s.update(1.0f);
  EXPECT_EQ(s.scale(), 448.0f / 8.0f);  // window [8, 1]
  s.update(1.0f);
  EXPECT_EQ(s.scale(), 448.0f / 1.0f);  // window [1, 1]
}

TEST(DelayedScaler, DefaultHistoryRemembers1024Steps) {
  DelayedScaler s(Recipe(), Format::E4M3);
  s.update(100.0f);
  for (int i = 0; i < 1023; ++i) s.update(1.0f);
  EXPECT_EQ(s.scale(), 448.0f / 100.0f);
  s.update(1.0f);
  EXPECT_EQ(s.scale(), 448.0f / 1.0f);
}

TEST(DelayedScaler, MarginAndFormat) {
  DelayedScaler e4(Recipe().margin(1), Format::E4M3);
  e4.update(4.0f);
  EXPECT_EQ(e4.scale(), 448.0f / 4.0f / 2.0f);
  DelayedScaler e4m3(Recipe().margin(3), Format::E4M3);
  e4m3.update(3.0f);
  EXPECT_EQ(e4m3.scale(), 448.0f / 3.0f / 8.0f);
  DelayedScaler neg(Recipe().margin(-1), Format::E4M3);
  neg.update(4.0f);
  EXPECT_EQ(neg.scale(), 448.0f / 4.0f * 2.0f);
  DelayedScaler e5(Recipe(), Format::E5M2);
  e5.update(4.0f);
  EXPECT_EQ(e5.scale(), 57344.0f / 4.0f);
}

TEST(DelayedScaler, ZeroAndNonFiniteAmaxKeepPreviousScale) {
  // From the start: the first scale 1 is kept.
  for (float bad : {0.0f, kInf, kNaN}) {
    DelayedScaler s(Recipe().amax_history_len(1), Format::E4M3);
    s.update(bad);
    EXPECT_EQ(s.scale(), 1.0f) << bad;
  }
  // Later: the last good scale is kept.
  for (float bad : {0.0f, kInf, kNaN}) {
    DelayedScaler s(Recipe().amax_history_len(1), Format::E4M3);
    s.update(7.0f);
    s.update(bad);
    EXPECT_EQ(s.scale(), 448.0f / 7.0f) << bad;
  }
}

TEST(DelayedScaler, NaNInWindowFreezesScaleUnderMax) {
  DelayedScaler s(Recipe().amax_history_len(2), Format::E4M3);
  s.update(2.0f);
  s.update(kNaN);
  EXPECT_EQ(s.scale(), 448.0f / 2.0f);
  s.update(4.0f);  // window [nan, 4]: still NaN
  EXPECT_TRUE(std::isnan(s.history_amax()));
  EXPECT_EQ(s.scale(), 448.0f / 2.0f);
  s.update(4.0f);  // window [4, 4]
  EXPECT_EQ(s.scale(), 448.0f / 4.0f);
}

TEST(DelayedScaler, TinyAmaxClampsScaleToFloatMax) {
  DelayedScaler s(Recipe(), Format::E4M3);
  s.update(1e-40f);  // 448 / 1e-40 overflows float
  EXPECT_EQ(s.scale(), FLT_MAX);
  EXPECT_EQ(DelayedScaler::scale_from_amax(1e-40f, 448.0f, 0, 1.0f), FLT_MAX);
}

TEST(DelayedScaler, InvalidHistoryLengthThrows) {
  EXPECT_THROW(DelayedScaler(Recipe().amax_history_len(0), Format::E4M3), std::invalid_argument);
  EXPECT_THROW(DelayedScaler(Recipe().amax_history_len(-5), Format::E5M2), std::invalid_argument);
}

TEST(DelayedScaler, CurrentScale) {
  DelayedScaler s(Recipe().margin(1), Format::E4M3);
  s.update(2.0f);
  EXPECT_EQ(s.current_scale(8.0f), 448.0f / 8.0f / 2.0f);
  // Nothing to learn from this step's amax: fall back to the delayed scale.
  EXPECT_EQ(s.current_scale(0.0f), s.scale());
  EXPECT_EQ(s.current_scale(kInf), s.scale());
  EXPECT_EQ(s.current_scale(kNaN), s.scale());
  EXPECT_EQ(s.steps(), 1);  // current_scale does not record anything
}

TEST(DelayedScaler, DriftIsLog2OfRatio) {
  EXPECT_EQ(DelayedScaler::drift_log2(448.0f / 4.0f, 448.0f / 8.0f), 1.0);
  EXPECT_EQ(DelayedScaler::drift_log2(448.0f / 8.0f, 448.0f / 2.0f), -2.0);
  EXPECT_EQ(DelayedScaler::drift_log2(3.0f, 3.0f), 0.0);
  EXPECT_NEAR(DelayedScaler::drift_log2(3.0f, 1.0f), std::log2(3.0), 1e-15);
}

TEST(DelayedScaler, GrowingAmaxGivesPositiveDriftAndOverflow) {
  DelayedScaler s(Recipe().amax_history_len(4), Format::E4M3);
  float drift = 0;
  for (float amax : {1.0f, 2.0f, 4.0f, 8.0f}) {
    const float delayed = s.scale();
    const float current = s.current_scale(amax);
    drift = static_cast<float>(DelayedScaler::drift_log2(delayed, current));
    if (amax == 8.0f) {
      // Cast with the scale from amax 4: the largest value lands at 896.
      EXPECT_EQ(delayed, 448.0f / 4.0f);
      EXPECT_EQ(current, 448.0f / 8.0f);
      EXPECT_GT(drift, 0.0f);
      EXPECT_EQ(drift, 1.0f);
      EXPECT_GT(amax * delayed, max_value(Format::E4M3));
      EXPECT_EQ(encode(amax * delayed, Format::E4M3, true), 0x7E);    // clipped to 448
      EXPECT_EQ(encode(amax * delayed, Format::E4M3, false), 0x7F);   // NaN
      // The current scale maps amax exactly onto the format's max.
      EXPECT_EQ(amax * current, max_value(Format::E4M3));
    }
    s.update(amax);
  }
  // Shrinking amax under Max: the old peak keeps the scale small, drift < 0.
  DelayedScaler shrink(Recipe().amax_history_len(4), Format::E4M3);
  shrink.update(8.0f);
  EXPECT_LT(DelayedScaler::drift_log2(shrink.scale(), shrink.current_scale(1.0f)), 0.0);
}

TEST(ScalingTable, CreatesOneScalerPerSlotOnFirstUse) {
  ScalingTable table(Recipe().amax_history_len(8));
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.find("enc.l1", Role::Activation), nullptr);

  DelayedScaler& act = table.slot("enc.l1", Role::Activation);
  DelayedScaler& grad = table.slot("enc.l1", Role::Gradient);
  DelayedScaler& w = table.slot("enc.l1", Role::Weight);
  EXPECT_EQ(table.size(), 3u);
  EXPECT_EQ(act.format(), Format::E4M3);  // HYBRID by default
  EXPECT_EQ(w.format(), Format::E4M3);
  EXPECT_EQ(grad.format(), Format::E5M2);
  EXPECT_EQ(act.recipe().amax_history_len(), 8);

  act.update(4.0f);
  EXPECT_EQ(&table.slot("enc.l1", Role::Activation), &act);  // same slot, no reset
  EXPECT_EQ(table.slot("enc.l1", Role::Activation).scale(), 448.0f / 4.0f);
  EXPECT_EQ(table.find("enc.l1", Role::Activation), &act);
  EXPECT_EQ(grad.scale(), 1.0f);  // slots are independent
  EXPECT_EQ(table.find("enc.l2", Role::Activation), nullptr);

  int visited = 0;
  table.for_each([&](const std::string& path, Role, const DelayedScaler&) {
    EXPECT_EQ(path, "enc.l1");
    ++visited;
  });
  EXPECT_EQ(visited, 3);
  table.clear();
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace fp8
}  // namespace sentinel
