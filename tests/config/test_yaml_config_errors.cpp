// Configs that must fail: each error names the file, the line of the offending node and what was
// expected there.
#include <gtest/gtest.h>
#include <sentinel/errors.h>
#include <sentinel/options.h>

#include <regex>
#include <string>

#include "config_test_util.h"

namespace {

using sentinel::Options;
using sentinel_test::ConfigTest;

// A valid section around one feature, so that each test varies one thing.
std::string section_with(const std::string& feature_lines) {
  return "sec:\n  layers: {layer_types: [fc1]}\n" + feature_lines;
}

TEST_F(ConfigTest, UnknownKeysListTheAllowedOnes) {
  expect_error("sentinel:\n  max_frames_to_save: 3\n  max_frame: 3\n", 3,
               {"unknown key 'max_frame'", "sentinel", "max_frames_to_save", "trace_batch_nums", "save_tensor"});
  expect_error("sentinel:\n  fp8:\n    enabled: true\n    formt: E4M3\n", 4,
               {"unknown key 'formt'", "sentinel.fp8", "format", "fp8_format", "amax_compute_algo"});
  expect_error("sentinel:\n  ranks: {exchange: true, timeout: 3}\n", 2,
               {"unknown key 'timeout'", "timeout_seconds", "max_wait_seconds"});
  expect_error("sentinel:\n  save_tensor:\n    path: x\n", 3, {"unknown key 'path'", "dir", "on_detection"});
  expect_error("sec:\n  layers: {layer_types: [fc1]}\n  colect_tensor_stats: {}\n", 3,
               {"unknown key 'colect_tensor_stats'", "sec", "collect_tensor_stats", "transformer_engine"});
  expect_error(section_with("  transformer_engine:\n    collect_stats: {}\n"), 4,
               {"unknown key 'collect_stats'", "collect_fp8_tensor_stats", "disable_fp8_gemm", "per_tensor_scaling"});
  expect_error(section_with("  collect_tensor_stats:\n    type: [min]\n    tensors: [weight]\n    every: 3\n"), 6,
               {"unknown key 'every'", "freq", "start_step", "end_step"});
  expect_error("sec:\n  layers:\n    layer_names: [fc1]\n", 3,
               {"unknown key 'layer_names'", "layer_name_regex_pattern", "layer_numbers", "layer_types"});
}

TEST_F(ConfigTest, WrongTypesSayWhatWasExpected) {
  expect_error("sentinel:\n  max_frames_to_save: abc\n", 2, {"max_frames_to_save", "expected an integer, got 'abc'"});
  expect_error("sentinel:\n  max_frames_to_save: 1.5\n", 2, {"expected an integer, got '1.5'"});
  expect_error("sentinel:\n  device_readback_frames: [1]\n", 2, {"expected an integer, got a list"});
  expect_error("sentinel:\n  headroom: maybe\n", 2, {"headroom", "expected true or false, got 'maybe'"});
  expect_error("sentinel:\n  trace_batch_nums: {a: 1}\n", 2, {"trace_batch_nums", "expected a list, got a mapping"});
  expect_error("sentinel:\n  trace_batch_nums:\n    - 1\n    - x\n", 4, {"trace_batch_nums[1]", "expected an integer"});
  expect_error("sentinel:\n  report_dir: [a]\n", 2, {"report_dir", "expected a string, got a list"});
  expect_error("sentinel:\n  skip_view_ops:\n", 2, {"skip_view_ops", "expected true or false, got nothing"});
  expect_error("sentinel:\n  fp8: 3\n", 2, {"sentinel.fp8", "expected a mapping", "'3'"});
  expect_error("sentinel:\n  ranks:\n    timeout_seconds: fast\n", 3, {"expected a number, got 'fast'"});
  expect_error("sentinel:\n  fp8:\n    overflow_alarm: -0.5\n", 3, {"overflow_alarm", ">= 0"});
  expect_error("sentinel: [1, 2]\n", 1, {"sentinel", "expected a mapping", "a list"});
  expect_error("sec: 5\n", 1, {"sec", "expected a mapping"});
  expect_error("sentinel:\n  ? [a, b]\n  : 1\n", 2, {"expected a key name"});
}

TEST_F(ConfigTest, RangesCheckedWhereWritten) {
  expect_error("sentinel:\n  max_frames_to_save: 0\n", 2, {"max_frames_to_save", "at least 1", "got 0"});
  expect_error("sentinel:\n  trace_batch_nums: [1, -2]\n", 2, {"trace_batch_nums[1]", "at least 0"});
  expect_error("sentinel:\n  abort_after_batch_num: -1\n", 2, {"abort_after_batch_num", "at least 0"});
  expect_error("sentinel:\n  max_frames_to_save: 99999999999999999999\n", 2, {"at most"});
  expect_error("sentinel:\n  fp8:\n    amax_history_len: 0\n", 3, {"amax_history_len", "at least 1"});
  expect_error("sentinel:\n  fp8:\n    margin: 9999999999\n", 3, {"margin", "at most"});
  expect_error("sentinel:\n  save_tensor:\n    max_bytes: -1\n", 3, {"max_bytes", "at least 0"});
}

TEST_F(ConfigTest, UnknownEnumValuesListTheAllowedOnes) {
  expect_error("sentinel:\n  action: explode\n", 2, {"action", "unknown value 'explode'", "throw, raise, abort, warn, callback"});
  expect_error("sentinel:\n  action: callback\n", 2, {"callback", "Options::callback"});
  expect_error("sentinel:\n  fp8:\n    alarm_action: Callback\n", 3, {"Options::callback"});
  expect_error("sentinel:\n  fp8:\n    fp8_format: E3M4\n", 3, {"unknown value 'E3M4'", "hybrid, e4m3, e5m2"});
  expect_error("sentinel:\n  fp8:\n    amax_compute_algo: mean\n", 3, {"unknown value 'mean'", "max, most_recent"});
  expect_error("sentinel:\n  loggers:\n    - file\n    - csv\n", 4,
               {"unknown value 'csv'", "file, jsonl, tensorboard"});
  expect_error("sentinel:\n  loggers: [file, file]\n", 2, {"'file' is listed twice"});
}

TEST_F(ConfigTest, StatisticsAndTensors) {
  expect_error(section_with("  collect_tensor_stats:\n    type:\n      - min\n      - median\n    tensors: [weight]\n"),
               6, {"unknown statistic 'median'", "min, max, mean, std, l1_norm, l2_norm, cur_amax, dynamic_range"});
  // A statistic of another feature names the feature that takes it.
  expect_error(section_with("  collect_tensor_stats:\n    type: [underflows]\n    tensors: [weight]\n"), 4,
               {"'underflows' is not a statistic of collect_tensor_stats", "transformer_engine.collect_fp8_tensor_stats"});
  expect_error(section_with("  transformer_engine:\n    collect_fp8_tensor_stats:\n      type: [overflows, min]\n"
                            "      tensors: [weight]\n"),
               5, {"'min' is not a statistic of transformer_engine.collect_fp8_tensor_stats", "underflows, overflows",
                   "collect_tensor_stats"});
  expect_error(section_with("  collect_tensor_stats:\n    type: [min, min]\n    tensors: [weight]\n"), 4,
               {"'min' is listed twice"});
  expect_error(section_with("  collect_tensor_stats:\n    type: []\n    tensors: [weight]\n"), 4, {"type", "empty"});
  expect_error(section_with("  collect_tensor_stats:\n    tensors: [weight]\n"), 3, {"'type' is required"});
  expect_error(section_with("  collect_tensor_stats:\n    type: [max]\n"), 3, {"'tensors' is required"});
  expect_error(section_with("  collect_tensor_stats:\n    type: [max]\n    tensors: [activation, output]\n"), 5,
               {"unknown value 'output'", "activation, gradient, weight"});
  expect_error(section_with("  collect_tensor_stats:\n    type: [max]\n    tensors: []\n"), 5, {"tensors", "empty"});
}

TEST_F(ConfigTest, Schedules) {
  const std::string feature = "  collect_tensor_stats:\n    type: [max]\n    tensors: [weight]\n";
  expect_error(section_with(feature + "    freq: 0\n"), 6, {"freq", "at least 1", "got 0"});
  expect_error(section_with(feature + "    freq: -3\n"), 6, {"freq", "at least 1"});
  expect_error(section_with(feature + "    start_step: -1\n"), 6, {"start_step", "at least 0"});
  expect_error(section_with(feature + "    start_step: 10\n    end_step: 5\n"), 7,
               {"end_step (5) is before start_step (10)"});
  expect_error(section_with(feature + "    end_step: -2\n"), 6, {"end_step", "at least -1"});
  expect_error("sentinel:\n  fp8:\n    freq: 0\n", 3, {"freq", "at least 1"});
  expect_error("sentinel:\n  save_tensor:\n    start_step: 4\n    end_step: 3\n", 4, {"before start_step"});
}

TEST_F(ConfigTest, LayerSelections) {
  const std::string feature = "  collect_tensor_stats: {type: [max], tensors: [weight]}\n";
  expect_error("sec:\n" + feature, 1, {"section 'sec' has no 'layers'"});
  expect_error("sec:\n  layers: {}\n" + feature, 2, {"at least one of layer_name_regex_pattern"});
  expect_error("sec:\n  layers:\n" + feature, 2, {"at least one of layer_name_regex_pattern"});
  expect_error("sec:\n  layers:\n    layer_name_regex_pattern: .*fc1\n    layer_numbers: [1]\n" + feature, 4,
               {"only layer_numbers and layer_types can be used together"});
  expect_error("sec:\n  layers:\n    layer_types: [qkv]\n    layer_name_regex_pattern: .*fc1\n" + feature, 4,
               {"only layer_numbers and layer_types can be used together"});
  expect_error("sec:\n  layers:\n    layer_numbers: []\n" + feature, 3, {"layer_numbers", "empty"});
  expect_error("sec:\n  layers:\n    layer_numbers:\n      - 3\n      - 12-1\n" + feature, 5, {"'12-1' runs backwards"});
  expect_error("sec:\n  layers:\n    layer_numbers: [first]\n" + feature, 3, {"got 'first'", "'1-12'", "'all'"});
  expect_error("sec:\n  layers:\n    layer_numbers: [-3]\n" + feature, 3, {"got '-3'"});
  expect_error("sec:\n  layers:\n    layer_types: ['']\n" + feature, 3, {"empty layer type"});
  expect_error("sec:\n  layers: .*fc1\n" + feature, 2, {"expected a mapping of layer_name_regex_pattern"});
  expect_error("sentinel:\n  fp8:\n    layers: [fc1]\n", 3, {"expected a regex or a mapping"});
  // A disabled section is still checked.
  expect_error("sec:\n  enabled: false\n  layers:\n    layer_numbers: [x]\n" + feature, 4, {"got 'x'"});
  // A section without features needs no layers.
  EXPECT_NO_THROW(Options::from_yaml(write("sec:\n  enabled: true\n", "bare.yaml")));
}

TEST_F(ConfigTest, BadRegexNamesItsLineAndTheRegexError) {
  const std::string bad = "fc(1";
  std::string regex_error_text;
  try {
    std::regex(bad, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    regex_error_text = e.what();
  }
  ASSERT_FALSE(regex_error_text.empty());
  expect_error("sec:\n  enabled: true\n  layers:\n    layer_name_regex_pattern: \"" + bad + "\"\n", 4,
               {"layer_name_regex_pattern", "'" + bad + "'", regex_error_text});
  expect_error("sentinel:\n  fp8:\n    layers: \"" + bad + "\"\n", 3, {"sentinel.fp8.layers", regex_error_text});
  expect_error("sentinel:\n  save_tensor:\n    layers: {layer_name_regex_pattern: \"[a-\"}\n", 3, {"invalid regex"});
}

TEST_F(ConfigTest, TrainingFeaturesAreCheckedLoosely) {
  expect_error(section_with("  transformer_engine:\n    disable_fp8_gemm:\n      gemms: [fprop, xgrad]\n"), 5,
               {"unknown value 'xgrad'", "fprop, dgrad, wgrad"});
  expect_error(section_with("  transformer_engine:\n    disable_fp8_layer:\n      enabled: sometimes\n"), 5,
               {"expected true or false"});
  expect_error(section_with("  transformer_engine:\n    per_tensor_scaling:\n      margin: big\n"), 5,
               {"expected an integer"});
  // Keys of other TransformerEngine versions pass.
  const Options o = Options::from_yaml(
      write(section_with("  transformer_engine:\n    per_tensor_scaling:\n      gemms_struct: [{gemm: fprop}]\n"),
            "loose.yaml"));
  EXPECT_EQ(o.config_notes().size(), 1u);
}

TEST_F(ConfigTest, FileLevelErrors) {
  const std::string missing = (dir_ / "nope.yaml").string();
  try {
    Options::from_yaml(missing);
    FAIL() << "expected sentinel::OptionError";
  } catch (const sentinel::OptionError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open config '" + missing + "'"), std::string::npos) << e.what();
  }
  try {
    Options::from_yaml(dir_.string());
    FAIL() << "expected sentinel::OptionError";
  } catch (const sentinel::OptionError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open config '" + dir_.string() + "'"), std::string::npos);
  }
  // yaml-cpp's ParserException: its mark's line and message.
  expect_error("sentinel:\n  action: warn\n    headroom: true\n", 3, {"YAML syntax error", "illegal map value"});
  expect_error("sentinel:\n  trace_batch_nums: [1, 2\n  action: warn\n", 3, {"YAML syntax error"});
  expect_error("", 1, {"empty"});
  expect_error("# only a comment\n", 1, {"empty"});
  expect_error("- a\n- b\n", 1, {"top level", "a list"});
  expect_error("\n\njust text\n", 3, {"top level", "'just text'"});
  expect_error("sentinel: {}\n---\nsentinel: {}\n", 3, {"one YAML document"});
  expect_error("sentinel:\n  headroom: true\n  action: warn\n  headroom: false\n", 4,
               {"'sentinel.headroom' is given twice (first on line 2)"});
  expect_error("a:\n  layers: {layer_types: [x]}\nsentinel: {}\na: {}\n", 4, {"'a' is given twice"});
}

// What Options::validate() refuses reaches the caller, prefixed with the path and the line of
// the option it names.
TEST_F(ConfigTest, ValidateErrorsPassThrough) {
  std::string path;
  std::string message = error_of("sentinel:\n  max_frames_to_save: 2000000\n", &path);
  EXPECT_EQ(message.rfind(path + ":2: ", 0), 0u) << message;
  EXPECT_NE(message.find("max_frames_to_save must be at most"), std::string::npos) << message;
  message = error_of("sentinel:\n  ranks: {timeout_seconds: 10, max_wait_seconds: 5}\n", &path);
  EXPECT_EQ(message.rfind(path + ":2: ", 0), 0u) << message;
  EXPECT_NE(message.find("max_wait_seconds"), std::string::npos) << message;
}

}  // namespace
