// Options::from_yaml and Options::from_config: the watchdog's own options under `sentinel:` (read
// through the option tables, options/option_table.h), and every other top-level key a section in
// the layout of TransformerEngine's debug tools, so that one file can drive both.
#include <fmt/format.h>
#include <sentinel/errors.h>
#include <sentinel/options.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "config/config_sections.h"
#include "config/yaml_reader.h"
#include "config/yaml_value.h"
#include "options/field_error.h"
#include "options/option_table.h"

namespace sentinel {

namespace {

using config::Field;
using config::YamlReader;

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw OptionError(fmt::format("sentinel: cannot open config '{}': it is a directory", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw OptionError(fmt::format("sentinel: cannot open config '{}': {}", path,
                                  err ? std::strerror(err) : "cannot be read"));
  }
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw OptionError(fmt::format("sentinel: cannot read config '{}'", path));
  return text;
}

YAML::Node parse(const YamlReader& r, const std::string& text) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    r.fail(e.mark.is_null() ? 1 : e.mark.line + 1, fmt::format("YAML syntax error: {}", e.msg));
  }
  // A second document would be read by no one.
  if (documents.size() > 1) {
    r.fail(YamlReader::line_of(documents[1], 1),
           fmt::format("a config is one YAML document, this file has {} (remove the '---' separators)",
                       documents.size()));
  }
  return documents.empty() ? YAML::Node() : documents[0];
}

}  // namespace

Options Options::from_yaml(const std::string& path) { return from_yaml(path, Options()); }

Options Options::from_yaml(const std::string& path, const Options& start) {
  const YamlReader r(path);
  const YAML::Node root = parse(r, read_file(path));
  if (!root.IsMap()) {
    if (root.IsNull()) {
      r.fail(YamlReader::line_of(root, 1),
             "the config is empty (expected a mapping: `sentinel:` options and/or debug-tools sections)");
    }
    r.fail(YamlReader::line_of(root, 1),
           fmt::format("expected a mapping at the top level (`sentinel:` options and/or debug-tools sections), got {}",
                       YamlReader::describe(root)));
  }
  Options options = start;
  config::SectionResult sections;
  config::OptionLines lines;
  const Field top{"", "", root, 1, 1};
  try {
    for (const Field& entry : r.entries(top, {})) {
      if (entry.key == "sentinel") {
        config::YamlValue value(r, entry, lines);
        options::apply(options, value, options::option_fields());
      } else {
        config::read_section(r, entry, sections);
      }
    }
    auto collections = options.stats_collections();
    collections.insert(collections.end(), sections.collections.begin(), sections.collections.end());
    options.stats_collections(std::move(collections));
    options.config_notes(std::move(sections.notes));
    options.config_path(path);
    options.validate();
  } catch (const options::FieldError&) {
    config::rethrow_at_line(r, lines);
  }
  return options;
}

Options Options::from_config() {
  const char* path = std::getenv("SENTINEL_CONFIG");
  if (path == nullptr || *path == '\0') return Options();
  return from_yaml(path);
}

}  // namespace sentinel
