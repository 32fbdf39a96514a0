// Reports read back from their JSON: every field survives the round trip, the text rendered from
// the file is the text of the original, and a malformed file gets an error naming the key.
#include <gtest/gtest.h>
#include <sentinel/errors.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "report/json_read.h"
#include "report_fixtures.h"

namespace {

using sentinel::InputError;
using sentinel::report::parse_report_json;

std::string error_of(const std::string& text) {
  try {
    parse_report_json(text, "r.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JsonRead, EveryFieldSurvivesTheRoundTrip) {
  const sentinel::Report original = report_test::full_report();
  const std::string json = sentinel::render_json(original);
  const sentinel::Report back = parse_report_json(json, "r.json");
  EXPECT_EQ(sentinel::render_json(back), json);
  EXPECT_EQ(sentinel::render_text(back), sentinel::render_text(original));
  // Spot checks on the struct itself, not only through the renderers.
  ASSERT_EQ(back.frames.size(), 2u);
  EXPECT_EQ(back.frames[0].direction, sentinel::Direction::Backward);
  EXPECT_EQ(back.frames[0].forward_op, "aten::mul");
  EXPECT_TRUE(std::isnan(back.frames[0].entries[0].stats.hf_abs_max()));
  const auto& out = back.frames[1].entries[4];
  EXPECT_TRUE(std::isinf(out.stats.abs_max));
  EXPECT_EQ(out.stats.pos_inf, 2);
  EXPECT_EQ(back.frames[1].entries[0].headroom.bf16_underflow, 8);
  EXPECT_EQ(back.frames[1].entries[3].skip_reason, "sparse");
  EXPECT_EQ(back.fp8_metrics[1].block_scales.size(), 2u);
  EXPECT_DOUBLE_EQ(back.fp8_metrics[1].cosine, 0.999987654321);
  EXPECT_TRUE(std::isinf(back.fp8_metrics[0].current_scale));
  ASSERT_TRUE(back.ranks.first.has_value());
  EXPECT_EQ(back.ranks.first->host, "node-a");
  EXPECT_EQ(back.ranks.missing, std::vector<int64_t>{3});
  EXPECT_EQ(back.phase, "evaluation");
  EXPECT_NE(sentinel::render_text(back).find("during batch_number=3 on rank 1 (evaluation)\n"), std::string::npos);
}

TEST(JsonRead, ATraceRendersAsTraceModePrintsIt) {
  sentinel::Report t = report_test::trace();
  const sentinel::Report back = parse_report_json(sentinel::render_json(t), "t.json");
  std::string expected = sentinel::batch_header(0);
  for (const auto& f : t.frames) expected += sentinel::render_frame_text(f);
  EXPECT_EQ(sentinel::render_text(back), expected);
}

TEST(JsonRead, ErrorsNameTheFileAndTheKey) {
  const std::string good = sentinel::render_json(report_test::full_report());
  EXPECT_NE(error_of("{\"schema_version\": ").find("r.json: not JSON"), std::string::npos);
  EXPECT_NE(error_of("").find("not JSON"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("r.json: the document: expected an object"), std::string::npos);

  auto broken = [&](auto edit) {
    nlohmann::json j = nlohmann::json::parse(good);
    edit(j);
    return error_of(j.dump());
  };
  EXPECT_NE(broken([](auto& j) { j["frames"][1]["entries"][4]["stats"].erase("abs_max"); })
                .find("r.json: frames[1].entries[4].stats.abs_max: missing"),
            std::string::npos);
  EXPECT_NE(broken([](auto& j) { j["frames"][0]["direction"] = "sideways"; })
                .find("frames[0].direction: 'sideways' is not one of forward, backward"),
            std::string::npos);
  EXPECT_NE(broken([](auto& j) { j["batch_number"] = "three"; }).find("batch_number: expected an integer"),
            std::string::npos);
  EXPECT_NE(broken([](auto& j) { j["frames"][1]["entries"][0]["stats"]["abs_min"] = "big"; })
                .find("expected a number (or \"inf\", \"-inf\", \"nan\")"),
            std::string::npos);
  EXPECT_NE(broken([](auto& j) { j["schema_version"] = 99; }).find("version 99 is not read by this build"),
            std::string::npos);
  EXPECT_NE(broken([](auto& j) { j["kind"] = "story"; }).find("kind: 'story' is not a kind of report"),
            std::string::npos);
  EXPECT_NE(broken([](auto& j) { j["fp8_metrics"][1]["block_scales"][0] = {1.0}; }).find("expected [scale, blocks]"),
            std::string::npos);
}

TEST(JsonRead, FilesThatCannotBeReadSaySo) {
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_json_read_test";
  std::filesystem::create_directories(dir);
  EXPECT_THROW(sentinel::report::read_report_file((dir / "missing.json").string()), InputError);
  const auto cut = dir / "cut.json";
  const std::string good = sentinel::render_json(report_test::full_report());
  std::ofstream(cut) << good.substr(0, good.size() / 2);
  try {
    sentinel::report::read_report_file(cut.string());
    ADD_FAILURE() << "a truncated report parsed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(cut.string() + ": not JSON"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(JsonRead, TheMetricsLogKeepsItsLastLinesAndSkipsBrokenOnes) {
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_metrics_log_test";
  std::filesystem::create_directories(dir);
  const auto path = dir / "fp8_metrics.jsonl";
  sentinel::Fp8SlotMetrics m = report_test::full_report().fp8_metrics[0];
  {
    std::ofstream f(path);
    for (int step = 0; step < 5; ++step) {
      m.step = step;
      f << sentinel::fp8_metrics_json_line(m) << "\n";
      if (step == 2) f << "{\"step\": 2, \"module_path\": \n";  // a line cut short
    }
    f << "{\"step\": 9";  // the last line of a crashed run
  }
  int64_t skipped = 0;
  const auto kept = sentinel::report::read_fp8_metrics_log(path.string(), 3, skipped);
  EXPECT_EQ(skipped, 2);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].step, 2);
  EXPECT_EQ(kept[2].step, 4);
  EXPECT_EQ(sentinel::fp8_metrics_json_line(kept[2]), sentinel::fp8_metrics_json_line(m));
  EXPECT_TRUE(sentinel::report::read_fp8_metrics_log((dir / "none.jsonl").string(), 3, skipped).empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
