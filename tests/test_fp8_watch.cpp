// FP8 bring-up in the watchdog: delayed scaling per slot and step, metrics against independent
// oracles (hand-computed TransformerEngine scale sequences; the bit-exact cast), layer selection,
// step selection, alarms and the metrics log.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sentinel/sentinel.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/test_models.h"

namespace {

using namespace sentinel_test;
using sentinel::fp8::Format;

const sentinel::Fp8SlotMetrics* find_slot(const std::vector<sentinel::Fp8SlotMetrics>& ms, const std::string& path,
                                          const std::string& role) {
  for (const auto& m : ms) if (m.module_path == path && m.role == role) return &m;
  return nullptr;
}

sentinel::Options fp8_options(std::ostream& out, sentinel::Fp8Options fp8) {
  return sentinel::Options().output(out).fp8(fp8.enabled(true));
}

// Activations with a chosen amax: a ramp whose largest magnitude is exactly `amax`.
torch::Tensor with_amax(float amax) {
  if (amax == 0) return torch::zeros({2, 4});
  return torch::linspace(-1.0, 1.0, 8).reshape({2, 4}) * amax;
}

TEST(Fp8Watch, DelayedScaleFollowsTheRecipeStepByStep) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  auto recipe = sentinel::fp8::Recipe().amax_history_len(2).margin(1);
  sentinel::DebugUnderflowOverflow debug(
      model, fp8_options(out, sentinel::Fp8Options().recipe(recipe).layers("fc1").drift_alarm(1e9).overflow_alarm(1.0)));
  torch::NoGradGuard no_grad;
  // Hand-computed: scale_t = 448 / max(amax_{t-2}, amax_{t-1}) / 2^margin; first scale 1; an
  // amax of 0 (or inf) keeps the previous scale.
  const float amaxes[] = {2.0f, 8.0f, 4.0f, 0.0f, 1.0f};
  const double expected_delayed[] = {1.0, 448.0 / 2 / 2, 448.0 / 8 / 2, 448.0 / 8 / 2, 448.0 / 4 / 2};
  for (int t = 0; t < 5; ++t) {
    debug.forward(with_amax(amaxes[t]));
    const auto metrics = debug.fp8_metrics();  // kept alive: find_slot points into it
    const auto* m = find_slot(metrics, "fc1", "activation");
    ASSERT_NE(m, nullptr) << "step " << t;
    EXPECT_EQ(m->step, t);
    EXPECT_EQ(m->format, "E4M3");
    EXPECT_FLOAT_EQ(m->cur_amax, amaxes[t]);
    EXPECT_FLOAT_EQ(m->delayed_scale, expected_delayed[t]) << "step " << t;
    if (amaxes[t] > 0) {
      EXPECT_FLOAT_EQ(m->current_scale, 448.0 / amaxes[t] / 2);
      EXPECT_NEAR(m->drift_log2, std::log2(m->delayed_scale / m->current_scale), 1e-6);
    }
  }
  const auto last = debug.fp8_metrics();
  EXPECT_EQ(find_slot(last, "fc2", "activation"), nullptr);  // not selected
  ASSERT_NE(find_slot(last, "fc1", "weight"), nullptr);
}

TEST(Fp8Watch, CountsAndErrorsMatchTheBitExactCast) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      model, fp8_options(out, sentinel::Fp8Options().layers("fc1").drift_alarm(1e9).overflow_alarm(1.0)));
  torch::NoGradGuard no_grad;
  debug.forward(with_amax(1.0f));  // step 0 (scale 1); the history now says amax 1 -> scale 448
  auto x = torch::randn({64, 4}) * 2;
  x[0][0] = 1e-7f;  // will flush to zero at scale 448
  debug.forward(x);
  const auto metrics = debug.fp8_metrics();
  const auto* m = find_slot(metrics, "fc1", "activation");
  ASSERT_NE(m, nullptr);
  ASSERT_FLOAT_EQ(m->delayed_scale, 448.0);
  int64_t overflow = 0, underflow = 0;
  double se = 0, xx = 0;
  auto xc = x.contiguous();
  for (int64_t i = 0; i < xc.numel(); ++i) {
    const float v = xc.data_ptr<float>()[i];
    const float s = static_cast<float>(m->delayed_scale);
    const float q = sentinel::fp8::decode(sentinel::fp8::encode(v * s, Format::E4M3, true), Format::E4M3);
    overflow += !std::isfinite(sentinel::fp8::decode(sentinel::fp8::encode(v * s, Format::E4M3, false), Format::E4M3));
    underflow += (v != 0 && q == 0);
    const double qx = q * (1.0f / s);
    se += (v - qx) * (v - qx);
    xx += double(v) * v;
  }
  EXPECT_EQ(m->count, x.numel());
  EXPECT_EQ(m->overflow, overflow);
  EXPECT_GT(overflow, 0);
  EXPECT_EQ(m->underflow, underflow);
  EXPECT_GE(underflow, 1);
  EXPECT_NEAR(m->mse, se / x.numel(), 1e-6 * se / x.numel());
  EXPECT_NEAR(m->sqnr_db, 10 * std::log10(xx / se), 1e-3);
  EXPECT_NEAR(m->overflow_pct, 100.0 * overflow / x.numel(), 1e-9);
}

TEST(Fp8Watch, StepsFollowStartFreqAndEnd) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      model, fp8_options(out, sentinel::Fp8Options().start_step(1).freq(2).end_step(3).drift_alarm(1e9).overflow_alarm(1.0)));
  torch::NoGradGuard no_grad;
  std::vector<int64_t> probed;
  for (int t = 0; t < 6; ++t) {
    debug.forward(small_input());
    const auto ms = debug.fp8_metrics();
    if (!ms.empty() && ms.front().step == t) probed.push_back(t);
  }
  EXPECT_EQ(probed, (std::vector<int64_t>{1, 3}));
}

TEST(Fp8Watch, GradientsAreE5M2SlotsInHybrid) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, fp8_options(out, sentinel::Fp8Options().drift_alarm(1e9).overflow_alarm(1.0)));
  auto loss = debug.forward(small_input()).pow(2).sum();
  debug.backward(loss);
  const auto ms = debug.fp8_metrics();
  const auto* g = find_slot(ms, "fc2", "gradient");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->format, "E5M2");
  EXPECT_EQ(find_slot(ms, "fc2", "weight")->format, "E4M3");
  EXPECT_EQ(g->step, 0);
}

TEST(Fp8Watch, DriftAlarmFiresWhileOverflowIsStillSmall) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      model, fp8_options(out, sentinel::Fp8Options().layers("fc1").drift_alarm(0.25).alarm_action(sentinel::Action::Throw)));
  torch::NoGradGuard no_grad;
  auto x = torch::randn({256, 4});
  debug.forward(x);
  debug.forward(x);  // steady: drift 0
  try {
    debug.forward(x * 1.3f);  // amax grows 30%: drift log2(1.3) = 0.38 > 0.25
    FAIL() << "expected an FP8 alarm";
  } catch (const sentinel::Fp8AlarmError& e) {
    const auto& r = e.report();
    EXPECT_EQ(r.kind, "fp8_alarm");
    EXPECT_EQ(r.batch_number, 2);
    ASSERT_FALSE(r.fp8_alarms.empty());
    const auto& a = r.fp8_alarms.front();
    EXPECT_EQ(a.metrics.module_path, "fc1");
    EXPECT_NEAR(a.metrics.drift_log2, std::log2(1.3), 1e-3);
    EXPECT_NE(a.reason.find("drift 0.38 > 0.25"), std::string::npos) << a.reason;
    EXPECT_LT(a.metrics.overflow_pct, 1.0);  // caught before the overflows are large
    EXPECT_NE(std::string(e.what()).find("FP8 alarm during batch_number=2"), std::string::npos);
  }
}

TEST(Fp8Watch, MetricsLogHasOneJsonLinePerSlotAndStep) {
  torch::manual_seed(0);
  Mlp model;
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_fp8_log";
  std::filesystem::remove_all(dir);
  std::ostringstream out;
  {
    sentinel::DebugUnderflowOverflow debug(model, fp8_options(out, sentinel::Fp8Options().drift_alarm(1e9).overflow_alarm(1.0))
                                                      .report_dir(dir.string()));
    torch::NoGradGuard no_grad;
    for (int t = 0; t < 3; ++t) debug.forward(small_input());
  }
  std::ifstream log(dir / "fp8_metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(log, line); ++lines) {
    auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("drift_log2"));
    EXPECT_TRUE(j["role"] == "activation" || j["role"] == "weight");
  }
  EXPECT_EQ(lines, 3 * 4);  // 3 steps x (fc1, fc2) x (activation, weight)
  std::filesystem::remove_all(dir);
}

TEST(Fp8Watch, BadOptionsAreClearErrors) {
  Mlp model;
  auto error_of = [&](sentinel::Fp8Options o) -> std::string {
    try {
      std::ostringstream out;
      sentinel::Watchdog w(model.ptr(), sentinel::Options().output(out).fp8(o.enabled(true)));
    } catch (const sentinel::OptionError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of(sentinel::Fp8Options().layers("fc[")).find("fp8 layers regex 'fc[' is invalid"), std::string::npos);
  EXPECT_NE(error_of(sentinel::Fp8Options().freq(0)).find("freq must be at least 1"), std::string::npos);
  // Options of FP8 watching that is off are not looked at.
  std::ostringstream out;
  EXPECT_NO_THROW(sentinel::Watchdog(model.ptr(), sentinel::Options().output(out).fp8(sentinel::Fp8Options().layers("fc["))));
}

}  // namespace
