// HF's batch rules: trace_batch_nums, abort_after_batch_num, and a frame buffer that stays bounded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <sstream>

#include "support/test_models.h"

namespace {

using namespace sentinel_test;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(Trace, TracedBatchesPrintEveryFrameUnderHfsHeaderAndOnlyThose) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).trace_batch_nums({1, 3}));
  for (int i = 0; i < 4; ++i) debug.forward(small_input());
  const std::string text = out.str();
  EXPECT_EQ(count(text, "*** Starting batch number=1 ***"), 1u);
  EXPECT_EQ(count(text, "*** Starting batch number=3 ***"), 1u);
  EXPECT_EQ(count(text, "*** Starting batch number=0 ***"), 0u);
  EXPECT_EQ(count(text, "*** Starting batch number=2 ***"), 0u);
  EXPECT_EQ(count(text, "\n\n" + std::string(17, ' ') + " *** Starting batch number=1 ***\nabs min  abs max  metadata\n"), 1u);
  // Two traced batches of three ops each (addmm, relu, addmm; the view aten::t is skipped).
  EXPECT_EQ(count(text, " fc1 Linear aten::addmm\n"), 2u);
  EXPECT_EQ(count(text, " fc2 Linear aten::addmm\n"), 2u);
  EXPECT_EQ(count(text, "aten::relu\n"), 2u);
}

TEST(Trace, DetectionIsOffInTracedBatchesAsInHf) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).trace_batch_nums({0}));
  auto bad = small_input();
  bad[0][0] = std::numeric_limits<float>::infinity();
  EXPECT_NO_THROW(debug.forward(bad));                                 // batch 0: traced
  EXPECT_NE(out.str().find("     inf input[1]"), std::string::npos);  // but shown
  EXPECT_THROW(debug.forward(bad), sentinel::NonFiniteError);          // batch 1: detected
}

TEST(AbortAfter, ThrowsOnceTheNamedBatchHasFinished) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).abort_after_batch_num(1));
  EXPECT_NO_THROW(debug.forward(small_input()));
  try {
    debug.forward(small_input());
    FAIL() << "expected AbortAfterBatch after batch 1";
  } catch (const sentinel::AbortAfterBatch& e) {
    EXPECT_EQ(e.batch(), 1);
    EXPECT_NE(std::string(e.what()).find("aborting after batch 1 as requested by abort_after_batch_num=1"),
              std::string::npos);
  }
  EXPECT_EQ(debug.batch_number(), 2);
}

TEST(Ring, StaysBoundedAfterDumpsAndAcrossBatches) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  std::vector<size_t> report_sizes;
  sentinel::DebugUnderflowOverflow debug(
      model, sentinel::Options().output(out).max_frames_to_save(4).callback(
                 [&](const sentinel::Report& r) { report_sizes.push_back(r.frames.size()); }));
  auto bad = small_input();
  bad[1][1] = std::nanf("");
  for (int i = 0; i < 10; ++i) {
    debug.forward(i % 2 ? bad : small_input());
    EXPECT_LE(debug.saved_frames().size(), 4u);
  }
  EXPECT_EQ(report_sizes.size(), 5u);  // one report per bad batch (Callback keeps running)
  for (size_t n : report_sizes) EXPECT_LE(n, 4u);
  EXPECT_EQ(debug.saved_frames().size(), 4u);
}

TEST(Ring, WarnPrintsEachBadBatchOnceAndKeepsRunning) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).action(sentinel::Action::Warn));
  auto bad = small_input();
  bad[1][1] = std::nanf("");
  debug.forward(bad);
  debug.forward(small_input());
  debug.forward(bad);
  EXPECT_EQ(count(out.str(), "Detected inf/nan during batch_number="), 2u);
  EXPECT_EQ(count(out.str(), "Detected inf/nan during batch_number=2"), 1u);
}

}  // namespace
