// The watchdog's delivery on its own: the detection rule as a seam, the action dispatch, the error
// held for the next safe point, the traced frames. No model and no Watchdog.
#include <gtest/gtest.h>

#include <sentinel/errors.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/delivery.h"
#include "frames/frame_record.h"

namespace {

using sentinel::Action;
using sentinel::Frame;
using sentinel::Options;
using sentinel::Report;
using sentinel::core::Delivery;
using sentinel::core::DetectionPolicy;
using sentinel::frames::FrameRecord;

Report report_of_batch(int64_t batch, const std::string& kind = "nonfinite") {
  Report r;
  r.kind = kind;
  r.batch_number = batch;
  Frame f;
  f.batch_number = batch;
  f.module_path = "fc1";
  f.module_class = "Linear";
  f.op = "aten::addmm";
  r.frames.push_back(f);
  r.origin = "origin: aten::addmm in fc1 produced the first inf/nan";
  return r;
}

FrameRecord frame_of_batch(int64_t batch, bool finite) {
  FrameRecord f;
  f.batch_number = batch;
  f.outputs_finite = finite;
  return f;
}

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(Delivery, TheStrictRuleTripsOnTheFirstNonFiniteFrameOfEachBatchOnly) {
  Options opts;
  std::ostringstream out;
  opts.output(out).action(Action::Warn);
  Delivery d(opts, "");
  EXPECT_FALSE(d.trips(frame_of_batch(0, true)));
  EXPECT_TRUE(d.trips(frame_of_batch(0, false)));
  d.record(report_of_batch(0));
  EXPECT_FALSE(d.trips(frame_of_batch(0, false)));  // batch 0 has reported
  EXPECT_TRUE(d.trips(frame_of_batch(1, false)));
  EXPECT_FALSE(d.has_pending());  // Warn holds no error
  EXPECT_FALSE(d.stopped());
}

TEST(Delivery, ThePolicyIsASeamThatDecidesWhatIsAnError) {
  struct OnlyBatchTwo final : DetectionPolicy {
    Judgement judge(const FrameRecord& f) override {
      Judgement j;
      j.error = f.batch_number == 2;
      return j;
    }
  };
  Options opts;
  Delivery d(opts, "", std::make_unique<OnlyBatchTwo>());
  EXPECT_FALSE(d.trips(frame_of_batch(1, false)));
  EXPECT_TRUE(d.trips(frame_of_batch(2, true)));
}

TEST(Delivery, ThrowHoldsTheReportAsTheErrorOfTheNextSafePointAndStopsRecording) {
  Options opts;
  std::ostringstream out;
  opts.output(out);  // Action::Throw by default
  Delivery d(opts, "");
  const std::string text = d.record(report_of_batch(3));
  EXPECT_NE(text.find("Detected inf/nan during batch_number=3"), std::string::npos);
  EXPECT_TRUE(d.stopped());
  EXPECT_TRUE(d.pending_is_report());
  // An AbortAfterBatch arriving later does not replace it.
  d.hold_error(std::make_exception_ptr(sentinel::AbortAfterBatch(3, 3)), true);
  d.act(*d.last_report(), text, Action::Throw, "inf/nan detected");
  EXPECT_EQ(out.str(), text);  // printed once
  std::exception_ptr e = d.take_pending();
  ASSERT_TRUE(e);
  EXPECT_FALSE(d.stopped());
  EXPECT_FALSE(d.has_pending());
  try {
    std::rethrow_exception(e);
    FAIL() << "nothing thrown";
  } catch (const sentinel::NonFiniteError& error) {
    EXPECT_EQ(error.report().batch_number, 3);
    EXPECT_EQ(error.what(), text);
  }
}

TEST(Delivery, AMissingRankIsHeldAsRanksMissingError) {
  Options opts;
  Delivery d(opts, "");
  d.record(report_of_batch(1, "ranks_missing"));
  EXPECT_THROW(std::rethrow_exception(d.take_pending()), sentinel::RanksMissingError);
}

TEST(Delivery, TheRanksAgreementAmendsTheLastReportAndTheErrorCarryingIt) {
  Options opts;
  Delivery d(opts, "");
  EXPECT_FALSE(d.amend_last_report(sentinel::RankAgreement{}));  // nothing reported yet
  d.record(report_of_batch(2));
  sentinel::RankAgreement agreed;
  agreed.exchanged = true;
  agreed.tripped = {0, 1};
  const auto amended = d.amend_last_report(agreed);
  ASSERT_TRUE(amended);
  EXPECT_EQ(amended->first.ranks.tripped, agreed.tripped);
  EXPECT_EQ(d.last_report()->ranks.tripped, agreed.tripped);
  try {
    std::rethrow_exception(d.take_pending());
    FAIL() << "nothing thrown";
  } catch (const sentinel::NonFiniteError& error) {
    EXPECT_EQ(error.report().ranks.tripped, agreed.tripped);
    EXPECT_EQ(error.what(), amended->second);
  }
}

TEST(Delivery, CallbackPrintsNothingWritesTheFilesAndSaysWhatTheCallbackThrew) {
  const auto dir = fresh_dir("sentinel_delivery_callback");
  std::filesystem::create_directories(dir);
  Options opts;
  std::ostringstream out;
  std::vector<int64_t> seen;
  opts.output(out).action(Action::Callback).callback([&](const Report& r) {
    seen.push_back(r.batch_number);
    throw std::runtime_error("the user's callback failed");
  });
  Delivery d(opts, dir.string());
  const Report r = report_of_batch(4);
  const std::string text = d.record(r);
  EXPECT_FALSE(d.has_pending());
  d.act(r, text, Action::Callback, "inf/nan detected");
  EXPECT_EQ(seen, std::vector<int64_t>{4});
  EXPECT_EQ(out.str(), "sentinel: the report callback threw: the user's callback failed\n");
  std::ifstream written(dir / "sentinel_batch4.txt");
  std::stringstream body;
  body << written.rdbuf();
  EXPECT_EQ(body.str().substr(0, text.size()), text);
  EXPECT_TRUE(std::filesystem::exists(dir / "sentinel_batch4.json"));
}

TEST(Delivery, AFileThatCannotBeWrittenIsSaidAfterTheCompleteReport) {
  const auto dir = fresh_dir("sentinel_delivery_unwritable");
  std::ofstream(dir.string()) << "a file where the directory should be";
  Options opts;
  std::ostringstream out;
  opts.output(out).action(Action::Warn);
  Delivery d(opts, dir.string());
  const Report r = report_of_batch(0);
  const std::string text = d.record(r);
  d.act(r, text, Action::Warn, "inf/nan detected");
  EXPECT_EQ(out.str().substr(0, text.size()), text);
  EXPECT_NE(out.str().find("(the report above is complete)"), std::string::npos) << out.str();
  std::filesystem::remove(dir);
}

TEST(Delivery, AbortSaysWhyRunsTheLastWordsAndAborts) {
  Options opts;
  std::ostringstream out;
  opts.output(out).action(Action::Abort);
  Delivery d(opts, "");
  const Report r = report_of_batch(0);
  const std::string text = d.record(r);
  EXPECT_DEATH(d.act(r, text, Action::Abort, "inf/nan detected", [] { std::cerr << "ranks told\n"; }),
               "inf/nan detected, aborting \\(Action::Abort\\)\nranks told");
}

TEST(Delivery, AnAlarmWaitsAndTheFirstOfSeveralIsKept) {
  Options opts;
  Delivery d(opts, "");
  EXPECT_FALSE(d.take_alarm());
  d.hold_alarm(report_of_batch(5, "fp8_alarm"));
  d.hold_alarm(report_of_batch(6, "fp8_alarm"));
  const auto alarm = d.take_alarm();
  ASSERT_TRUE(alarm);
  EXPECT_EQ(alarm->batch_number, 5);
  EXPECT_FALSE(d.take_alarm());
}

TEST(Delivery, TracedFramesBecomeOneTraceReportPerSnapshotOnlyWithADirectory) {
  Options opts;
  Delivery without_files(opts, "");
  Frame frame;
  frame.batch_number = 1;
  without_files.trace_frame(frame);
  without_files.snapshot_trace([](Report&) {}, false);
  EXPECT_FALSE(without_files.take_trace());

  const auto dir = fresh_dir("sentinel_delivery_trace");
  std::filesystem::create_directories(dir);
  Delivery d(opts, dir.string());
  d.trace_frame(frame);
  d.trace_frame(frame);
  d.snapshot_trace([](Report& r) { r.rank = 7; }, false);
  auto trace = d.take_trace();
  ASSERT_TRUE(trace);
  EXPECT_EQ(trace->kind, "trace");
  EXPECT_EQ(trace->frames.size(), 2u);
  EXPECT_EQ(trace->rank, 7);
  d.snapshot_trace([](Report&) {}, false);
  EXPECT_FALSE(d.take_trace());  // nothing new since
  d.trace_frame(frame);          // a backward frame after the batch: the report again, with it
  d.snapshot_trace([](Report&) {}, true);
  trace = d.take_trace();
  ASSERT_TRUE(trace);
  EXPECT_EQ(trace->frames.size(), 3u);
  d.write_trace(*trace);
  EXPECT_TRUE(std::filesystem::exists(dir / "sentinel_trace_batch1.txt"));
  d.snapshot_trace([](Report&) {}, false);
  EXPECT_FALSE(d.take_trace());  // the new batch starts with none
}

}  // namespace
