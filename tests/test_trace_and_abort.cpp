// HF's batch rules: trace_batch_nums, abort_after_batch_num, and a frame buffer that stays bounded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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

TEST(Trace, TracedBatchesAreWrittenAsTraceReportsWithTheirBackwardFrames) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_trace_files_test";
  std::filesystem::remove_all(dir);
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).trace_batch_nums({1}).report_dir(dir.string()));
  for (int i = 0; i < 3; ++i) {
    auto step = watch.batch();
    auto loss = model->forward(small_input()).pow(2).sum();
    watch.backward(loss);
    step.finish();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "sentinel_trace_batch0.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "sentinel_trace_batch2.json"));
  std::ifstream json_file(dir / "sentinel_trace_batch1.json");
  ASSERT_TRUE(json_file) << "no trace file";
  const auto j = nlohmann::json::parse(json_file);
  EXPECT_EQ(j["kind"], "trace");
  EXPECT_EQ(j["batch_number"], 1);
  std::vector<std::string> forward, backward;
  for (const auto& f : j["frames"]) {
    EXPECT_EQ(f["batch_number"], 1);
    (f["direction"] == "forward" ? forward : backward).push_back(f["op"].get<std::string>());
  }
  // small_input's linspace and mul, the model, the loss, and the seed of its backward.
  const std::vector<std::string> ops = {"aten::linspace", "aten::mul", "aten::addmm", "aten::relu",
                                        "aten::addmm",    "aten::pow", "aten::sum",   "aten::ones_like"};
  EXPECT_EQ(forward, ops);
  ASSERT_FALSE(backward.empty());
  EXPECT_EQ(backward.front(), "SumBackward0");
  EXPECT_EQ(backward.back(), "AccumulateGrad");  // the parameter gradients, checked at the batch's end
  // The text file is what trace mode printed for the batch, every frame of it.
  std::ifstream text_file(dir / "sentinel_trace_batch1.txt");
  const std::string text((std::istreambuf_iterator<char>(text_file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind(sentinel::batch_header(1), 0), 0u);
  EXPECT_NE(out.str().find(text), std::string::npos);
  size_t frame_lines = 0;  // a frame's line begins with HF's 17-space prefix and a space
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) frame_lines += line.rfind(std::string(18, ' '), 0) == 0;
  EXPECT_EQ(frame_lines, j["frames"].size() + 1) << text;  // + the batch header's line
  std::filesystem::remove_all(dir);
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
