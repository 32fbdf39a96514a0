// Options::from_yaml and Options::from_config: the watchdog's own options under `sentinel:`, and
// every other top-level key a section in the layout of TransformerEngine's debug tools, so that
// one file can drive both.
#include <fmt/format.h>
#include <sentinel/errors.h>
#include <sentinel/options.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "config/config_sections.h"
#include "config/yaml_reader.h"

namespace sentinel {

namespace {

using config::Field;
using config::YamlReader;

Action read_action(const YamlReader& r, const Field& field) {
  if (field.node.IsScalar() && config::lower(field.node.Scalar()) == "callback") {
    r.fail(field, fmt::format("{}: 'callback' is set in C++ with Options::callback(fn); a config chooses "
                              "throw, abort or warn",
                              field.name));
  }
  constexpr Action kActions[] = {Action::Throw, Action::Abort, Action::Warn};
  return kActions[r.choice(field, {"throw", "abort", "warn"})];
}

Fp8Options read_fp8(const YamlReader& r, const Field& field) {
  const std::vector<Field> entries =
      r.entries(field, {"enabled", "fp8_format", "margin", "amax_history_len", "amax_compute_algo", "layers", "freq",
                        "start_step", "end_step", "overflow_alarm", "drift_alarm", "alarm_action", "recipes",
                        "mx_scale_rule", "block_scaling_pow2_scales", "block_scaling_amax_epsilon"});
  Fp8Options fp8;
  fp8::Recipe recipe;
  for (const Field& e : entries) {
    if (e.key == "enabled") {
      fp8.enabled(r.boolean(e));
    } else if (e.key == "fp8_format") {
      constexpr fp8::FormatPolicy kFormats[] = {fp8::FormatPolicy::HYBRID, fp8::FormatPolicy::E4M3,
                                                fp8::FormatPolicy::E5M2};
      recipe.format(kFormats[r.choice(e, {"HYBRID", "E4M3", "E5M2"})]);
    } else if (e.key == "margin") {
      recipe.margin(static_cast<int>(r.integer(e, INT_MIN, INT_MAX)));
    } else if (e.key == "amax_history_len") {
      recipe.amax_history_len(static_cast<int>(r.integer(e, 1, INT_MAX)));
    } else if (e.key == "amax_compute_algo") {
      recipe.amax_compute_algo(r.choice(e, {"max", "most_recent"}) == 0 ? fp8::AmaxAlgo::Max
                                                                        : fp8::AmaxAlgo::MostRecent);
    } else if (e.key == "layers") {
      fp8.layers(config::read_layers(r, e, true));
    } else if (e.key == "overflow_alarm") {
      const double v = r.number(e);
      if (!(v >= 0)) r.fail(e, fmt::format("{}: must be a fraction >= 0, got {}", e.name, e.node.Scalar()));
      fp8.overflow_alarm(v);
    } else if (e.key == "drift_alarm") {
      const double v = r.number(e);
      if (std::isnan(v)) r.fail(e, fmt::format("{}: must be a number, got {}", e.name, e.node.Scalar()));
      fp8.drift_alarm(v);
    } else if (e.key == "alarm_action") {
      fp8.alarm_action(read_action(r, e));
    } else if (e.key == "recipes") {
      constexpr fp8::ScalingRecipe kRecipes[] = {fp8::ScalingRecipe::Delayed, fp8::ScalingRecipe::Current,
                                                 fp8::ScalingRecipe::MXFP8, fp8::ScalingRecipe::NVFP4,
                                                 fp8::ScalingRecipe::Float8Block};
      std::vector<fp8::ScalingRecipe> recipes;
      for (const Field& item : r.list(e)) {
        const fp8::ScalingRecipe chosen =
            kRecipes[r.choice(item, {"delayed", "current", "mxfp8", "nvfp4", "float8block"})];
        if (std::find(recipes.begin(), recipes.end(), chosen) != recipes.end()) {
          r.fail(item, fmt::format("{}: names '{}' twice", e.name, fp8::recipe_name(chosen)));
        }
        recipes.push_back(chosen);
      }
      if (recipes.empty()) r.fail(e, fmt::format("{}: must name at least one recipe", e.name));
      fp8.recipes(recipes);
    } else if (e.key == "mx_scale_rule") {
      fp8.mx_scale_rule(r.choice(e, {"round_up", "ocp_floor"}) == 0 ? fp8::MxScaleRule::RoundUp
                                                                    : fp8::MxScaleRule::OcpFloor);
    } else if (e.key == "block_scaling_pow2_scales") {
      fp8.block_scaling_pow2_scales(r.boolean(e));
    } else if (e.key == "block_scaling_amax_epsilon") {
      const double v = r.number(e);
      if (!(v >= 0 && v <= 3.4028234663852886e38)) {
        r.fail(e, fmt::format("{}: must be a float >= 0, got {}", e.name, e.node.Scalar()));
      }
      fp8.block_scaling_amax_epsilon(v);
    }
  }
  const config::Schedule s = config::read_schedule(r, entries);
  return fp8.recipe(recipe).freq(s.freq).start_step(s.start_step).end_step(s.end_step);
}

RankOptions read_ranks(const YamlReader& r, const Field& field) {
  RankOptions ranks;
  for (const Field& e : r.entries(field, {"exchange", "timeout_seconds", "max_wait_seconds"})) {
    if (e.key == "exchange") ranks.exchange(r.boolean(e));
    else if (e.key == "timeout_seconds") ranks.timeout_seconds(r.number(e));
    else if (e.key == "max_wait_seconds") ranks.max_wait_seconds(r.number(e));
  }
  return ranks;
}

DumpOptions read_save_tensor(const YamlReader& r, const Field& field) {
  const std::vector<Field> entries = r.entries(
      field, {"enabled", "dir", "layers", "freq", "start_step", "end_step", "max_bytes", "on_detection"});
  DumpOptions dumps;
  for (const Field& e : entries) {
    if (e.key == "enabled") dumps.enabled(r.boolean(e));
    else if (e.key == "dir") dumps.dir(r.string(e));
    else if (e.key == "layers") dumps.layers(config::read_layers(r, e, true));
    else if (e.key == "max_bytes") dumps.max_bytes(r.integer(e, 0));
    else if (e.key == "on_detection") dumps.on_detection(r.boolean(e));
  }
  const config::Schedule s = config::read_schedule(r, entries);
  return dumps.freq(s.freq).start_step(s.start_step).end_step(s.end_step);
}

std::vector<std::string> read_loggers(const YamlReader& r, const Field& field) {
  static const std::vector<std::string_view> kLoggers = {"file", "jsonl", "tensorboard"};
  std::vector<std::string> loggers;
  // An empty list is meaningful: only the custom loggers get the statistics.
  if (field.node.IsSequence() && field.node.size() == 0) return loggers;
  for (const Field& item : r.list(field)) {
    std::string name(kLoggers[r.choice(item, kLoggers)]);
    if (std::find(loggers.begin(), loggers.end(), name) != loggers.end()) {
      r.fail(item, fmt::format("{}: '{}' is listed twice", field.name, name));
    }
    loggers.push_back(std::move(name));
  }
  return loggers;
}

void read_sentinel(const YamlReader& r, const Field& field, Options& o) {
  const std::vector<Field> entries =
      r.entries(field, {"max_frames_to_save", "trace_batch_nums", "abort_after_batch_num", "action", "report_dir",
                        "skip_view_ops", "headroom", "device_readback_frames", "device_sync_each_op", "watch_cuda",
                        "read_inputs_beside_ops", "reuse_unchanged_parameter_reads", "keep_torchscript_fusion",
                        "log_dir", "loggers", "fp8", "ranks", "save_tensor"});
  // Upper bounds are left to Options::validate(), the one place that knows them.
  for (const Field& e : entries) {
    if (e.key == "max_frames_to_save") {
      o.max_frames_to_save(r.integer(e, 1));
    } else if (e.key == "trace_batch_nums") {
      std::vector<int64_t> batches;
      if (!(e.node.IsSequence() && e.node.size() == 0)) {
        for (const Field& item : r.list(e)) batches.push_back(r.integer(item, 0));
      }
      o.trace_batch_nums(std::move(batches));
    } else if (e.key == "abort_after_batch_num") {
      // `~` (null) keeps running, as the default does.
      o.abort_after_batch_num(e.node.IsNull() ? std::nullopt : std::optional<int64_t>(r.integer(e, 0)));
    } else if (e.key == "action") {
      o.action(read_action(r, e));
    } else if (e.key == "report_dir") {
      o.report_dir(r.string(e));
    } else if (e.key == "skip_view_ops") {
      o.skip_view_ops(r.boolean(e));
    } else if (e.key == "headroom") {
      o.headroom(r.boolean(e));
    } else if (e.key == "device_readback_frames") {
      o.device_readback_frames(r.integer(e, 1));
    } else if (e.key == "device_sync_each_op") {
      o.device_sync_each_op(r.boolean(e));
    } else if (e.key == "watch_cuda") {
      o.watch_cuda(r.boolean(e));
    } else if (e.key == "read_inputs_beside_ops") {
      o.read_inputs_beside_ops(r.boolean(e));
    } else if (e.key == "reuse_unchanged_parameter_reads") {
      o.reuse_unchanged_parameter_reads(r.boolean(e));
    } else if (e.key == "keep_torchscript_fusion") {
      o.keep_torchscript_fusion(r.boolean(e));
    } else if (e.key == "log_dir") {
      o.log_dir(r.string(e));
    } else if (e.key == "loggers") {
      o.loggers(read_loggers(r, e));
    } else if (e.key == "fp8") {
      o.fp8(read_fp8(r, e));
    } else if (e.key == "ranks") {
      o.ranks(read_ranks(r, e));
    } else if (e.key == "save_tensor") {
      o.dumps(read_save_tensor(r, e));
    }
  }
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw OptionError(fmt::format("sentinel: cannot open config '{}': it is a directory", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw OptionError(fmt::format("sentinel: cannot open config '{}': {}", path,
                                  err ? std::strerror(err) : "cannot be read"));
  }
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw OptionError(fmt::format("sentinel: cannot read config '{}'", path));
  return text;
}

YAML::Node parse(const YamlReader& r, const std::string& text) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    r.fail(e.mark.is_null() ? 1 : e.mark.line + 1, fmt::format("YAML syntax error: {}", e.msg));
  }
  // A second document would be read by no one.
  if (documents.size() > 1) {
    r.fail(YamlReader::line_of(documents[1], 1),
           fmt::format("a config is one YAML document, this file has {} (remove the '---' separators)",
                       documents.size()));
  }
  return documents.empty() ? YAML::Node() : documents[0];
}

}  // namespace

Options Options::from_yaml(const std::string& path) {
  const YamlReader r(path);
  const YAML::Node root = parse(r, read_file(path));
  if (!root.IsMap()) {
    if (root.IsNull()) {
      r.fail(YamlReader::line_of(root, 1),
             "the config is empty (expected a mapping: `sentinel:` options and/or debug-tools sections)");
    }
    r.fail(YamlReader::line_of(root, 1),
           fmt::format("expected a mapping at the top level (`sentinel:` options and/or debug-tools sections), got {}",
                       YamlReader::describe(root)));
  }
  Options options;
  config::SectionResult sections;
  const Field top{"", "", root, 1, 1};
  for (const Field& entry : r.entries(top, {})) {
    if (entry.key == "sentinel") read_sentinel(r, entry, options);
    else config::read_section(r, entry, sections);
  }
  options.stats_collections(std::move(sections.collections));
  options.config_notes(std::move(sections.notes));
  options.config_path(path);
  try {
    options.validate();
  } catch (const OptionError& e) {
    throw OptionError(fmt::format("{}: {}", path, e.what()));
  }
  return options;
}

Options Options::from_config() {
  const char* path = std::getenv("SENTINEL_CONFIG");
  if (path == nullptr || *path == '\0') return Options();
  return from_yaml(path);
}

}  // namespace sentinel
