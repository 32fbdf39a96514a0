#include "config/layer_selection.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <regex>
#include <stdexcept>

namespace sentinel::config {

namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

uint64_t parse_number(std::string_view text, std::string_view item) {
  if (!all_digits(text)) {
    throw std::invalid_argument(
        fmt::format("expected a layer number (>= 0), a range like '1-12' or 'all', got '{}'", item));
  }
  // Leading zeros are how the user wrote the number, not part of it.
  while (text.size() > 1 && text.front() == '0') text.remove_prefix(1);
  uint64_t value = 0;
  for (char c : text) {
    if (value > kMaxLayerNumber / 10) value = kMaxLayerNumber + 1;  // saturates: reported below
    else value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value > kMaxLayerNumber) {
    throw std::invalid_argument(fmt::format("layer number '{}' is too large (at most {})", text, kMaxLayerNumber));
  }
  return value;
}

bool all_of_char(std::string_view text, char c) {
  return std::all_of(text.begin(), text.end(), [c](char d) { return d == c; });
}

std::string digit_class(char first, char last) {
  return first == last ? std::string(1, first) : fmt::format("[{}-{}]", first, last);
}

std::string any_digits(size_t count) {
  if (count == 0) return {};
  return count == 1 ? std::string("[0-9]") : fmt::format("[0-9]{{{}}}", count);
}

// An alternation must be grouped before a prefix is put in front of it.
std::string group(const std::string& regex) {
  return regex.find('|') == std::string::npos ? regex : fmt::format("(?:{})", regex);
}

// The digit strings from lo to hi, both of the same length (lo <= hi). Splits at the first digit:
// lo's first digit followed by [lo's rest, 9...9], the whole digits between followed by any
// digits, and hi's first digit followed by [0...0, hi's rest]. Each split leaves one side at its
// extreme, so the recursion stays linear in the number of digits.
std::string same_length_range(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return {};
  if (lo == hi) return lo;
  const size_t rest = lo.size() - 1;
  const std::string lo_rest = lo.substr(1);
  const std::string hi_rest = hi.substr(1);
  if (lo[0] == hi[0]) return lo.substr(0, 1) + group(same_length_range(lo_rest, hi_rest));
  std::vector<std::string> alternatives;
  char first_whole = lo[0];
  char last_whole = hi[0];
  if (!all_of_char(lo_rest, '0')) {
    alternatives.push_back(lo.substr(0, 1) + group(same_length_range(lo_rest, std::string(rest, '9'))));
    ++first_whole;
  }
  const bool hi_whole = all_of_char(hi_rest, '9');
  if (!hi_whole) --last_whole;
  if (first_whole <= last_whole) alternatives.push_back(digit_class(first_whole, last_whole) + any_digits(rest));
  if (!hi_whole) alternatives.push_back(hi.substr(0, 1) + group(same_length_range(std::string(rest, '0'), hi_rest)));
  return fmt::format("{}", fmt::join(alternatives, "|"));
}

uint64_t power_of_ten(size_t exponent) {
  uint64_t value = 1;
  for (size_t i = 0; i < exponent; ++i) value *= 10;
  return value;
}

// Every non-numeric component (empty ones included), each followed by its dot: what comes before
// the first all-digit component.
constexpr const char* kNonNumericPrefix = R"((?:(?:[^.]*[^.0-9][^.]*)?\.)*)";

}  // namespace

std::optional<LayerRange> parse_layer_numbers_item(std::string_view item) {
  const std::string_view text = trim(item);
  std::string low(text);
  std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return std::tolower(c); });
  if (low == "all") return std::nullopt;
  const size_t dash = text.find('-', 1);
  if (dash == std::string_view::npos) {
    const uint64_t n = parse_number(text, item);
    return LayerRange{n, n};
  }
  const LayerRange range{parse_number(trim(text.substr(0, dash)), item), parse_number(trim(text.substr(dash + 1)), item)};
  if (range.last < range.first) {
    throw std::invalid_argument(fmt::format("layer range '{}' runs backwards", text));
  }
  return range;
}

std::string layer_number_regex(const std::vector<LayerRange>& ranges) {
  std::vector<std::string> alternatives;
  for (const LayerRange& range : ranges) {
    if (range.last < range.first || range.last > kMaxLayerNumber) {
      throw std::invalid_argument(fmt::format("bad layer range {}-{}", range.first, range.last));
    }
    // One piece per number of digits, so that each piece compares strings of equal length.
    const size_t first_digits = std::to_string(range.first).size();
    const size_t last_digits = std::to_string(range.last).size();
    for (size_t digits = first_digits; digits <= last_digits; ++digits) {
      const uint64_t lo = std::max(range.first, digits == 1 ? 0 : power_of_ten(digits - 1));
      const uint64_t hi = std::min(range.last, power_of_ten(digits) - 1);
      alternatives.push_back(same_length_range(std::to_string(lo), std::to_string(hi)));
    }
  }
  // (?!) matches nothing: an empty list selects no number.
  if (alternatives.empty()) return "(?!)";
  return fmt::format("(?:{})", fmt::join(alternatives, "|"));
}

std::string regex_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (std::string_view(R"(\^$.|?*+()[]{}/)").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

std::string compile_layer_selection(const LayerSelection& selection) {
  if (!selection.name_regex && !selection.numbers && !selection.types) {
    throw std::invalid_argument(
        "at least one of layer_name_regex_pattern, layer_numbers and layer_types is required");
  }
  if (selection.name_regex) {
    if (selection.numbers || selection.types) {
      throw std::invalid_argument(
          "layer_name_regex_pattern cannot be combined with layer_numbers or layer_types: only layer_numbers and "
          "layer_types can be used together");
    }
    try {
      std::regex check(*selection.name_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw std::invalid_argument(fmt::format("invalid regex '{}': {}", *selection.name_regex, e.what()));
    }
    return *selection.name_regex;
  }
  if (selection.numbers && !selection.numbers->all && selection.numbers->ranges.empty()) {
    throw std::invalid_argument("layer_numbers is empty (use [all] for every layer)");
  }
  if (selection.types && !selection.types->all) {
    if (selection.types->names.empty()) throw std::invalid_argument("layer_types is empty (use [all] for every layer)");
    for (const std::string& name : selection.types->names) {
      if (name.empty()) throw std::invalid_argument("layer_types has an empty name (it would select every layer)");
    }
  }
  const bool by_number = selection.numbers && !selection.numbers->all;
  const bool by_type = selection.types && !selection.types->all;
  std::string numbers;
  if (by_number) {
    numbers = fmt::format(R"({}{}(?:\..*)?)", kNonNumericPrefix, layer_number_regex(selection.numbers->ranges));
  }
  std::string types;
  if (by_type) {
    std::vector<std::string> escaped;
    for (const std::string& name : selection.types->names) escaped.push_back(regex_escape(name));
    types = fmt::format("(?:{})", fmt::join(escaped, "|"));
  }
  if (by_number && by_type) return fmt::format("(?={}$)(?=.*{}).*", numbers, types);
  if (by_number) return numbers;
  if (by_type) return fmt::format(".*{}.*", types);
  return ".*";
}

}  // namespace sentinel::config
