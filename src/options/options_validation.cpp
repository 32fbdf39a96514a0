#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sentinel/errors.h>
#include <sentinel/options.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <iterator>
#include <string>

#include "options/field_error.h"
#include "options/nonfinite_allowance.h"
#include "options/spellings.h"
#include "options/words.h"

// Options::validate(): every range of every option, checked here and nowhere else; each error
// names the option by its path in the option tables (option_table.h), so that a config can
// point at the line that set it.
namespace sentinel {

namespace {

using options::FieldError;

[[noreturn]] void bad(const std::string& path, const std::string& message) {
  throw FieldError(path, fmt::format("{} {}", path, message));
}

void check_at_least(const std::string& path, int64_t value, int64_t min) {
  if (value < min) bad(path, fmt::format("must be at least {}, got {}", min, value));
}

void check_between(const std::string& path, int64_t value, int64_t min, int64_t max) {
  check_at_least(path, value, min);
  if (value > max) bad(path, fmt::format("must be at most {}, got {}", max, value));
}

// A step schedule: freq, start_step, end_step of one section.
template <class T>
void check_schedule(const std::string& section, const T& t) {
  check_at_least(section + ".freq", t.freq(), 1);
  check_at_least(section + ".start_step", t.start_step(), 0);
  check_at_least(section + ".end_step", t.end_step(), -1);
  if (t.end_step() != -1 && t.end_step() < t.start_step()) {
    bad(section + ".end_step", fmt::format("({}) is before start_step ({})", t.end_step(), t.start_step()));
  }
}

void check_recipes(const std::vector<fp8::ScalingRecipe>& recipes) {
  if (recipes.empty()) bad("fp8.recipes", "must name at least one recipe");
  for (size_t i = 0; i < recipes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (recipes[i] == recipes[j]) {
        bad(fmt::format("fp8.recipes[{}]", i), fmt::format("names '{}' twice", fp8::recipe_name(recipes[i])));
      }
    }
  }
}

void check_fp8(const Fp8Options& fp8, bool have_callback) {
  check_at_least("fp8.amax_history_len", fp8.recipe().amax_history_len(), 1);
  check_schedule("fp8", fp8);
  if (!(fp8.overflow_alarm() >= 0)) bad("fp8.overflow_alarm", fmt::format("must be a fraction >= 0, got {}", fp8.overflow_alarm()));
  if (!(fp8.drift_alarm() >= -1e9)) bad("fp8.drift_alarm", fmt::format("must be a number, got {}", fp8.drift_alarm()));
  check_recipes(fp8.recipes());
  if (!(fp8.block_scaling_amax_epsilon() >= 0 && fp8.block_scaling_amax_epsilon() <= 3.4028234663852886e38)) {
    bad("fp8.block_scaling_amax_epsilon", fmt::format("must be a float >= 0, got {}", fp8.block_scaling_amax_epsilon()));
  }
  if (fp8.enabled() && fp8.alarm_action() == Action::Callback && !have_callback) {
    bad("fp8.alarm_action", "callback needs a callback (set it with Options::callback(fn))");
  }
}

void check_ranks(const RankOptions& ranks) {
  if (ranks.world_size() != -1 && ranks.world_size() < 1) {
    bad("ranks.world_size", fmt::format("must be at least 1 (or -1: from the environment), got {}", ranks.world_size()));
  }
  if (ranks.rank() < -1 || (ranks.world_size() >= 1 && ranks.rank() >= ranks.world_size())) {
    bad("ranks.rank", fmt::format("must be in [0, world_size) (or -1: from the environment), got {}", ranks.rank()));
  }
  if (!(ranks.timeout_seconds() > 0 && ranks.timeout_seconds() <= 86400)) {
    bad("ranks.timeout_seconds", fmt::format("must be in (0, 86400], got {}", ranks.timeout_seconds()));
  }
  if (!(ranks.max_wait_seconds() >= ranks.timeout_seconds() && ranks.max_wait_seconds() <= 86400)) {
    bad("ranks.max_wait_seconds", fmt::format("must be in [timeout_seconds, 86400], got {}", ranks.max_wait_seconds()));
  }
}

void check_collections(const std::vector<StatsCollection>& collections) {
  if (collections.size() > 64) bad("stats_collections", fmt::format("holds at most 64 collections, got {}", collections.size()));
  for (size_t i = 0; i < collections.size(); ++i) {
    const StatsCollection& c = collections[i];
    // A collection from a config's section is named by where it was written.
    const std::string path = fmt::format("stats_collections[{}]", i);
    const std::string named = c.source().empty() ? path : fmt::format("{} ({})", path, c.source());
    if (c.stats().empty()) throw FieldError(path + ".stats", named + " lists no statistics");
    if (c.tensors().empty()) throw FieldError(path + ".tensors", named + " lists no tensors");
    check_schedule(path, c);
    check_between(path + ".blockwise_block_size", c.blockwise_block_size(), 1, int64_t{1} << 20);
    if (c.blockwise_dims() != 1 && c.blockwise_dims() != 2) {
      bad(path + ".blockwise_dims", fmt::format("must be 1 or 2, got {}", c.blockwise_dims()));
    }
  }
}

void check_loggers(const std::vector<std::string>& loggers) {
  for (size_t i = 0; i < loggers.size(); ++i) {
    const std::string path = fmt::format("loggers[{}]", i);
    if (std::find(std::begin(options::kLoggers), std::end(options::kLoggers), loggers[i]) == std::end(options::kLoggers)) {
      bad(path, fmt::format("is an unknown logger '{}' (expected {})", loggers[i], fmt::join(options::kLoggers, ", ")));
    }
    for (size_t j = 0; j < i; ++j) {
      if (loggers[j] == loggers[i]) bad(path, fmt::format("'{}' is listed twice", loggers[i]));
    }
  }
}

}  // namespace

fp8::ScalingRecipe parse_recipe(const std::string& name) {
  const std::string lower = options::lower_case(name);
  for (const auto& s : options::kRecipes) {
    if (lower == s.name) return s.value;
  }
  throw OptionError(fmt::format("sentinel: unknown fp8 recipe '{}' (expected {})", name, options::all_names(options::kRecipes)));
}

std::vector<fp8::ScalingRecipe> parse_recipes(const std::string& list) {
  std::vector<fp8::ScalingRecipe> recipes;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    recipes.push_back(parse_recipe(list.substr(start, comma - start)));
    start = comma + 1;
  }
  check_recipes(recipes);
  return recipes;
}

const char* stat_name(Stat stat) {
  for (const auto& s : options::kStats) {
    if (s.value == stat) return s.name.data();
  }
  return "unknown";
}

bool parse_stat(const std::string& name, Stat& stat) {
  for (const auto& s : options::kStats) {
    if (name == s.name) {
      stat = s.value;
      return true;
    }
  }
  return false;
}

std::ostream& Options::output() const { return output_ ? *output_ : std::cout; }

void Options::validate() const {
  check_between("max_frames_to_save", max_frames_to_save_, 1, 1000000);
  for (size_t i = 0; i < trace_batch_nums_.size(); ++i) {
    check_at_least(fmt::format("trace_batch_nums[{}]", i), trace_batch_nums_[i], 0);
  }
  if (abort_after_batch_num_) check_at_least("abort_after_batch_num", *abort_after_batch_num_, 0);
  if (action_ == Action::Callback && !callback_) {
    bad("action", "callback needs a callback (set it with Options::callback(fn))");
  }
  check_between("device_readback_frames", device_readback_frames_, 1, 1000000);
  check_fp8(fp8_, static_cast<bool>(callback_));
  check_ranks(ranks_);
  check_collections(stats_collections_);
  check_loggers(loggers_);
  for (size_t i = 0; i < allow_nonfinite_.size(); ++i) {
    try {
      options::parse_allowance(allow_nonfinite_[i]);
    } catch (const std::invalid_argument& e) {
      bad(fmt::format("allow_nonfinite[{}]", i), fmt::format("'{}' {}", allow_nonfinite_[i], e.what()));
    }
  }
  check_schedule("dumps", dumps_);
  check_at_least("dumps.max_bytes", dumps_.max_bytes(), 0);
}

}  // namespace sentinel
