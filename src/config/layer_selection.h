#pragma once
// The layer selection of TransformerEngine's debug tools, compiled to ONE ECMAScript regex that
// std::regex_match tests against a whole module path ("encoder.layers.4.mlp.fc1"), so that the
// rest of the watchdog has a single kind of layer filter.
//
//   layer_name_regex_pattern  used as is;
//   layer_numbers             the path's layer number is its FIRST dotted component made only of
//                             digits (blocks.2.experts.7.fc1 -> 2). Numbers are compared as
//                             canonical decimal text, so a component with a leading zero ("04")
//                             is no layer number and selects nothing;
//   layer_types               the path contains one of the names as a substring;
//   numbers and types         both must hold; `all` for either imposes no constraint.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sentinel::config {

// Layer numbers first..last, inclusive.
struct LayerRange {
  uint64_t first = 0;
  uint64_t last = 0;
};

struct LayerNumbers {
  bool all = false;
  std::vector<LayerRange> ranges;
};

struct LayerTypes {
  bool all = false;
  std::vector<std::string> names;
};

struct LayerSelection {
  std::optional<std::string> name_regex;  // layer_name_regex_pattern
  std::optional<LayerNumbers> numbers;    // layer_numbers
  std::optional<LayerTypes> types;        // layer_types
};

// Layer numbers above this are refused: they keep every range's arithmetic inside uint64_t.
constexpr uint64_t kMaxLayerNumber = 999999999999999999ull;

// One item of layer_numbers: "7", "1-12" (spaces allowed around the dash) or "all" (any case;
// returns nullopt). Throws std::invalid_argument saying what was expected.
std::optional<LayerRange> parse_layer_numbers_item(std::string_view text);

// The regex (a non-capturing group) of exactly the decimal texts of the numbers in the ranges,
// without leading zeros, built digit by digit so that a range of any size stays short.
std::string layer_number_regex(const std::vector<LayerRange>& ranges);

// `text` with every ECMAScript metacharacter escaped.
std::string regex_escape(std::string_view text);

// The selection as one regex. Throws std::invalid_argument when none of the three is given, when
// layer_name_regex_pattern is combined with the others, when a list is empty, when a range runs
// backwards, and when the pattern is no valid ECMAScript regex (with std::regex_error's text).
std::string compile_layer_selection(const LayerSelection& selection);

}  // namespace sentinel::config
