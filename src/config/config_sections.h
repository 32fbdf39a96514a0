#pragma once
// The parts of a config shared by the `sentinel:` options and the debug-tools sections: step
// schedules, layer selections, and the sections themselves (every top-level key but `sentinel`).
#include <sentinel/options.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/yaml_reader.h"

namespace sentinel::config {

// The entry with this key; nullptr when absent.
const Field* find(const std::vector<Field>& entries, std::string_view key);

// Steps start_step, start_step + freq, ... up to end_step inclusive (-1: no end).
struct Schedule {
  int64_t freq = 1;
  int64_t start_step = 0;
  int64_t end_step = -1;
};
// freq, start_step and end_step among the entries (absent: the defaults), checked: freq >= 1,
// start_step >= 0, end_step -1 or not before start_step.
Schedule read_schedule(const YamlReader& r, const std::vector<Field>& entries);

// A `layers:` value compiled to one regex (config/layer_selection.h): a mapping of
// layer_name_regex_pattern / layer_numbers / layer_types, or, where `allow_pattern`, a regex.
std::string read_layers(const YamlReader& r, const Field& field, bool allow_pattern);

// What the sections of a config add to the options.
struct SectionResult {
  std::vector<StatsCollection> collections;
  std::vector<std::string> notes;  // features accepted but not applied (Options::config_notes)
};
// One section in the layout of TransformerEngine's debug tools. A disabled section is checked all
// the same, so that switching it on later cannot reveal a mistake.
void read_section(const YamlReader& r, const Field& section, SectionResult& out);

}  // namespace sentinel::config
