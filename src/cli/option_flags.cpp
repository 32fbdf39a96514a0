#include "cli/option_flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sentinel/errors.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "options/field_error.h"
#include "options/option_table.h"
#include "options/words.h"

namespace sentinel::cli {

namespace {

// A documented flag and the option it sets.
struct FlagOption {
  const char* flag;
  const char* path;
  const char* help;
};
constexpr FlagOption kFlags[] = {
    {"--max-frames", "max_frames_to_save", "frames shown in a report (HF's max_frames_to_save)"},
    {"--trace-batches", "trace_batch_nums", "batches to trace frame by frame, e.g. 1,3 (0-indexed)"},
    {"--abort-after", "abort_after_batch_num", "stop after this batch (0-indexed)"},
    {"--report-dir", "report_dir", "write the report as .txt and .json into this directory"},
    {"--log-dir", "log_dir", "where the statistics loggers write (debug_logs/, debug_statistics_logs/, tensorboard/)"},
    {"--loggers", "loggers", "comma-separated: file, jsonl, tensorboard (default: file)"},
    {"--recipes", "fp8.recipes", "replay these FP8 recipes side by side on every GEMM's inputs: delayed,current,mxfp8,nvfp4,float8block"},
    {"--mx-scale-rule", "fp8.mx_scale_rule", "MXFP8 block exponent: round_up (TransformerEngine, default) or ocp_floor"},
    {"--save-tensor-dir", "dumps.dir", "save the selected layers' GEMM tensors here (default: <log-dir>/saved_tensors)"},
};

// One word of the command line as the option tables read it; `rest` is what remains of a
// dotted NAME (`fp8.recipes` at the top level: a mapping of one entry, fp8 -> recipes).
class CliValue : public options::Value {
 public:
  CliValue(std::string rest, std::string text, std::string flag)
      : rest_(std::move(rest)), text_(std::move(text)), flag_(std::move(flag)) {}

  bool is_null() const override { return rest_.empty() && (text_.empty() || text_ == "none"); }
  bool is_boolean() const override { return rest_.empty() && options::boolean_word(text_).has_value(); }
  bool boolean() const override {
    scalar();
    const auto value = options::boolean_word(text_);
    if (!value) fail(fmt::format("expected true or false, got '{}'", text_));
    return *value;
  }
  int64_t integer() const override {
    scalar();
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text_.c_str(), &end, 10);
    if (text_.empty() || *end != '\0' || errno == ERANGE) fail(fmt::format("expected an integer, got '{}'", text_));
    return v;
  }
  double number() const override {
    scalar();
    char* end = nullptr;
    const double v = std::strtod(text_.c_str(), &end);
    if (text_.empty() || *end != '\0') fail(fmt::format("expected a number, got '{}'", text_));
    return v;
  }
  std::string text() const override {
    scalar();
    return text_;
  }
  std::vector<std::unique_ptr<options::Value>> items() const override {
    scalar();
    std::vector<std::unique_ptr<options::Value>> out;
    for (size_t start = 0; !text_.empty() && start <= text_.size();) {
      const size_t comma = std::min(text_.find(',', start), text_.size());
      out.push_back(std::make_unique<CliValue>("", text_.substr(start, comma - start), flag_));
      start = comma + 1;
    }
    return out;
  }
  std::vector<options::Entry> entries(const std::vector<std::string_view>& keys) const override {
    if (rest_.empty()) fail("is a section: give its fields one by one, as --set SECTION.FIELD=VALUE");
    const size_t dot = rest_.find('.');
    std::string key = rest_.substr(0, dot);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      fail(fmt::format("no option '{}' here (options here: {}; `sentinel options` lists them all)", key, fmt::join(keys, ", ")));
    }
    std::vector<options::Entry> out;
    out.push_back({key, std::make_unique<CliValue>(dot == std::string::npos ? "" : rest_.substr(dot + 1), text_, flag_)});
    return out;
  }
  size_t choice(const std::vector<std::string_view>& names) const override {
    scalar();
    const std::string low = options::lower_case(text_);
    for (size_t i = 0; i < names.size(); ++i) {
      if (low == names[i]) return i;
    }
    fail(fmt::format("'{}' is not one of {}", text_, fmt::join(names, ", ")));
  }
  [[noreturn]] void fail(std::string_view message) const override {
    throw OptionError(fmt::format("sentinel: {}: {}", flag_, message));
  }

 private:
  // A section named where an option was wanted.
  void scalar() const {
    if (!rest_.empty()) fail(fmt::format("'{}' is not an option of this section", rest_));
  }

  std::string rest_, text_, flag_;
};

// Sets one option (its dotted path) from text, remembering which flag set it.
void set(Options& o, std::map<std::string, std::string>& flag_of, const std::string& path, const std::string& text,
         const std::string& flag) {
  options::apply(o, CliValue(path, text, flag), options::option_fields());
  flag_of[path] = flag;
}

}  // namespace

void OptionFlags::add_to(CLI::App* app) {
  for (const FlagOption& f : kFlags) app->add_option(f.flag, flag_text_[f.flag], f.help);
  app->add_option("--set", settings_, "set any option: NAME=VALUE, e.g. fp8.recipes=delayed,mxfp8 (`sentinel options` lists them); repeatable")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_flag("--warn", warn_, "report inf/nan and keep running instead of stopping (--set action=warn)");
  app->add_option("--config", config_, "YAML config (docs/config.md); default: $SENTINEL_CONFIG. Flags given here override it");
  app->add_option("--log-tensor-name-pattern", tensor_pattern_,
                  "regex searched in module paths: FP8 metrics and statistics of those layers' GEMM tensors");
  app->add_option("--log-tensor-interval", tensor_interval_, "every N steps (batches)");
  app->add_flag("--save-tensor", save_tensor_, "save the selected layers' GEMM tensors (torch.load opens them)");
}

Options OptionFlags::options() const {
  Options o = config_.empty() ? Options::from_config() : Options::from_yaml(config_);
  std::map<std::string, std::string> flag_of;
  for (const FlagOption& f : kFlags) {
    const std::string& text = flag_text_.at(f.flag);
    if (!text.empty()) set(o, flag_of, f.path, text, f.flag);
  }
  const bool saving = save_tensor_ || !flag_text_.at("--save-tensor-dir").empty();
  if (warn_) set(o, flag_of, "action", "warn", "--warn");
  if (saving) set(o, flag_of, "dumps.enabled", "true", "--save-tensor");
  if (!tensor_pattern_.empty()) {
    // Megatron's hooks search the pattern in the module name; the watchdog matches whole paths.
    const std::string layers = ".*(?:" + tensor_pattern_ + ").*";
    const std::string interval = tensor_interval_.empty() ? "1" : tensor_interval_;
    set(o, flag_of, "fp8.layers", layers, "--log-tensor-name-pattern");
    set(o, flag_of, "fp8.freq", interval, "--log-tensor-interval");
    auto collections = o.stats_collections();
    collections.push_back(StatsCollection()
                              .name("--log-tensor-name-pattern")
                              .layers(layers)
                              .stats({Stat::Min, Stat::Max, Stat::CurAmax, Stat::Underflows, Stat::Overflows})
                              .freq(CliValue("", interval, "--log-tensor-interval").integer())
                              .source("--log-tensor-name-pattern"));
    o.stats_collections(collections);
    if (saving) set(o, flag_of, "dumps.layers", layers, "--log-tensor-name-pattern");
  }
  if (!tensor_interval_.empty() && saving) {
    set(o, flag_of, "dumps.freq", tensor_interval_, "--log-tensor-interval");
  }
  for (const std::string& setting : settings_) {
    const size_t eq = setting.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw OptionError(fmt::format("sentinel: --set '{}': expected NAME=VALUE (`sentinel options` lists the names)", setting));
    }
    set(o, flag_of, setting.substr(0, eq), setting.substr(eq + 1), "--set " + setting.substr(0, eq));
  }
  try {
    o.validate();
  } catch (const options::FieldError& e) {
    const auto it = options::nearest_written(flag_of, e.path());
    if (it == flag_of.end()) throw;  // from the config, which names itself
    throw OptionError(fmt::format("sentinel: {}: {}", it->second, e.detail()));
  }
  return o;
}

}  // namespace sentinel::cli
