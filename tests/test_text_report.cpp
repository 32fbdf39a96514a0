// The text report: HF's layout, checked line by line and against golden files.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <regex>
#include <sstream>

#include "cli/demo_model.h"
#include "support/golden.h"

namespace {

sentinel::Entry tensor_entry(const std::string& label, double mn, double mx, int64_t inf = 0, int64_t nan = 0) {
  sentinel::Entry e;
  e.label = label;
  e.dtype = "float32";
  e.stats.count = 10;
  e.stats.abs_min = mn;
  e.stats.abs_max = mx;
  e.stats.pos_inf = inf;
  e.stats.nan = nan;
  return e;
}

sentinel::Report sample_report() {
  sentinel::Report r;
  r.batch_number = 4;
  sentinel::Frame a;
  a.batch_number = 3;
  a.module_path = "encoder.block.2.layer.1.layer_norm";
  a.module_class = "T5LayerNorm";
  a.op = "aten::mul";
  a.entries = {tensor_entry("weight", 8.69e-02, 4.18e-01), tensor_entry("input[0]", 2.65e-04, 3.42e+03),
               tensor_entry("output", 1.79e-06, 4.65e+00)};
  sentinel::Frame b;
  b.batch_number = 4;
  b.module_path = "";
  b.module_class = "T5ForConditionalGeneration";
  b.op = "aten::add";
  sentinel::Entry none;
  none.label = "input[2]";
  none.kind = sentinel::EntryKind::None;
  sentinel::Entry nat;
  nat.label = "output[1]";
  nat.kind = sentinel::EntryKind::NotATensor;
  sentinel::Entry skipped;
  skipped.label = "input[3]";
  skipped.kind = sentinel::EntryKind::Skipped;
  skipped.skip_reason = "sparse";
  b.entries = {tensor_entry("input[0]", 3.18e-04, 6.27e+04), none, skipped,
               tensor_entry("output[0]", 0.0, std::numeric_limits<double>::infinity(), 3),
               tensor_entry("output[2]", 0.0, 1.0, 0, 2), nat};
  b.entries_omitted = 2;
  b.outputs_finite = false;
  r.frames = {a, b};
  r.produced_here = true;
  r.origin = "origin: aten::add in the model's root (T5ForConditionalGeneration) produced the first inf/nan";
  return r;
}

TEST(TextReport, HfLayoutLineByLine) {
  const std::string text = sentinel::render_text(sample_report());
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_GE(lines.size(), 8u);
  EXPECT_EQ(lines[0], "Detected inf/nan during batch_number=4");
  EXPECT_EQ(lines[1], "Last 2 forward frames:");
  EXPECT_EQ(lines[2], "abs min  abs max  metadata");
  // 17 spaces, a space, then path, class and op.
  EXPECT_EQ(lines[3], "                  encoder.block.2.layer.1.layer_norm T5LayerNorm aten::mul");
  EXPECT_EQ(lines[4], "8.69e-02 4.18e-01 weight");
  EXPECT_EQ(lines[5], "2.65e-04 3.42e+03 input[0]");
  // The buffer spans batches: HF's batch marker separates them.
  EXPECT_EQ(lines[7], "");
  EXPECT_EQ(lines[8], "");
  EXPECT_EQ(lines[9], "                  *** Starting batch number=4 ***");
  EXPECT_EQ(lines[10], "abs min  abs max  metadata");
  // The root module has an empty path, as in HF ("                   T5ForConditionalGeneration").
  EXPECT_EQ(lines[11], "                   T5ForConditionalGeneration aten::add");
  EXPECT_EQ(lines[12], "3.18e-04 6.27e+04 input[0]");
  EXPECT_EQ(lines[13], "             None input[2]");
  EXPECT_EQ(lines[14], "           sparse input[3]");
  EXPECT_EQ(lines[15], "0.00e+00      inf output[0]");
  EXPECT_EQ(lines[16], "     nan      nan output[2]");  // torch's min/max propagate NaN
  EXPECT_EQ(lines[17], "     not a tensor output[1]");
  EXPECT_EQ(lines[18], "              ... 2 more entries, checked, not shown");
  sentinel_test::expect_matches_golden(text, "sample_report.txt");
}

TEST(TextReport, DemoReportMatchesGoldenWithNumbersMasked) {
  auto model = sentinel::demo::make_t5_encoder();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  torch::NoGradGuard no_grad;
  try {
    for (auto& b : sentinel::demo::make_batches()) debug.forward(b);
    FAIL();
  } catch (const sentinel::NonFiniteError& e) {
    EXPECT_EQ(out.str(), e.what());  // printed at detection and carried by the exception alike
    sentinel_test::expect_matches_golden(sentinel_test::mask_cpp_stack(sentinel_test::mask_numbers(e.what())),
                                        "demo_report.txt");
  }
}

TEST(TextReport, EveryEntryLineHasHfsColumns) {
  auto model = sentinel::demo::make_t5_encoder();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).trace_batch_nums({0}));
  torch::NoGradGuard no_grad;
  debug.forward(sentinel::demo::make_batches()[0]);
  static const std::regex entry(R"(^([ \d.e+-]{8}|     inf|     nan) ([ \d.e+-]{8}|     inf|     nan) \S+$)");
  static const std::regex frame(R"(^ {18}\S+ \S+ aten::\S+$)");
  std::istringstream in(out.str());
  int frames = 0, entries = 0;
  for (std::string l; std::getline(in, l);) {
    if (l.empty() || l.find("***") != std::string::npos || l == "abs min  abs max  metadata") continue;
    if (std::regex_match(l, frame)) ++frames;
    else if (std::regex_match(l, entry)) ++entries;
    else ADD_FAILURE() << "line in neither format: '" << l << "'";
  }
  EXPECT_GT(frames, 10);
  EXPECT_GT(entries, 2 * frames);
}

}  // namespace
