#pragma once
// The command line's options, bound to the option tables (options/option_table.h): `--set
// NAME=VALUE` reaches every option (a section's field as `fp8.recipes=delayed,mxfp8`, a list
// comma-separated), and each documented flag (`--max-frames`, `--recipes`, ...) stands for one of
// them. An error of Options::validate() names the flag that set the option.
#include <sentinel/options.h>

#include <map>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace sentinel::cli {

class OptionFlags {
 public:
  void add_to(CLI::App* app);
  // The config (--config, else $SENTINEL_CONFIG), then the flags given, then `--set`s; validated.
  Options options() const;

 private:
  std::string config_;
  std::map<std::string, std::string> flag_text_;  // a documented flag -> its value as given
  std::vector<std::string> settings_;             // --set NAME=VALUE, in order
  bool warn_ = false, save_tensor_ = false;
  std::string tensor_pattern_, tensor_interval_;
};

}  // namespace sentinel::cli
