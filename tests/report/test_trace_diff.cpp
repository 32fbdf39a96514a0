// Two traces aligned and compared: the first frame beyond the tolerance, the growth after it,
// frames in one trace only, occurrences, non-finite values, and traces that cannot be compared.
#include <gtest/gtest.h>

#include <cmath>

#include "report/trace_diff.h"
#include "report_fixtures.h"

namespace {

using sentinel::report::diff_traces;
using sentinel::report::DiffVerdict;

TEST(TraceDiff, IdenticalTracesAreTheSame) {
  const auto d = diff_traces(report_test::trace(), report_test::trace(), 1e-2, 1e-6);
  EXPECT_EQ(d.verdict, DiffVerdict::Same);
  EXPECT_EQ(d.matched.size(), 5u);
  EXPECT_FALSE(d.first_divergent.has_value());
  for (const auto& m : d.matched) {
    EXPECT_EQ(m.worst.score, 0.0);
    EXPECT_EQ(m.entries_compared, 2);
  }
  EXPECT_NE(sentinel::report::render_diff_text(d).find("Same within the tolerance"), std::string::npos);
}

TEST(TraceDiff, NamesTheFirstFrameBeyondTheToleranceAndTheGrowthAfterIt) {
  // B's outputs from frame 3 (aten::sub) on are 10% larger: relative difference 0.1/1.1.
  const auto d = diff_traces(report_test::trace(), report_test::trace(1.1, 3), 1e-2, 0.0);
  ASSERT_EQ(d.verdict, DiffVerdict::Diverged);
  ASSERT_TRUE(d.first_divergent.has_value());
  const auto& f = d.matched[*d.first_divergent];
  EXPECT_EQ(f.op, "aten::sub");
  EXPECT_EQ(f.index_a, 3);
  EXPECT_EQ(f.worst.entry, "output");
  EXPECT_EQ(f.worst.stat, "abs_max");
  EXPECT_DOUBLE_EQ(f.worst.a, 5.0);
  EXPECT_DOUBLE_EQ(f.worst.b, 5.0 * 1.1);
  EXPECT_NEAR(f.worst.relative, 0.1 / 1.1, 1e-12);
  EXPECT_NEAR(f.worst.score, 0.5 / (1e-2 * 5.5), 1e-9);
  EXPECT_TRUE(d.matched[4].diverged);
  EXPECT_FALSE(d.matched[2].diverged);
  const std::string text = sentinel::report::render_diff_text(d);
  EXPECT_NE(text.find("Diverged first at frame 3 of A (frame 3 of B): <root> (Cancellation) aten::sub #0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("output abs_max: A 5.00e+00 B 5.50e+00"), std::string::npos) << text;
  EXPECT_NE(text.find(">      3      3   9.09e-02  <root> (Cancellation) aten::sub #0  beyond"), std::string::npos)
      << text;
  // A looser tolerance accepts the same traces.
  EXPECT_EQ(diff_traces(report_test::trace(), report_test::trace(1.1, 3), 0.2, 0.0).verdict, DiffVerdict::Same);
}

TEST(TraceDiff, AbsMinIsComparedOnTheTensorsScale) {
  // abs_min 1e-3 against 3e-3 is a factor of 3, but tiny beside the tensor's abs_max of 1-6.
  auto b = report_test::trace();
  b.frames[0].entries[0].stats.abs_min = 3e-3;
  const auto d = diff_traces(report_test::trace(), b, 1e-2, 0.0);
  EXPECT_EQ(d.verdict, DiffVerdict::Same);
  EXPECT_NEAR(d.matched[0].worst.relative, 2e-3 / 1.0, 1e-12);
  b.frames[0].entries[0].stats.abs_min = 0.5;  // now half the tensor's range
  EXPECT_EQ(diff_traces(report_test::trace(), b, 1e-2, 0.0).verdict, DiffVerdict::Diverged);
}

TEST(TraceDiff, ANanOnOneSideOnlyDiverges) {
  auto b = report_test::trace();
  b.frames[2].entries[1].stats.nan = 1;
  const auto d = diff_traces(report_test::trace(), b, 1.0, 1.0);
  ASSERT_TRUE(d.first_divergent.has_value());
  EXPECT_EQ(d.matched[*d.first_divergent].op, "aten::add");
  EXPECT_EQ(d.matched[*d.first_divergent].worst.stat, "nan");
  EXPECT_TRUE(std::isinf(d.matched[*d.first_divergent].worst.score));
}

TEST(TraceDiff, FramesAreMatchedByOccurrenceAndExtraFramesListed) {
  auto a = report_test::trace();
  auto b = report_test::trace();
  // B runs one more aten::tanh at the root before the others: A's tanh is B's first tanh (#0),
  // B's second tanh (#1) has no counterpart.
  sentinel::Frame extra = b.frames[1];
  b.frames.insert(b.frames.begin() + 2, extra);
  const auto d = diff_traces(a, b, 1e-2, 1e-6);
  EXPECT_EQ(d.verdict, DiffVerdict::Same);
  EXPECT_EQ(d.matched.size(), 5u);
  ASSERT_EQ(d.only_b.size(), 1u);
  EXPECT_EQ(d.only_b[0].index, 2);
  EXPECT_EQ(d.only_b[0].occurrence, 1);
  EXPECT_EQ(d.matched[2].index_b, 3);  // A's aten::add
  EXPECT_TRUE(d.only_a.empty());
  EXPECT_NE(sentinel::report::render_diff_text(d).find("Frames only in B:\n       2  <root> aten::tanh #1"),
            std::string::npos);
}

TEST(TraceDiff, ReportsThatAreNotTracesOrShareNoFrameAreNotComparable) {
  auto report = report_test::trace();
  report.kind = "nonfinite";
  auto d = diff_traces(report_test::trace(), report, 1e-2, 1e-6);
  EXPECT_EQ(d.verdict, DiffVerdict::NotComparable);
  EXPECT_NE(d.not_comparable.find("B is a 'nonfinite' report, not a trace"), std::string::npos) << d.not_comparable;
  auto other = report_test::trace();
  for (auto& f : other.frames) f.module_path = "elsewhere." + f.module_path;
  d = diff_traces(report_test::trace(), other, 1e-2, 1e-6);
  EXPECT_EQ(d.verdict, DiffVerdict::NotComparable);
  EXPECT_NE(sentinel::report::render_diff_text(d).find("Not comparable: no frame of A (5 frames) matches"),
            std::string::npos);
}

TEST(TraceDiff, EntriesOfAnotherShapeAreNotCompared) {
  auto b = report_test::trace();
  b.frames[4].entries[1].stats.count = 65;
  b.frames[4].entries[1].stats.abs_max = 100.0;
  const auto d = diff_traces(report_test::trace(), b, 1e-2, 1e-6);
  EXPECT_EQ(d.verdict, DiffVerdict::Same);
  EXPECT_EQ(d.matched[4].entries_compared, 1);
  EXPECT_EQ(d.matched[4].entries_unmatched, std::vector<std::string>{"output"});
}

}  // namespace
