// compile_layer_selection against a predicate written independently of it: every module path of a
// list, under every selection of a list, must be selected exactly when the predicate says so.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "config/layer_selection.h"

namespace {

using sentinel::config::compile_layer_selection;
using sentinel::config::kMaxLayerNumber;
using sentinel::config::LayerNumbers;
using sentinel::config::LayerRange;
using sentinel::config::LayerSelection;
using sentinel::config::LayerTypes;
using sentinel::config::layer_number_regex;
using sentinel::config::parse_layer_numbers_item;
using sentinel::config::regex_escape;

std::vector<std::string> split_dots(const std::string& path) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '.')) parts.push_back(part);
  if (!path.empty() && path.back() == '.') parts.emplace_back();
  return parts;
}

// The layer number of a path: its first non-empty dotted component of digits only, when written
// without a leading zero.
std::optional<uint64_t> layer_number(const std::string& path) {
  for (const std::string& part : split_dots(path)) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) continue;
    if (part.size() > 1 && part[0] == '0') return std::nullopt;
    if (part.size() > 18) return std::nullopt;
    return std::stoull(part);
  }
  return std::nullopt;
}

bool predicate(const LayerSelection& s, const std::string& path) {
  if (s.numbers && !s.numbers->all) {
    const std::optional<uint64_t> n = layer_number(path);
    if (!n) return false;
    bool in = false;
    for (const LayerRange& r : s.numbers->ranges) in = in || (r.first <= *n && *n <= r.last);
    if (!in) return false;
  }
  if (s.types && !s.types->all) {
    bool any = false;
    for (const std::string& t : s.types->names) any = any || path.find(t) != std::string::npos;
    if (!any) return false;
  }
  return true;
}

std::vector<std::string> module_paths() {
  std::vector<std::string> paths = {
      "", "fc1", "3", "0", "04", "layers.04.fc1", "layers.3", "a..3.fc1", "layers.12x.4.fc1", "x.1.2",
      "model.decoder.layers.4.self_attention.linear_proj", "blocks.2.experts.7.fc1", "qkv.mlp", "layers.",
      ".5.fc1", "layer12.fc1", "x.a+b.1", "x.a.b.1", "x.(fc).2", "enc.1e3.fc1", "layers.-1.fc1",
      "layers.999999999999999999.fc1", "layers.1000000000000000000.fc1", "h.12.mlp.fc1", "h.123.qkv"};
  const std::vector<std::string> prefixes = {"", "model.", "encoder.layers.", "blocks.", "a1.", "x.0a."};
  const std::vector<std::string> numbers = {"0",  "1",  "2",  "3",  "4",   "7",   "9",   "10",   "11",  "12",
                                            "13", "19", "20", "99", "100", "101", "123", "999", "1000", "1234"};
  const std::vector<std::string> suffixes = {"", ".fc1", ".mlp.fc2", ".self_attention.qkv", ".experts.7.fc1", ".5"};
  for (const auto& p : prefixes) {
    for (const auto& n : numbers) {
      for (const auto& s : suffixes) paths.push_back(p + n + s);
    }
  }
  return paths;
}

std::vector<LayerNumbers> number_selections() {
  std::vector<LayerNumbers> out;
  const std::vector<std::vector<LayerRange>> lists = {
      {{1, 1}},   {{1, 12}},           {{0, 0}},           {{3, 3}, {5, 7}}, {{10, 19}},   {{9, 101}},
      {{0, 1000000}}, {{99, 99}},      {{100, 123}},       {{2, 2}, {12, 12}, {1000, 1234}},
      {{0, kMaxLayerNumber}}, {{13, 13}, {1, 12}}, {{998, 1001}}};
  for (const auto& ranges : lists) out.push_back(LayerNumbers{false, ranges});
  out.push_back(LayerNumbers{true, {}});
  return out;
}

std::vector<LayerTypes> type_selections() {
  return {LayerTypes{false, {"qkv"}}, LayerTypes{false, {"mlp", "fc1"}}, LayerTypes{false, {"a+b"}},
          LayerTypes{false, {"(fc)"}}, LayerTypes{false, {"fc1", "."}}, LayerTypes{true, {}}};
}

void check_against_predicate(const LayerSelection& selection, const std::vector<std::string>& paths) {
  const std::string regex = compile_layer_selection(selection);
  const std::regex re(regex, std::regex::ECMAScript);
  for (const std::string& path : paths) {
    EXPECT_EQ(std::regex_match(path, re), predicate(selection, path)) << "path '" << path << "', regex " << regex;
  }
}

TEST(LayerSelection, NumbersAloneMatchThePredicate) {
  const auto paths = module_paths();
  for (const LayerNumbers& numbers : number_selections()) {
    LayerSelection s;
    s.numbers = numbers;
    check_against_predicate(s, paths);
  }
}

TEST(LayerSelection, TypesAloneMatchThePredicate) {
  const auto paths = module_paths();
  for (const LayerTypes& types : type_selections()) {
    LayerSelection s;
    s.types = types;
    check_against_predicate(s, paths);
  }
}

TEST(LayerSelection, NumbersAndTypesTogetherMatchThePredicate) {
  const auto paths = module_paths();
  for (const LayerNumbers& numbers : number_selections()) {
    for (const LayerTypes& types : type_selections()) {
      LayerSelection s;
      s.numbers = numbers;
      s.types = types;
      check_against_predicate(s, paths);
    }
  }
}

TEST(LayerSelection, SpotChecks) {
  LayerSelection s;
  s.numbers = LayerNumbers{false, {{1, 1}}};
  const std::regex one(compile_layer_selection(s));
  EXPECT_TRUE(std::regex_match("encoder.layers.1.mlp.fc1", one));
  EXPECT_FALSE(std::regex_match("encoder.layers.12.mlp.fc1", one));
  EXPECT_FALSE(std::regex_match("encoder.layers.01.mlp.fc1", one));
  EXPECT_FALSE(std::regex_match("blocks.2.experts.1.fc1", one));  // the first number is the layer's
  s.numbers = LayerNumbers{true, {}};
  s.types = LayerTypes{true, {}};
  EXPECT_EQ(compile_layer_selection(s), ".*");
  LayerSelection pattern;
  pattern.name_regex = ".*(fc1|fc2)";
  EXPECT_EQ(compile_layer_selection(pattern), ".*(fc1|fc2)");
}

// The number regex alone, over every number up to 2500 and around the ends of large ranges.
TEST(LayerSelection, NumberRegexIsExact) {
  std::mt19937_64 rng(12345);
  std::vector<std::vector<LayerRange>> lists = {{{0, 0}},      {{0, 9}},     {{1, 9}},   {{5, 10}},  {{9, 10}},
                                                {{10, 99}},    {{11, 98}},   {{0, 999}}, {{7, 1234}}, {{100, 100}},
                                                {{199, 2001}}, {{3, 5}, {400, 410}, {1999, 2000}}};
  for (int i = 0; i < 30; ++i) {
    uint64_t a = rng() % 3000;
    uint64_t b = rng() % 3000;
    if (a > b) std::swap(a, b);
    lists.push_back({{a, b}});
  }
  for (const auto& ranges : lists) {
    const std::string regex = layer_number_regex(ranges);
    const std::regex re(regex);
    for (uint64_t n = 0; n <= 3000; ++n) {
      bool in = false;
      for (const LayerRange& r : ranges) in = in || (r.first <= n && n <= r.last);
      ASSERT_EQ(std::regex_match(std::to_string(n), re), in) << n << " against " << regex;
    }
    EXPECT_FALSE(std::regex_match("00", re)) << regex;
    EXPECT_FALSE(std::regex_match("01", re)) << regex;
    EXPECT_FALSE(std::regex_match("", re)) << regex;
  }
  // Large ranges stay short and exact at their ends.
  for (int i = 0; i < 50; ++i) {
    uint64_t a = rng() % kMaxLayerNumber;
    uint64_t b = rng() % kMaxLayerNumber;
    if (a > b) std::swap(a, b);
    const std::string regex = layer_number_regex({{a, b}});
    EXPECT_LT(regex.size(), 4000u);
    const std::regex re(regex);
    for (uint64_t n : {a, b, (a + b) / 2}) EXPECT_TRUE(std::regex_match(std::to_string(n), re)) << n << " " << regex;
    if (a > 0) {
      EXPECT_FALSE(std::regex_match(std::to_string(a - 1), re)) << a - 1 << " " << regex;
    }
    EXPECT_FALSE(std::regex_match(std::to_string(b + 1), re)) << b + 1 << " " << regex;
    EXPECT_FALSE(std::regex_match("0" + std::to_string(a), re)) << regex;
  }
  const std::regex all(layer_number_regex({{0, kMaxLayerNumber}}));
  EXPECT_TRUE(std::regex_match(std::to_string(kMaxLayerNumber), all));
  EXPECT_FALSE(std::regex_match(std::to_string(kMaxLayerNumber + 1), all));
}

TEST(LayerSelection, ParseItems) {
  const auto range = [](const char* text) { return parse_layer_numbers_item(text); };
  ASSERT_TRUE(range("7").has_value());
  EXPECT_EQ(range("7")->first, 7u);
  EXPECT_EQ(range("7")->last, 7u);
  EXPECT_EQ(range("1-12")->first, 1u);
  EXPECT_EQ(range("1-12")->last, 12u);
  EXPECT_EQ(range(" 3 - 5 ")->first, 3u);
  EXPECT_EQ(range(" 3 - 5 ")->last, 5u);
  EXPECT_EQ(range("007")->first, 7u);
  EXPECT_FALSE(range("all").has_value());
  EXPECT_FALSE(range("ALL").has_value());
  for (const char* bad : {"12-1", "-3", "x", "1-", "1--3", "", "3.5", "99999999999999999999"}) {
    EXPECT_THROW(range(bad), std::invalid_argument) << "'" << bad << "'";
  }
}

TEST(LayerSelection, Errors) {
  EXPECT_THROW(compile_layer_selection(LayerSelection{}), std::invalid_argument);
  LayerSelection both;
  both.name_regex = ".*";
  both.types = LayerTypes{false, {"fc1"}};
  try {
    compile_layer_selection(both);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("only layer_numbers and layer_types can be used together"),
              std::string::npos);
  }
  LayerSelection bad;
  bad.name_regex = "fc(1";
  EXPECT_THROW(compile_layer_selection(bad), std::invalid_argument);
  LayerSelection empty;
  empty.numbers = LayerNumbers{false, {}};
  EXPECT_THROW(compile_layer_selection(empty), std::invalid_argument);
  empty.numbers.reset();
  empty.types = LayerTypes{false, {}};
  EXPECT_THROW(compile_layer_selection(empty), std::invalid_argument);
  empty.types = LayerTypes{false, {""}};
  EXPECT_THROW(compile_layer_selection(empty), std::invalid_argument);
}

TEST(LayerSelection, EscapedTextMatchesOnlyItself) {
  const std::string specials = R"(\^$.|?*+()[]{}/)";
  for (char c : specials) {
    const std::string text = std::string("a") + c + "b";
    const std::regex re(regex_escape(text));
    EXPECT_TRUE(std::regex_match(text, re)) << text;
    EXPECT_FALSE(std::regex_match("axb", re)) << text;
  }
  const std::regex all(regex_escape(specials));
  EXPECT_TRUE(std::regex_match(specials, all));
}

}  // namespace
