#include "config/yaml_reader.h"

#include "options/words.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sentinel/errors.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace sentinel::config {

std::string join(const std::vector<std::string_view>& names) { return fmt::format("{}", fmt::join(names, ", ")); }

void YamlReader::fail(int line, std::string_view message) const {
  throw OptionError(fmt::format("{}:{}: {}", path_, line, message));
}

int YamlReader::line_of(const YAML::Node& node, int fallback) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() || mark.line < 0 ? fallback : mark.line + 1;
}

std::string YamlReader::describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar: {
      // A long value (a pasted paragraph) would bury the message.
      const std::string& s = node.Scalar();
      return s.size() <= 60 ? fmt::format("'{}'", s) : fmt::format("'{}...'", s.substr(0, 57));
    }
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "nothing";
  }
}

std::vector<Field> YamlReader::entries(const Field& field, const std::vector<std::string_view>& allowed) const {
  std::vector<Field> out;
  if (field.node.IsNull()) return out;
  if (!field.node.IsMap()) {
    fail(field, fmt::format("{}: expected a mapping of keys, got {}", field.name, describe(field.node)));
  }
  for (const auto& pair : field.node) {
    // Copies: yaml-cpp's iterators hand out temporaries.
    const YAML::Node key_node = pair.first;
    const YAML::Node value = pair.second;
    const int key_line = line_of(key_node, field.line);
    if (!key_node.IsScalar()) {
      fail(key_line, fmt::format("{}: expected a key name, got {}", field.name.empty() ? "config" : field.name,
                                 describe(key_node)));
    }
    const std::string key = key_node.Scalar();
    // yaml-cpp keeps both entries of a repeated key and lookups see only the first: a typo'd
    // copy-paste would silently lose the second.
    for (const Field& seen : out) {
      if (seen.key == key) {
        fail(key_line, fmt::format("'{}' is given twice (first on line {})", seen.name, seen.key_line));
      }
    }
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      fail(key_line, fmt::format("unknown key '{}' in {} (allowed: {})", key, field.name.empty() ? "config" : field.name,
                                 join(allowed)));
    }
    Field entry;
    entry.key = key;
    entry.name = field.name.empty() ? key : fmt::format("{}.{}", field.name, key);
    entry.node = value;
    // An empty value's position is where the parser looked next (often the following line).
    entry.line = value.IsNull() ? key_line : line_of(value, key_line);
    entry.key_line = key_line;
    out.push_back(std::move(entry));
  }
  return out;
}

int64_t YamlReader::integer(const Field& field, int64_t min, int64_t max) const {
  if (!field.node.IsScalar()) {
    fail(field, fmt::format("{}: expected an integer, got {}", field.name, describe(field.node)));
  }
  std::string_view text = field.node.Scalar();
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || end != text.data() + text.size() || ec == std::errc::invalid_argument) {
    fail(field, fmt::format("{}: expected an integer, got {}", field.name, describe(field.node)));
  }
  if (ec == std::errc::result_out_of_range || value < min) {
    if (ec == std::errc::result_out_of_range && text.front() != '-') {
      fail(field, fmt::format("{}: must be at most {}, got {}", field.name, max, field.node.Scalar()));
    }
    fail(field, fmt::format("{}: must be at least {}, got {}", field.name, min, field.node.Scalar()));
  }
  if (value > max) fail(field, fmt::format("{}: must be at most {}, got {}", field.name, max, value));
  return value;
}

double YamlReader::number(const Field& field) const {
  if (!field.node.IsScalar()) {
    fail(field, fmt::format("{}: expected a number, got {}", field.name, describe(field.node)));
  }
  const std::string& raw = field.node.Scalar();
  // YAML's own spellings of the non-finite values.
  const std::string low = options::lower_case(raw);
  if (low == ".inf" || low == "+.inf") return std::numeric_limits<double>::infinity();
  if (low == "-.inf") return -std::numeric_limits<double>::infinity();
  if (low == ".nan") return std::numeric_limits<double>::quiet_NaN();
  std::string_view text = raw;
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  // from_chars would also take "inf", "nan" and hex digits, which YAML does not read as numbers.
  const bool plain = !text.empty() && text.find_first_not_of("0123456789.eE+-") == std::string_view::npos;
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (!plain || ec != std::errc() || end != text.data() + text.size()) {
    fail(field, fmt::format("{}: expected a number, got {}", field.name, describe(field.node)));
  }
  return value;
}

bool YamlReader::boolean(const Field& field) const {
  if (field.node.IsScalar()) {
    if (const auto value = options::boolean_word(field.node.Scalar())) return *value;
  }
  fail(field, fmt::format("{}: expected true or false, got {}", field.name, describe(field.node)));
}

std::string YamlReader::string(const Field& field) const {
  if (!field.node.IsScalar()) {
    fail(field, fmt::format("{}: expected a string, got {}", field.name, describe(field.node)));
  }
  return field.node.Scalar();
}

std::vector<Field> YamlReader::list(const Field& field) const {
  std::vector<Field> out;
  if (field.node.IsScalar()) {
    out.push_back({fmt::format("{}[0]", field.name), {}, field.node, field.line, field.line});
    return out;
  }
  if (!field.node.IsSequence()) {
    fail(field, fmt::format("{}: expected a list, got {}", field.name, describe(field.node)));
  }
  for (size_t i = 0; i < field.node.size(); ++i) {
    const YAML::Node element = field.node[i];
    const int line = line_of(element, field.line);
    out.push_back({fmt::format("{}[{}]", field.name, i), {}, element, line, line});
  }
  return out;
}

size_t YamlReader::choice(const Field& field, const std::vector<std::string_view>& allowed) const {
  if (!field.node.IsScalar()) {
    fail(field, fmt::format("{}: expected one of {}, got {}", field.name, join(allowed), describe(field.node)));
  }
  const std::string low = options::lower_case(field.node.Scalar());
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (low == options::lower_case(allowed[i])) return i;
  }
  fail(field, fmt::format("{}: unknown value {} (allowed: {})", field.name, describe(field.node), join(allowed)));
}

}  // namespace sentinel::config
