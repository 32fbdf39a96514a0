// The step observers on their own: the FP8 monitor's step closed into metrics and an alarm, the
// collections' records handed to a logger, the selections checked against the model's modules.
// Fed the numbers a read would give; no tensor, no model, no Watchdog.
#include <gtest/gtest.h>

#include <sentinel/errors.h>
#include <sentinel/fp8_scaling.h>
#include <sentinel/loggers.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/step_observers.h"

namespace {

using sentinel::Options;
using sentinel::core::StepObservers;

const std::vector<std::string> kModules = {"", "fc1", "fc2"};

TEST(StepObservers, AnFp8SelectionThatSelectsNoModuleIsAnOptionErrorNamingIt) {
  Options opts;
  opts.fp8(sentinel::Fp8Options().enabled(true).layers("attn\\..*"));
  StepObservers observers(opts);
  try {
    observers.attach(kModules, 0, 1);
    FAIL() << "no error";
  } catch (const sentinel::OptionError& e) {
    EXPECT_STREQ(e.what(), "sentinel: fp8 layers 'attn\\..*' match none of the model's 3 modules");
  }
}

TEST(StepObservers, AnOverflowingFp8StepClosesIntoItsMetricsAnAlarmAndTheNextScale) {
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_step_observers_fp8";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Options opts;
  std::ostringstream out;
  opts.output(out).fp8(sentinel::Fp8Options().enabled(true).layers("fc1"));
  StepObservers observers(opts);
  observers.attach(kModules, 0, 1);
  sentinel::frames::PlaceTable places;
  const uint32_t fc1 = places.intern("fc1", "Linear");
  const auto role = sentinel::fp8::Role::Activation;

  // Step 0 casts at scale 1 (no history yet): what a read of |x| up to 1000 found.
  auto target = observers.fp8().target(fc1, role, 0, places);
  EXPECT_EQ(target.scale, 1.0f);
  EXPECT_EQ(target.format, sentinel::fp8::Format::E4M3);
  sentinel::TensorStats stats;
  stats.count = 100;
  stats.abs_min = 0;
  stats.abs_max = 1000;
  sentinel::stats::Fp8ProbeResult probe;
  probe.count = 100;
  probe.overflow = 50;
  observers.fp8().add_result(fc1, role, stats, probe);
  auto alarm = observers.close_step(places, dir.string());
  ASSERT_TRUE(alarm);
  EXPECT_EQ(alarm->kind, "fp8_alarm");
  EXPECT_EQ(alarm->batch_number, 0);
  ASSERT_EQ(observers.last_fp8_metrics().size(), 1u);
  const auto& m = observers.last_fp8_metrics()[0];
  EXPECT_EQ(m.module_path, "fc1");
  EXPECT_EQ(m.role, "activation");
  EXPECT_EQ(m.cur_amax, 1000);
  EXPECT_EQ(m.overflow, 50);
  EXPECT_DOUBLE_EQ(m.overflow_pct, 50.0);
  std::ifstream jsonl(dir / "fp8_metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(jsonl, line));
  EXPECT_NE(line.find("\"module_path\":\"fc1\""), std::string::npos) << line;

  // Step 1's delayed scale comes from step 0's amax: 448 / 1000, rounded to float once.
  target = observers.fp8().target(fc1, role, 1, places);
  EXPECT_EQ(target.scale, static_cast<float>(448.0 / 1000.0));
  // A step with nothing probed closes into nothing.
  EXPECT_FALSE(observers.close_step(places, ""));
}

struct Recorder : sentinel::StatsLogger {
  std::vector<std::vector<sentinel::StatRecord>> calls;
  bool flushed = false;
  void log(const std::vector<sentinel::StatRecord>& records) override { calls.push_back(records); }
  void flush() override { flushed = true; }
};

TEST(StepObservers, TheCollectionsRecordsReachTheLoggersOnlyWhenHandedOver) {
  Options opts;
  std::ostringstream out;
  auto recorder = std::make_shared<Recorder>();
  opts.output(out)
      .stats_collections({sentinel::StatsCollection().layers("fc2").stats({sentinel::Stat::Max, sentinel::Stat::L1Norm})})
      .add_logger(recorder);
  StepObservers observers(opts);
  observers.attach(kModules, 0, 1);
  sentinel::frames::PlaceTable places;
  const uint32_t fc1 = places.intern("fc1", "Linear"), fc2 = places.intern("fc2", "Linear");
  const auto role = sentinel::fp8::Role::Weight;
  EXPECT_FALSE(observers.collector().wants(0, fc1, role, places));
  ASSERT_TRUE(observers.collector().wants(0, fc2, role, places));
  const float values[] = {-3.0f, 1.0f, 2.0f};
  sentinel::stats::MomentsAccumulator moments;
  moments.add_chunk(values, 3);
  observers.collector().add(fc2, role, 0, moments);
  EXPECT_FALSE(observers.close_step(places, ""));  // no FP8: no alarm
  EXPECT_TRUE(recorder->calls.empty());            // queued, not yet logged
  observers.log_stats();
  ASSERT_EQ(recorder->calls.size(), 1u);
  std::map<std::string, double> by_stat;
  for (const auto& r : recorder->calls[0]) {
    EXPECT_EQ(r.layer, "fc2");
    EXPECT_EQ(r.tensor, "weight");
    EXPECT_EQ(r.step, 0);
    by_stat[r.stat] = r.value;
  }
  EXPECT_EQ(by_stat.size(), 2u);
  EXPECT_DOUBLE_EQ(by_stat["max"], 2.0);
  EXPECT_DOUBLE_EQ(by_stat["l1_norm"], 6.0);
  EXPECT_EQ(observers.last_stats().size(), 2u);
  observers.log_stats();  // nothing new: no call
  EXPECT_EQ(recorder->calls.size(), 1u);
  observers.flush_loggers();
  EXPECT_TRUE(recorder->flushed);
}

}  // namespace
