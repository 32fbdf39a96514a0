#pragma once
// A value of a YAML config as the option tables read it (options/option_value.h): each mistake
// an OptionError "<file>:<line>: <key>: ...", and the line of each option kept, so that an error
// of Options::validate() points at the line that set it.
#include <map>
#include <string>

#include "config/yaml_reader.h"
#include "options/option_value.h"

namespace sentinel::config {

// Where each option was written: its path in the option tables -> its line.
using OptionLines = std::map<std::string, int>;

class YamlValue : public options::Value {
 public:
  YamlValue(const YamlReader& reader, Field field, OptionLines& lines)
      : reader_(reader), field_(std::move(field)), lines_(lines) {}

  bool is_null() const override { return field_.node.IsNull(); }
  bool is_boolean() const override;
  bool boolean() const override { return reader_.boolean(field_); }
  int64_t integer() const override { return reader_.integer(field_); }
  double number() const override { return reader_.number(field_); }
  std::string text() const override { return reader_.string(field_); }
  std::vector<std::unique_ptr<options::Value>> items() const override;
  std::vector<options::Entry> entries(const std::vector<std::string_view>& keys) const override;
  size_t choice(const std::vector<std::string_view>& names) const override { return reader_.choice(field_, names); }
  std::string layers() const override;
  [[noreturn]] void fail(std::string_view message) const override;
  void set_path(const std::string& path) override;

 private:
  const YamlReader& reader_;
  Field field_;
  OptionLines& lines_;
};

// An error of Options::validate() (options::FieldError) as "<file>:<line>: ...", at the line of
// the option it names or of the nearest section around it that the config wrote.
[[noreturn]] void rethrow_at_line(const YamlReader& reader, const OptionLines& lines);

}  // namespace sentinel::config
