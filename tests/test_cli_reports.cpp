// `sentinel report` and `sentinel diff` run as a user runs them, on traces of one model file in
// two precisions (`sentinel run --dtype`).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/shell.h"
#include "support/test_models.h"
#include "support/test_paths.h"

namespace {

namespace fs = std::filesystem;
using sentinel_test::data_path;

sentinel_test::Run sentinel_cli(const std::string& args) {
  return sentinel_test::shell(sentinel_test::cli_program() + " " + args);
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The model of tests/data/make_precision_fixture.py, batch 0 traced into `dir`.
sentinel_test::Run trace_cancellation(const fs::path& dir, const std::string& extra = "") {
  return sentinel_cli("run --model " + data_path("cancel_scripted.pt") + " --inputs " + data_path("cancel_inputs.pt") +
                      " --trace-batches 0 --report-dir " + dir.string() + " " + extra);
}

class CliReports : public ::testing::Test {
 protected:
  void SetUp() override {
    // One directory per test: ctest runs the tests of this fixture in parallel processes.
    dir_ = fs::temp_directory_path() /
           ("sentinel_cli_reports_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CliReports, Bfloat16PartsFromFloat32AtTheCancellingSubtraction) {
  const auto fp32 = trace_cancellation(dir_ / "fp32");
  ASSERT_EQ(fp32.code, 0) << fp32.output;
  const auto bf16 = trace_cancellation(dir_ / "bf16", "--dtype bfloat16");
  ASSERT_EQ(bf16.code, 0) << bf16.output;
  const fs::path a = dir_ / "fp32" / "sentinel_trace_batch0.json", b = dir_ / "bf16" / "sentinel_trace_batch0.json";
  ASSERT_TRUE(fs::exists(a) && fs::exists(b));
  // The bfloat16 run really ran in bfloat16.
  const auto jb = nlohmann::json::parse(read(b));
  EXPECT_EQ(jb["frames"][0]["entries"].back()["dtype"], "bfloat16");

  const auto diff = sentinel_cli("diff " + a.string() + " " + b.string() + " --rtol 0.05 --html " +
                                 (dir_ / "diff.html").string());
  EXPECT_EQ(diff.code, 5) << diff.output;
  EXPECT_NE(diff.output.find("aten::sub #0\n  output abs_max"), std::string::npos) << diff.output;
  EXPECT_NE(diff.output.find("Diverged first at frame"), std::string::npos) << diff.output;
  // The frames before it agree: the row marked first in the growth table is the subtraction.
  const auto marked = diff.output.find("\n>");
  ASSERT_NE(marked, std::string::npos) << diff.output;
  const std::string row = diff.output.substr(marked + 1, diff.output.find('\n', marked + 1) - marked - 1);
  EXPECT_NE(row.find("aten::sub #0  beyond"), std::string::npos) << row;
  EXPECT_NE(diff.output.find("aten::add #0\n"), std::string::npos) << "the addition agrees: " << diff.output;
  EXPECT_NE(read(dir_ / "diff.html").find("first-divergent"), std::string::npos);

  const auto same = sentinel_cli("diff " + a.string() + " " + a.string());
  EXPECT_EQ(same.code, 0) << same.output;
  EXPECT_NE(same.output.find("Same within the tolerance"), std::string::npos) << same.output;
}

TEST_F(CliReports, ReportRendersASavedReportAgain) {
  const auto run = sentinel_cli("run --model " + data_path("mlp_scripted.pt") + " --inputs " +
                                data_path("mlp_inputs_overflow.pt") + " --report-dir " + dir_.string());
  ASSERT_EQ(run.code, 3) << run.output;
  const fs::path json = dir_ / "sentinel_batch2.json";
  const auto text = sentinel_cli("report " + json.string());
  EXPECT_EQ(text.code, 0) << text.output;
  EXPECT_EQ(text.output, read(dir_ / "sentinel_batch2.txt"));
  EXPECT_TRUE(fs::exists(dir_ / "sentinel_batch2.html"));  // written beside the text and JSON

  const auto html = sentinel_cli("report " + json.string() + " --html " + (dir_ / "again.html").string());
  EXPECT_EQ(html.code, 0) << html.output;
  const std::string page = read(dir_ / "again.html");
  EXPECT_NE(page.find("id=\"origin\""), std::string::npos);
  EXPECT_EQ(page, read(dir_ / "sentinel_batch2.html"));
}

TEST_F(CliReports, BadFilesAndOptionsGetTheirOwnExitCodes) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "garbage.json") << "{\"schema_version\": 6, \"kind\": ";
  const auto run = sentinel_cli("run --model " + data_path("mlp_scripted.pt") + " --inputs " +
                                data_path("mlp_inputs_overflow.pt") + " --report-dir " + dir_.string());
  ASSERT_EQ(run.code, 3) << run.output;
  const std::string report = (dir_ / "sentinel_batch2.json").string();
  struct Case {
    std::string args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"report " + (dir_ / "none.json").string(), 4, "cannot open report"},
      {"report " + (dir_ / "garbage.json").string(), 4, "garbage.json: not JSON"},
      {"diff " + report + " " + (dir_ / "garbage.json").string(), 4, "not JSON"},
      {"diff " + report + " " + report, 6, "A is a 'nonfinite' report, not a trace"},
      {"diff " + report + " " + report + " --rtol -1", 2, "'-1' is not a tolerance"},
      {"diff " + report + " " + report + " --atol inf", 2, "'inf' is not a tolerance"},
      {"report " + report + " --html /proc/sentinel/x.html", 4, "cannot write '/proc/sentinel/x.html'"},
      {"run --model " + data_path("mlp_scripted.pt") + " --inputs " + data_path("mlp_inputs_clean.pt") +
           " --dtype float8",
       2, "--dtype"},
  };
  for (const auto& c : cases) {
    const auto r = sentinel_cli(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  }
}

}  // namespace
