#include "config/config_sections.h"

#include "options/words.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "config/layer_selection.h"

namespace sentinel::config {

const Field* find(const std::vector<Field>& entries, std::string_view key) {
  for (const Field& entry : entries) {
    if (entry.key == key) return &entry;
  }
  return nullptr;
}

Schedule read_schedule(const YamlReader& r, const std::vector<Field>& entries) {
  Schedule s;
  if (const Field* f = find(entries, "freq")) s.freq = r.integer(*f, 1);
  if (const Field* f = find(entries, "start_step")) s.start_step = r.integer(*f, 0);
  if (const Field* f = find(entries, "end_step")) {
    s.end_step = r.integer(*f, -1);
    if (s.end_step != -1 && s.end_step < s.start_step) {
      r.fail(*f, fmt::format("{}: end_step ({}) is before start_step ({}) (-1: no end)", f->name, s.end_step,
                             s.start_step));
    }
  }
  return s;
}

namespace {

// A regex checked where it is written, so that its error names its own line.
std::string checked_pattern(const YamlReader& r, const Field& field) {
  LayerSelection selection;
  selection.name_regex = r.string(field);
  try {
    return compile_layer_selection(selection);
  } catch (const std::invalid_argument& e) {
    r.fail(field, fmt::format("{}: {}", field.name, e.what()));
  }
}

LayerNumbers read_numbers(const YamlReader& r, const std::vector<Field>& items) {
  LayerNumbers numbers;
  for (const Field& item : items) {
    try {
      const std::optional<LayerRange> range = parse_layer_numbers_item(r.string(item));
      if (range) numbers.ranges.push_back(*range);
      else numbers.all = true;
    } catch (const std::invalid_argument& e) {
      r.fail(item, fmt::format("{}: {}", item.name, e.what()));
    }
  }
  return numbers;
}

LayerTypes read_types(const YamlReader& r, const std::vector<Field>& items) {
  LayerTypes types;
  for (const Field& item : items) {
    std::string name = r.string(item);
    if (name.empty()) r.fail(item, fmt::format("{}: an empty layer type would select every layer", item.name));
    if (options::lower_case(name) == "all") types.all = true;
    else types.names.push_back(std::move(name));
  }
  return types;
}

}  // namespace

std::string read_layers(const YamlReader& r, const Field& field, bool allow_pattern) {
  if (allow_pattern && field.node.IsScalar()) return checked_pattern(r, field);
  if (!field.node.IsMap() && !field.node.IsNull()) {
    r.fail(field, fmt::format("{}: expected {}a mapping of layer_name_regex_pattern, layer_numbers and/or "
                              "layer_types, got {}",
                              field.name, allow_pattern ? "a regex or " : "", YamlReader::describe(field.node)));
  }
  LayerSelection selection;
  int combined_line = 0;  // the second of two keys that cannot go together
  for (const Field& entry : r.entries(field, {"layer_name_regex_pattern", "layer_numbers", "layer_types"})) {
    if (selection.name_regex || ((selection.numbers || selection.types) && entry.key == "layer_name_regex_pattern")) {
      if (combined_line == 0) combined_line = entry.key_line;
    }
    if (entry.key == "layer_name_regex_pattern") {
      selection.name_regex = checked_pattern(r, entry);
      continue;
    }
    const std::vector<Field> items = r.list(entry);
    if (items.empty()) r.fail(entry, fmt::format("{}: the list is empty (use [all] for every layer)", entry.name));
    if (entry.key == "layer_numbers") selection.numbers = read_numbers(r, items);
    else selection.types = read_types(r, items);
  }
  if (!selection.name_regex && !selection.numbers && !selection.types) {
    r.fail(field.key_line, fmt::format("{}: at least one of layer_name_regex_pattern, layer_numbers and layer_types "
                                       "is required",
                                       field.name));
  }
  if (combined_line != 0) {
    r.fail(combined_line, fmt::format("{}: layer_name_regex_pattern cannot be combined with layer_numbers or "
                                      "layer_types: only layer_numbers and layer_types can be used together",
                                      field.name));
  }
  try {
    return compile_layer_selection(selection);
  } catch (const std::invalid_argument& e) {
    r.fail(field.key_line, fmt::format("{}: {}", field.name, e.what()));  // every case was reported above
  }
}

namespace {

// The statistics each kind of feature collects, and the feature that takes the others, so that a
// statistic put under the wrong feature is pointed to the right one.
const std::vector<Stat> kTensorStats = {Stat::Min,    Stat::Max,    Stat::Mean,         Stat::Std,
                                        Stat::L1Norm, Stat::L2Norm, Stat::CurAmax,      Stat::DynamicRange,
                                        Stat::MaxBlockwiseDynamicRange};
const std::vector<Stat> kFp8Stats = {Stat::Underflows, Stat::Overflows};

struct StatsFeature {
  const char* path;  // below the section: "collect_tensor_stats", "transformer_engine.collect_fp8_tensor_stats"
  const std::vector<Stat>* allowed;
  const char* other;  // the feature that takes the statistics this one does not
};

std::vector<std::string_view> stat_names(const std::vector<Stat>& stats) {
  std::vector<std::string_view> names;
  for (Stat s : stats) names.emplace_back(stat_name(s));
  return names;
}

// `- max_blockwise_dynamic_range: {block_size: 32, dims: 1, max_over_orientations: false}`, as
// TransformerEngine writes it: its blocks go into `c`; returns the statistic's name.
std::string read_blockwise_item(const YamlReader& r, const Field& item, StatsCollection& c) {
  const std::vector<Field> entries = r.entries(item, {"max_blockwise_dynamic_range"});
  if (entries.size() != 1) r.fail(item, fmt::format("{}: expected one statistic, got {}", item.name, entries.size()));
  const Field& params = entries[0];
  if (params.node.IsMap()) {
    for (const Field& e : r.entries(params, {"block_size", "dims", "max_over_orientations"})) {
      if (e.key == "block_size") c.blockwise_block_size(r.integer(e, 1, int64_t{1} << 20));
      if (e.key == "dims") c.blockwise_dims(r.integer(e, 1, 2));
      if (e.key == "max_over_orientations") c.blockwise_max_over_orientations(r.boolean(e));
    }
  } else if (!params.node.IsNull()) {
    r.fail(params, fmt::format("{}: expected block_size, dims and max_over_orientations, got {}", params.name,
                               YamlReader::describe(params.node)));
  }
  return "max_blockwise_dynamic_range";
}

std::vector<Stat> read_stats(const YamlReader& r, const Field& field, const StatsFeature& feature, StatsCollection& c) {
  const std::vector<Field> items = r.list(field);
  const std::vector<std::string_view> allowed = stat_names(*feature.allowed);
  if (items.empty()) r.fail(field, fmt::format("{}: the list is empty (allowed: {})", field.name, join(allowed)));
  std::vector<Stat> stats;
  for (const Field& item : items) {
    const std::string name = item.node.IsMap() ? read_blockwise_item(r, item, c) : options::lower_case(r.string(item));
    Stat stat;
    if (!parse_stat(name, stat)) {
      r.fail(item, fmt::format("{}: unknown statistic '{}' (allowed: {})", field.name, item.node.Scalar(),
                               join(allowed)));
    }
    if (std::find(feature.allowed->begin(), feature.allowed->end(), stat) == feature.allowed->end()) {
      r.fail(item, fmt::format("{}: '{}' is not a statistic of {} (allowed: {}); {} takes it", field.name, name,
                               feature.path, join(allowed), feature.other));
    }
    if (std::find(stats.begin(), stats.end(), stat) != stats.end()) {
      r.fail(item, fmt::format("{}: '{}' is listed twice", field.name, name));
    }
    stats.push_back(stat);
  }
  return stats;
}

std::vector<fp8::Role> read_tensors(const YamlReader& r, const Field& field) {
  static const std::vector<std::string_view> kNames = {"activation", "gradient", "weight"};
  constexpr fp8::Role kRoles[] = {fp8::Role::Activation, fp8::Role::Gradient, fp8::Role::Weight};
  const std::vector<Field> items = r.list(field);
  if (items.empty()) r.fail(field, fmt::format("{}: the list is empty (allowed: {})", field.name, join(kNames)));
  std::vector<fp8::Role> roles;
  for (const Field& item : items) {
    const size_t i = r.choice(item, kNames);
    if (std::find(roles.begin(), roles.end(), kRoles[i]) != roles.end()) {
      r.fail(item, fmt::format("{}: '{}' is listed twice", field.name, kNames[i]));
    }
    roles.push_back(kRoles[i]);
  }
  return roles;
}

// `enabled` of a section or feature: present without it counts as enabled (the feature is "only
// enabled when this field is provided", i.e. when the feature itself is).
bool read_enabled(const YamlReader& r, const std::vector<Field>& entries) {
  const Field* f = find(entries, "enabled");
  return f == nullptr || r.boolean(*f);
}

// A statistics feature; nullopt when it is switched off. `layers` is filled in by the section.
std::optional<StatsCollection> read_stats_feature(const YamlReader& r, const std::string& section,
                                                  const Field& field, const StatsFeature& feature) {
  const std::vector<Field> entries =
      r.entries(field, {"enabled", "type", "tensors", "freq", "start_step", "end_step"});
  const bool enabled = read_enabled(r, entries);
  const Field* type = find(entries, "type");
  if (type == nullptr) {
    r.fail(field.key_line, fmt::format("{}: 'type' is required (allowed: {})", field.name,
                                       join(stat_names(*feature.allowed))));
  }
  const Field* tensors = find(entries, "tensors");
  if (tensors == nullptr) {
    r.fail(field.key_line, fmt::format("{}: 'tensors' is required (any of activation, gradient, weight)", field.name));
  }
  StatsCollection c;
  std::vector<Stat> stats = read_stats(r, *type, feature, c);
  std::vector<fp8::Role> roles = read_tensors(r, *tensors);
  const Schedule s = read_schedule(r, entries);
  if (!enabled) return std::nullopt;
  return c.name(fmt::format("{}.{}", section, feature.path))
      .stats(std::move(stats))
      .tensors(std::move(roles))
      .freq(s.freq)
      .start_step(s.start_step)
      .end_step(s.end_step)
      .source(fmt::format("{}:{}", r.path(), field.key_line));
}

// The TransformerEngine features that change how it trains: checked loosely (their keys vary
// between its versions), never applied. Returns the note when the feature is on.
std::optional<std::string> read_training_feature(const YamlReader& r, const std::string& section, const Field& field) {
  const std::vector<Field> entries = r.entries(field, {});
  for (const Field& e : entries) {
    if (e.key == "gemms") {
      for (const Field& item : r.list(e)) r.choice(item, {"fprop", "dgrad", "wgrad"});
    } else if (e.key == "tensors") {
      for (const Field& item : r.list(e)) r.choice(item, {"activation", "gradient", "weight"});
    } else if (e.key == "margin") {
      r.integer(e);
    }
  }
  if (!read_enabled(r, entries)) return std::nullopt;
  return fmt::format("{}:{}: {}.transformer_engine.{} is accepted but not applied: the watchdog observes training "
                     "and does not change how TransformerEngine runs it",
                     r.path(), field.key_line, section, field.key);
}

}  // namespace

void read_section(const YamlReader& r, const Field& section, SectionResult& out) {
  static const StatsFeature kGeneric{"collect_tensor_stats", &kTensorStats,
                                     "transformer_engine.collect_fp8_tensor_stats"};
  static const StatsFeature kTeTensor{"transformer_engine.collect_tensor_stats", &kTensorStats,
                                      "transformer_engine.collect_fp8_tensor_stats"};
  static const StatsFeature kTeFp8{"transformer_engine.collect_fp8_tensor_stats", &kFp8Stats,
                                   "collect_tensor_stats (or transformer_engine.collect_tensor_stats)"};
  const std::string& name = section.key;
  const std::vector<Field> entries =
      r.entries(section, {"enabled", "layers", "collect_tensor_stats", "transformer_engine"});
  const bool enabled = read_enabled(r, entries);
  std::optional<std::string> layers;
  if (const Field* f = find(entries, "layers")) layers = read_layers(r, *f, false);

  SectionResult mine;
  if (const Field* f = find(entries, "collect_tensor_stats")) {
    if (auto c = read_stats_feature(r, name, *f, kGeneric)) mine.collections.push_back(std::move(*c));
  }
  if (const Field* te = find(entries, "transformer_engine")) {
    for (const Field& f : r.entries(*te, {"collect_tensor_stats", "collect_fp8_tensor_stats", "disable_fp8_gemm",
                                          "disable_fp8_layer", "per_tensor_scaling"})) {
      if (f.key == "collect_tensor_stats" || f.key == "collect_fp8_tensor_stats") {
        const StatsFeature& feature = f.key == "collect_tensor_stats" ? kTeTensor : kTeFp8;
        if (auto c = read_stats_feature(r, name, f, feature)) mine.collections.push_back(std::move(*c));
      } else if (auto note = read_training_feature(r, name, f)) {
        mine.notes.push_back(std::move(*note));
      }
    }
  }
  if (!enabled) return;
  if (!layers && (!mine.collections.empty() || !mine.notes.empty())) {
    r.fail(section.key_line, fmt::format("section '{}' has no 'layers' (layer_name_regex_pattern, layer_numbers "
                                         "and/or layer_types): its features would select no layer",
                                         name));
  }
  for (StatsCollection& c : mine.collections) out.collections.push_back(std::move(c.layers(*layers)));
  for (std::string& note : mine.notes) out.notes.push_back(std::move(note));
}

}  // namespace sentinel::config
