#include <sentinel/errors.h>
#include <sentinel/options.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <iterator>
#include <string>

namespace sentinel {

namespace {

constexpr const char* kStatNames[] = {"min",        "max",       "mean",    "std",           "l1_norm",
                                      "l2_norm",    "cur_amax",  "dynamic_range", "underflows", "overflows",
                                      "max_blockwise_dynamic_range"};

static_assert(std::size(kStatNames) == static_cast<size_t>(Stat::MaxBlockwiseDynamicRange) + 1,
              "a name for every Stat, in order");

constexpr fp8::ScalingRecipe kRecipes[] = {fp8::ScalingRecipe::Delayed, fp8::ScalingRecipe::Current,
                                           fp8::ScalingRecipe::MXFP8, fp8::ScalingRecipe::NVFP4,
                                           fp8::ScalingRecipe::Float8Block};

void check_recipes(const std::vector<fp8::ScalingRecipe>& recipes) {
  if (recipes.empty()) throw OptionError("sentinel: fp8 recipes must name at least one recipe");
  for (size_t i = 0; i < recipes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (recipes[i] == recipes[j]) {
        throw OptionError(std::string("sentinel: fp8 recipes name '") + fp8::recipe_name(recipes[i]) + "' twice");
      }
    }
  }
}

}  // namespace

fp8::ScalingRecipe parse_recipe(const std::string& name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (fp8::ScalingRecipe r : kRecipes) {
    if (lower == fp8::recipe_name(r)) return r;
  }
  if (lower == "float8blockscaling" || lower == "float8_block") return fp8::ScalingRecipe::Float8Block;
  throw OptionError("sentinel: unknown fp8 recipe '" + name +
                    "' (expected delayed, current, mxfp8, nvfp4 or float8block)");
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
  const auto i = static_cast<size_t>(stat);
  return i < std::size(kStatNames) ? kStatNames[i] : "unknown";
}

bool parse_stat(const std::string& name, Stat& stat) {
  for (size_t i = 0; i < std::size(kStatNames); ++i) {
    if (name == kStatNames[i]) {
      stat = static_cast<Stat>(i);
      return true;
    }
  }
  return false;
}

std::ostream& Options::output() const { return output_ ? *output_ : std::cout; }

void Options::validate() const {
  if (max_frames_to_save_ < 1) {
    throw OptionError("sentinel: max_frames_to_save must be at least 1, got " + std::to_string(max_frames_to_save_));
  }
  if (max_frames_to_save_ > 1000000) {
    throw OptionError("sentinel: max_frames_to_save must be at most 1000000, got " +
                      std::to_string(max_frames_to_save_));
  }
  for (int64_t b : trace_batch_nums_) {
    if (b < 0) {
      throw OptionError("sentinel: trace_batch_nums are 0-indexed batch numbers, got " + std::to_string(b));
    }
  }
  if (abort_after_batch_num_ && *abort_after_batch_num_ < 0) {
    throw OptionError("sentinel: abort_after_batch_num must be >= 0, got " + std::to_string(*abort_after_batch_num_));
  }
  if (device_readback_frames_ < 1 || device_readback_frames_ > 1000000) {
    throw OptionError("sentinel: device_readback_frames must be between 1 and 1000000, got " +
                      std::to_string(device_readback_frames_));
  }
  if (fp8_.enabled() && fp8_.freq() < 1) {
    throw OptionError("sentinel: fp8 freq must be at least 1, got " + std::to_string(fp8_.freq()));
  }
  if (fp8_.enabled() && !(fp8_.overflow_alarm() >= 0 && fp8_.drift_alarm() >= -1e9)) {
    throw OptionError("sentinel: fp8 alarm thresholds must be numbers, overflow_alarm >= 0");
  }
  if (fp8_.enabled()) check_recipes(fp8_.recipes());
  if (!(fp8_.block_scaling_amax_epsilon() >= 0 && fp8_.block_scaling_amax_epsilon() <= 3.4028234663852886e38)) {
    throw OptionError("sentinel: fp8 block_scaling_amax_epsilon must be a float >= 0, got " +
                      std::to_string(fp8_.block_scaling_amax_epsilon()));
  }
  if (ranks_.world_size() != -1 && ranks_.world_size() < 1) {
    throw OptionError("sentinel: ranks world_size must be at least 1 (or -1: from the environment), got " +
                      std::to_string(ranks_.world_size()));
  }
  if (ranks_.rank() < -1 || (ranks_.world_size() >= 1 && ranks_.rank() >= ranks_.world_size())) {
    throw OptionError("sentinel: ranks rank must be in [0, world_size) (or -1: from the environment), got " +
                      std::to_string(ranks_.rank()));
  }
  if (!(ranks_.timeout_seconds() > 0 && ranks_.timeout_seconds() <= 86400)) {
    throw OptionError("sentinel: ranks timeout_seconds must be in (0, 86400], got " +
                      std::to_string(ranks_.timeout_seconds()));
  }
  if (!(ranks_.max_wait_seconds() >= ranks_.timeout_seconds() && ranks_.max_wait_seconds() <= 86400)) {
    throw OptionError("sentinel: ranks max_wait_seconds must be in [timeout_seconds, 86400], got " +
                      std::to_string(ranks_.max_wait_seconds()));
  }
  for (const auto& name : loggers_) {
    if (name != "file" && name != "jsonl" && name != "tensorboard") {
      throw OptionError("sentinel: unknown logger '" + name + "' (expected file, jsonl or tensorboard)");
    }
  }
  if ((action_ == Action::Callback || (fp8_.enabled() && fp8_.alarm_action() == Action::Callback)) && !callback_) {
    throw OptionError("sentinel: Action::Callback needs a callback (set it with Options::callback(fn))");
  }
}

}  // namespace sentinel
