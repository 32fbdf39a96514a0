#pragma once
// Options::allow_nonfinite: one pattern, "MODULE_REGEX [OP [ARGUMENT [KINDS]]]" (fields apart by
// spaces), for a value the place rule would stop that the model means. MODULE_REGEX matches the
// whole path of the module whose op would be stopped ("" the root); OP is the op as frames show
// it ("aten::add"; "return" for a module's forward returning it) and ARGUMENT the entry's label
// ("input[1]", "output", "weight"), "*" for any; KINDS a comma list of -inf, +inf, nan (default
// -inf). Every non-finite element the stopped entry holds must be of those kinds.
#include <sentinel/stats.h>

#include <regex>
#include <string>

namespace sentinel::options {

struct NonfiniteAllowance {
  std::string text;  // as the user wrote it
  std::regex module;
  std::string op = "*";
  std::string argument = "*";
  bool neg_inf = true;
  bool pos_inf = false;
  bool nan = false;

  bool matches(const std::string& module_path, const std::string& op_name, const std::string& label,
               const TensorStats& stats) const;
};

// Throws std::invalid_argument saying what in `text` does not parse.
NonfiniteAllowance parse_allowance(const std::string& text);

}  // namespace sentinel::options
