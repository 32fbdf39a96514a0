#include "config/yaml_value.h"

#include <fmt/format.h>

#include <exception>

#include "config/config_sections.h"
#include "options/field_error.h"
#include "options/words.h"

namespace sentinel::config {

bool YamlValue::is_boolean() const {
  return field_.node.IsScalar() && options::boolean_word(field_.node.Scalar()).has_value();
}

std::vector<std::unique_ptr<options::Value>> YamlValue::items() const {
  std::vector<std::unique_ptr<options::Value>> out;
  for (Field& item : reader_.list(field_)) out.push_back(std::make_unique<YamlValue>(reader_, std::move(item), lines_));
  return out;
}

std::vector<options::Entry> YamlValue::entries(const std::vector<std::string_view>& keys) const {
  std::vector<options::Entry> out;
  for (Field& entry : reader_.entries(field_, keys)) {
    std::string key = entry.key;
    out.push_back({std::move(key), std::make_unique<YamlValue>(reader_, std::move(entry), lines_)});
  }
  return out;
}

std::string YamlValue::layers() const { return read_layers(reader_, field_, true); }

void YamlValue::fail(std::string_view message) const { reader_.fail(field_, fmt::format("{}: {}", field_.name, message)); }

void YamlValue::set_path(const std::string& path) {
  path_ = path;
  lines_[path] = field_.line;
}

void rethrow_at_line(const YamlReader& reader, const OptionLines& lines) {
  try {
    throw;
  } catch (const options::FieldError& e) {
    if (auto it = options::nearest_written(lines, e.path()); it != lines.end()) reader.fail(it->second, e.detail());
    throw OptionError(fmt::format("{}: {}", reader.path(), e.detail()));
  }
}

}  // namespace sentinel::config
