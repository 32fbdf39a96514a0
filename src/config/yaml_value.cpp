#include "config/yaml_value.h"

#include <fmt/format.h>

#include <exception>

#include "config/config_sections.h"
#include "options/field_error.h"

namespace sentinel::config {

bool YamlValue::is_boolean() const {
  if (!field_.node.IsScalar()) return false;
  const std::string low = lower(field_.node.Scalar());
  return low == "true" || low == "yes" || low == "on" || low == "false" || low == "no" || low == "off";
}

std::vector<std::unique_ptr<options::Value>> YamlValue::items() const {
  std::vector<std::unique_ptr<options::Value>> out;
  // An empty list is meaningful (no loggers, no traced batches).
  if (field_.node.IsSequence() && field_.node.size() == 0) return out;
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
    std::string message = e.what();
    const std::string prefix = "sentinel: ";
    if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
    if (auto it = options::nearest_written(lines, e.path()); it != lines.end()) reader.fail(it->second, message);
    throw OptionError(fmt::format("{}: {}", reader.path(), message));
  }
}

}  // namespace sentinel::config
