#pragma once
// Typed reads from a parsed YAML config. Every error is a sentinel::OptionError that starts with
// "<path>:<line>: " (1-based) and names the key and what was expected, so that a user can fix the
// config without reading the code that parses it.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace sentinel::config {

// A value together with the key it sits under (for messages) and the line to blame.
struct Field {
  std::string name;  // "freq", "sentinel.fp8.margin", "type[2]"
  std::string key;   // the mapping key it sits under ("margin"); empty for a list element
  YAML::Node node;
  int line = 1;      // 1-based line of the value
  int key_line = 1;  // 1-based line of the key (of the value itself for a list element)
};

class YamlReader {
 public:
  explicit YamlReader(std::string path) : path_(std::move(path)) {}
  const std::string& path() const noexcept { return path_; }

  // "<path>:<line>: <message>".
  [[noreturn]] void fail(int line, std::string_view message) const;
  [[noreturn]] void fail(const Field& field, std::string_view message) const { fail(field.line, message); }

  // The 1-based line of a node; `fallback` for nodes without a position (an empty document).
  static int line_of(const YAML::Node& node, int fallback);
  // How a value reads in a message: 'abc', a list, a mapping, nothing.
  static std::string describe(const YAML::Node& node);

  // The entries of a mapping in document order, each named `<prefix>.<key>` for messages (just
  // the key when prefix is empty). A missing value (`key:` with nothing) counts as an empty
  // mapping here. Rejects a value that is not a mapping, a key that is not a plain name, a key
  // given twice and a key not in `allowed` (empty `allowed`: any key).
  std::vector<Field> entries(const Field& field, const std::vector<std::string_view>& allowed) const;

  int64_t integer(const Field& field, int64_t min = std::numeric_limits<int64_t>::min(),
                  int64_t max = std::numeric_limits<int64_t>::max()) const;
  double number(const Field& field) const;
  bool boolean(const Field& field) const;
  std::string string(const Field& field) const;
  // The elements of a list, named `<name>[i]`; a single scalar counts as a list of one, so that
  // `tensors: activation` reads as `tensors: [activation]`.
  std::vector<Field> list(const Field& field) const;
  // The index in `allowed` of the value, compared case-insensitively.
  size_t choice(const Field& field, const std::vector<std::string_view>& allowed) const;

 private:
  std::string path_;
};

// "a, b, c".
std::string join(const std::vector<std::string_view>& names);

}  // namespace sentinel::config
