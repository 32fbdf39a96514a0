// Options::from_yaml and Options::from_config: configs that load, and what they load to.
// (Configs that must fail: test_yaml_config_errors.cpp; the layer selection: test_layer_selection.cpp.)
#include <gtest/gtest.h>
#include <sentinel/errors.h>
#include <sentinel/options.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "config_test_util.h"

namespace {

using sentinel::Action;
using sentinel::Options;
using sentinel::Stat;
using sentinel::StatsCollection;
using sentinel::fp8::Role;
using sentinel_test::ConfigTest;
using sentinel_test::line_containing;

bool selects(const std::string& regex, const std::string& module_path) {
  return std::regex_match(module_path, std::regex(regex, std::regex::ECMAScript));
}

const char* kFullConfig = R"(sentinel:
  max_frames_to_save: 7
  trace_batch_nums: [1, 3]
  abort_after_batch_num: 5
  action: warn
  report_dir: reports
  skip_view_ops: false
  headroom: true
  device_readback_frames: 64
  device_sync_each_op: true
  watch_cuda: false
  read_inputs_beside_ops: false
  reuse_unchanged_parameter_reads: true
  keep_torchscript_fusion: true
  log_dir: logs
  loggers: [jsonl, tensorboard]
  fp8:
    enabled: true
    fp8_format: e4m3
    margin: 2
    amax_history_len: 16
    amax_compute_algo: most_recent
    layers: ".*fc1"
    freq: 2
    start_step: 3
    end_step: 9
    overflow_alarm: 0.01
    drift_alarm: 1.5
    alarm_action: throw
  ranks:
    exchange: false
    timeout_seconds: 2.5
    max_wait_seconds: 30
  save_tensor:
    enabled: true
    dir: saved
    layers: {layer_numbers: [2]}
    freq: 4
    start_step: 8
    end_step: 20
    max_bytes: 1000
    on_detection: false
)";

TEST_F(ConfigTest, EveryWatchdogOptionRoundTrips) {
  const std::string path = write(kFullConfig);
  const Options o = Options::from_yaml(path);
  const Options d;  // the defaults, to make sure each value read is not just the default
  EXPECT_EQ(o.config_path(), path);
  EXPECT_EQ(o.max_frames_to_save(), 7);
  EXPECT_NE(d.max_frames_to_save(), 7);
  EXPECT_EQ(o.trace_batch_nums(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(o.abort_after_batch_num(), std::optional<int64_t>(5));
  EXPECT_EQ(o.action(), Action::Warn);
  EXPECT_EQ(o.report_dir(), "reports");
  EXPECT_FALSE(o.skip_view_ops());
  EXPECT_TRUE(o.headroom());
  EXPECT_EQ(o.device_readback_frames(), 64);
  EXPECT_TRUE(o.device_sync_each_op());
  EXPECT_FALSE(o.watch_cuda());
  EXPECT_FALSE(o.read_inputs_beside_ops());
  EXPECT_TRUE(d.read_inputs_beside_ops());
  EXPECT_TRUE(o.reuse_unchanged_parameter_reads());
  EXPECT_FALSE(d.reuse_unchanged_parameter_reads());
  EXPECT_TRUE(o.keep_torchscript_fusion());
  EXPECT_FALSE(d.keep_torchscript_fusion());
  EXPECT_EQ(o.log_dir(), "logs");
  EXPECT_EQ(o.loggers(), (std::vector<std::string>{"jsonl", "tensorboard"}));
  EXPECT_NE(d.loggers(), o.loggers());

  const sentinel::Fp8Options& f = o.fp8();
  EXPECT_TRUE(f.enabled());
  EXPECT_EQ(f.recipe().format(), sentinel::fp8::FormatPolicy::E4M3);
  EXPECT_EQ(f.recipe().margin(), 2);
  EXPECT_EQ(f.recipe().amax_history_len(), 16);
  EXPECT_EQ(f.recipe().amax_compute_algo(), sentinel::fp8::AmaxAlgo::MostRecent);
  EXPECT_EQ(f.layers(), ".*fc1");
  EXPECT_EQ(f.freq(), 2);
  EXPECT_EQ(f.start_step(), 3);
  EXPECT_EQ(f.end_step(), 9);
  EXPECT_DOUBLE_EQ(f.overflow_alarm(), 0.01);
  EXPECT_DOUBLE_EQ(f.drift_alarm(), 1.5);
  EXPECT_EQ(f.alarm_action(), Action::Throw);

  EXPECT_FALSE(o.ranks().exchange());
  EXPECT_DOUBLE_EQ(o.ranks().timeout_seconds(), 2.5);
  EXPECT_DOUBLE_EQ(o.ranks().max_wait_seconds(), 30.0);

  const sentinel::DumpOptions& s = o.dumps();
  EXPECT_TRUE(s.enabled());
  EXPECT_EQ(s.dir(), "saved");
  EXPECT_TRUE(selects(s.layers(), "model.layers.2.fc1"));
  EXPECT_FALSE(selects(s.layers(), "model.layers.12.fc1"));
  EXPECT_FALSE(selects(s.layers(), "model.layers.1.fc1"));
  EXPECT_EQ(s.freq(), 4);
  EXPECT_EQ(s.start_step(), 8);
  EXPECT_EQ(s.end_step(), 20);
  EXPECT_EQ(s.max_bytes(), 1000);
  EXPECT_FALSE(s.on_detection());

  EXPECT_TRUE(o.stats_collections().empty());
  EXPECT_TRUE(o.config_notes().empty());
}

TEST_F(ConfigTest, EmptySentinelSectionKeepsTheDefaults) {
  const Options o = Options::from_yaml(write("sentinel:\n"));
  const Options d;
  EXPECT_EQ(o.max_frames_to_save(), d.max_frames_to_save());
  EXPECT_EQ(o.action(), d.action());
  EXPECT_EQ(o.loggers(), d.loggers());
  EXPECT_EQ(o.fp8().layers(), ".*");
  EXPECT_FALSE(o.abort_after_batch_num().has_value());
}

TEST_F(ConfigTest, SpellingsYamlAllows) {
  const Options o = Options::from_yaml(write(R"(sentinel:
  headroom: True
  skip_view_ops: no
  action: ABORT
  abort_after_batch_num: ~
  loggers: []
  trace_batch_nums: 4
  fp8:
    fp8_format: hybrid
    drift_alarm: .inf
    overflow_alarm: 1e-4
)"));
  EXPECT_TRUE(o.headroom());
  EXPECT_FALSE(o.skip_view_ops());
  EXPECT_EQ(o.action(), Action::Abort);
  EXPECT_FALSE(o.abort_after_batch_num().has_value());
  EXPECT_TRUE(o.loggers().empty());
  EXPECT_EQ(o.trace_batch_nums(), (std::vector<int64_t>{4}));
  EXPECT_EQ(o.fp8().recipe().format(), sentinel::fp8::FormatPolicy::HYBRID);
  EXPECT_TRUE(std::isinf(o.fp8().drift_alarm()));
  EXPECT_DOUBLE_EQ(o.fp8().overflow_alarm(), 1e-4);
}

// The config under "Performance Specs" in the debug-tools README, verbatim.
const char* kSeedStatCollection = R"(stat_collection:
  enabled: True
  layers:
    layer_name_regex_pattern: .*(fc1|fc2)
  collect_tensor_stats:
    enabled: True
    type: [l1_norm, l2_norm]
    tensors: [activation]
    freq: 100
  transformer_engine:
    collect_tensor_stats:
      enabled: True
      type: [cur_amax, dynamic_range]
      tensors: [activation, gradient]
      freq: 100
    collect_fp8_tensor_stats:
      enabled: True
      type: [overflows, underflows]
      tensors: [activation, gradient]
      freq: 100)";

void expect_collection(const StatsCollection& c, const std::string& name, const std::vector<Stat>& stats,
                       const std::vector<Role>& tensors, int64_t freq, int64_t start, int64_t end,
                       const std::string& source) {
  EXPECT_EQ(c.name(), name);
  EXPECT_EQ(c.stats(), stats) << name;
  EXPECT_EQ(c.tensors(), tensors) << name;
  EXPECT_EQ(c.freq(), freq) << name;
  EXPECT_EQ(c.start_step(), start) << name;
  EXPECT_EQ(c.end_step(), end) << name;
  EXPECT_EQ(c.source(), source) << name;
}

TEST_F(ConfigTest, SeedStatCollectionExample) {
  const std::string text = kSeedStatCollection;
  const std::string path = write(text);
  const Options o = Options::from_yaml(path);
  ASSERT_EQ(o.stats_collections().size(), 3u);
  const auto& c = o.stats_collections();
  const auto at = [&](int nth) { return path + ":" + std::to_string(line_containing(text, "collect_", nth)); };
  expect_collection(c[0], "stat_collection.collect_tensor_stats", {Stat::L1Norm, Stat::L2Norm}, {Role::Activation},
                    100, 0, -1, at(0));
  expect_collection(c[1], "stat_collection.transformer_engine.collect_tensor_stats",
                    {Stat::CurAmax, Stat::DynamicRange}, {Role::Activation, Role::Gradient}, 100, 0, -1, at(1));
  expect_collection(c[2], "stat_collection.transformer_engine.collect_fp8_tensor_stats",
                    {Stat::Overflows, Stat::Underflows}, {Role::Activation, Role::Gradient}, 100, 0, -1, at(2));
  for (const StatsCollection& one : c) {
    EXPECT_EQ(one.layers(), ".*(fc1|fc2)");
    EXPECT_TRUE(selects(one.layers(), "model.decoder.layers.4.mlp.fc1"));
    EXPECT_FALSE(selects(one.layers(), "model.decoder.layers.4.self_attention.qkv"));
  }
  EXPECT_TRUE(o.config_notes().empty());
  // The same config with its section switched off yields nothing.
  std::string off = text;
  off.replace(off.find("enabled: True"), 13, "enabled: False");
  EXPECT_TRUE(Options::from_yaml(write(off, "off.yaml")).stats_collections().empty());
}

// The fragment under "Statistics Collection" in the README, in a section of its own.
TEST_F(ConfigTest, SeedStatisticsFragmentInASection) {
  const std::string text = R"(stats:
  layers:
    layer_numbers: [1-12]
    layer_types: [qkv, mlp, fc1]
  collect_tensor_stats: # Generic logging, only enabled when this field is provided in config
    enabled: True
    type: [min, max, mean, std, l1_norm, l2_norm]
    tensors: [activation, gradient, weight]
    freq: 100 # every 100 training steps
    start_step: 1000 # start logging at this step
    end_step: 5000 # end logging at this step
  transformer_engine:
    collect_tensor_stats: # TE high precision tensor logging
      enabled: True
      type: [cur_amax, dynamic_range]
      tensors: [activation, gradient, weight]
      freq: 100
      start_step: 1000
      end_step: 5000
    collect_fp8_tensor_stats:
      enabled: True
      type: [underflows, overflows]
      tensors: [activation, gradient, weight]
      freq: 100
      start_step: 1000
      end_step: 5000
)";
  const std::string path = write(text);
  const Options o = Options::from_yaml(path);
  ASSERT_EQ(o.stats_collections().size(), 3u);
  const std::vector<Role> all = {Role::Activation, Role::Gradient, Role::Weight};
  const auto at = [&](int nth) { return path + ":" + std::to_string(line_containing(text, "collect_", nth)); };
  const auto& c = o.stats_collections();
  expect_collection(c[0], "stats.collect_tensor_stats",
                    {Stat::Min, Stat::Max, Stat::Mean, Stat::Std, Stat::L1Norm, Stat::L2Norm}, all, 100, 1000, 5000,
                    at(0));
  expect_collection(c[1], "stats.transformer_engine.collect_tensor_stats", {Stat::CurAmax, Stat::DynamicRange}, all,
                    100, 1000, 5000, at(1));
  expect_collection(c[2], "stats.transformer_engine.collect_fp8_tensor_stats", {Stat::Underflows, Stat::Overflows},
                    all, 100, 1000, 5000, at(2));
  // layer_numbers and layer_types together: both must hold.
  EXPECT_TRUE(selects(c[0].layers(), "model.decoder.layers.4.mlp.fc1"));
  EXPECT_TRUE(selects(c[0].layers(), "model.decoder.layers.12.self_attention.qkv"));
  EXPECT_FALSE(selects(c[0].layers(), "model.decoder.layers.13.mlp.fc1"));
  EXPECT_FALSE(selects(c[0].layers(), "model.decoder.layers.0.mlp.fc1"));
  EXPECT_FALSE(selects(c[0].layers(), "model.decoder.layers.4.self_attention.linear_proj"));
}

// The README's TransformerEngine features that change training: accepted, not applied, noted.
TEST_F(ConfigTest, SeedTrainingFeaturesBecomeNotes) {
  const std::string text = R"(fp8_changes:
  enabled: True
  layers:
    layer_types: [fc2]
  transformer_engine:
    disable_fp8_gemm:
      enabled: True
      gemms: [dgrad, wgrad, fprop]
    disable_fp8_layer:
      enabled: False
    per_tensor_scaling:
      gemms: [fprop, dgrad, wgrad]
      margin: 0
switched_off:
  enabled: False
  layers: {layer_types: [all]}
  transformer_engine:
    disable_fp8_layer: {enabled: True}
)";
  const std::string path = write(text);
  const Options o = Options::from_yaml(path);
  EXPECT_TRUE(o.stats_collections().empty());
  ASSERT_EQ(o.config_notes().size(), 2u);
  const std::vector<std::pair<std::string, std::string>> expected = {{"disable_fp8_gemm", "disable_fp8_gemm:"},
                                                                     {"per_tensor_scaling", "per_tensor_scaling:"}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const std::string& note = o.config_notes()[i];
    const std::string prefix = path + ":" + std::to_string(line_containing(text, expected[i].second)) + ": ";
    EXPECT_EQ(note.rfind(prefix, 0), 0u) << note;
    EXPECT_NE(note.find("fp8_changes.transformer_engine." + expected[i].first), std::string::npos) << note;
    EXPECT_NE(note.find("not applied"), std::string::npos) << note;
  }
}

TEST_F(ConfigTest, FeaturesAndSectionsWithoutEnabledAreOn) {
  const std::string text = R"(a:
  layers: {layer_name_regex_pattern: ".*"}
  collect_tensor_stats: {type: [max], tensors: [weight]}
  transformer_engine:
    collect_fp8_tensor_stats: {enabled: false, type: [overflows], tensors: [gradient]}
b:
  enabled: true
  layers: {layer_numbers: [all], layer_types: [all]}
  transformer_engine:
    collect_tensor_stats: {type: [std], tensors: gradient, freq: 3, start_step: 2, end_step: 2}
)";
  const std::string path = write(text);
  const Options o = Options::from_yaml(path);
  ASSERT_EQ(o.stats_collections().size(), 2u);
  const auto& c = o.stats_collections();
  expect_collection(c[0], "a.collect_tensor_stats", {Stat::Max}, {Role::Weight}, 1, 0, -1,
                    path + ":" + std::to_string(line_containing(text, "collect_tensor_stats")));
  expect_collection(c[1], "b.transformer_engine.collect_tensor_stats", {Stat::Std}, {Role::Gradient}, 3, 2, 2,
                    path + ":" + std::to_string(line_containing(text, "collect_tensor_stats", 1)));
  EXPECT_EQ(c[1].layers(), ".*");
  EXPECT_TRUE(selects(c[1].layers(), "anything.at.all"));
}

TEST_F(ConfigTest, SentinelAndSectionsTogetherInDocumentOrder) {
  const std::string text = R"(second:
  layers: {layer_types: [fc2]}
  collect_tensor_stats: {type: [min], tensors: [activation]}
sentinel:
  log_dir: logs
first:
  layers: {layer_types: [fc1]}
  collect_tensor_stats: {type: [max], tensors: [activation]}
)";
  const Options o = Options::from_yaml(write(text));
  ASSERT_EQ(o.stats_collections().size(), 2u);
  EXPECT_EQ(o.stats_collections()[0].name(), "second.collect_tensor_stats");
  EXPECT_EQ(o.stats_collections()[1].name(), "first.collect_tensor_stats");
  EXPECT_EQ(o.log_dir(), "logs");
}

// Sets or clears an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST_F(ConfigTest, FromConfigUnsetOrEmptyGivesDefaults) {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    ScopedEnv env("SENTINEL_CONFIG", value);
    const Options o = Options::from_config();
    EXPECT_TRUE(o.config_path().empty());
    EXPECT_EQ(o.max_frames_to_save(), Options().max_frames_to_save());
    EXPECT_TRUE(o.stats_collections().empty());
  }
}

TEST_F(ConfigTest, FromConfigReadsTheNamedFile) {
  const std::string path = write(std::string(kSeedStatCollection) + "\nsentinel:\n  max_frames_to_save: 3\n");
  ScopedEnv env("SENTINEL_CONFIG", path.c_str());
  const Options o = Options::from_config();
  EXPECT_EQ(o.config_path(), path);
  EXPECT_EQ(o.max_frames_to_save(), 3);
  EXPECT_EQ(o.stats_collections().size(), 3u);
}

TEST_F(ConfigTest, FromConfigReportsAMissingFile) {
  const std::string path = (dir_ / "absent.yaml").string();
  ScopedEnv env("SENTINEL_CONFIG", path.c_str());
  try {
    Options::from_config();
    FAIL() << "expected sentinel::OptionError";
  } catch (const sentinel::OptionError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open config '" + path + "'"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// The option tables' names and the older spellings a config may still use read the same.
TEST_F(ConfigTest, OneSpellingEverywhereAndTheOlderOnesStillRead) {
  const Options unified = Options::from_yaml(write(R"(sentinel:
  action: raise
  log_dir: ~
  fp8:
    format: E4M3
    margin: 1
    recipes: [delayed, float8block]
  dumps:
    enabled: true
    max_bytes: 100
)", "unified.yaml"));
  const Options older = Options::from_yaml(write(R"(sentinel:
  action: throw
  fp8:
    enabled: true
    recipe: {format: e4m3, margin: 1}
    recipes: [Delayed, Float8BlockScaling]
  save_tensor:
    enabled: true
    max_bytes: 100
)", "older.yaml"));
  for (const Options* o : {&unified, &older}) {
    EXPECT_EQ(o->action(), Action::Throw);
    EXPECT_EQ(o->log_dir(), "");
    EXPECT_TRUE(o->fp8().enabled());  // a mapping of FP8 settings turns the probe on
    EXPECT_EQ(o->fp8().recipe().format(), sentinel::fp8::FormatPolicy::E4M3);
    EXPECT_EQ(o->fp8().recipe().margin(), 1);
    ASSERT_EQ(o->fp8().recipes().size(), 2u);
    EXPECT_EQ(o->fp8().recipes()[1], sentinel::fp8::ScalingRecipe::Float8Block);
    EXPECT_TRUE(o->dumps().enabled());
    EXPECT_EQ(o->dumps().max_bytes(), 100);
  }
  // fp8: false keeps the probe off; enabled: false inside a mapping too.
  EXPECT_FALSE(Options::from_yaml(write("sentinel:\n  fp8: false\n", "off.yaml")).fp8().enabled());
  EXPECT_FALSE(Options::from_yaml(write("sentinel:\n  fp8: {enabled: false, margin: 2}\n", "off2.yaml")).fp8().enabled());
}

// A range error of Options::validate() points at the line of the option, even inside a list.
TEST_F(ConfigTest, ValidationErrorsPointAtTheLineThatSetTheOption) {
  expect_error("sentinel:\n  fp8:\n    recipes:\n      - mxfp8\n      - MXFP8\n", 5, {"fp8.recipes[1]", "names 'mxfp8' twice"});
  expect_error("sentinel:\n  ranks:\n    timeout_seconds: 10\n    max_wait_seconds: 5\n", 4,
               {"ranks.max_wait_seconds", "[timeout_seconds, 86400]"});
  expect_error("sentinel:\n  stats_collections:\n    - stats: [min]\n      blockwise_dims: 3\n", 4,
               {"stats_collections[0].blockwise_dims", "must be 1 or 2"});
}

}  // namespace
