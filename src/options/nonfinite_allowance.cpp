#include "options/nonfinite_allowance.h"

#include <fmt/format.h>

#include <sstream>
#include <stdexcept>
#include <vector>

namespace sentinel::options {

namespace {

bool field_matches(const std::string& pattern, const std::string& value) { return pattern == "*" || pattern == value; }

}  // namespace

bool NonfiniteAllowance::matches(const std::string& module_path, const std::string& op_name, const std::string& label,
                                 const TensorStats& stats) const {
  if (stats.finite()) return false;
  if ((stats.neg_inf > 0 && !neg_inf) || (stats.pos_inf > 0 && !pos_inf) || (stats.nan > 0 && !nan)) return false;
  return field_matches(op, op_name) && field_matches(argument, label) && std::regex_match(module_path, module);
}

NonfiniteAllowance parse_allowance(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> fields;
  for (std::string field; in >> field;) fields.push_back(field);
  if (fields.empty()) throw std::invalid_argument("is empty: it needs at least a module regex (\".*\" for any module)");
  if (fields.size() > 4) {
    throw std::invalid_argument(
        fmt::format("has {} fields; at most 4: MODULE_REGEX [OP [ARGUMENT [KINDS]]]", fields.size()));
  }
  NonfiniteAllowance a;
  a.text = text;
  try {
    a.module = std::regex(fields[0], std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw std::invalid_argument(fmt::format("has a module regex '{}' that does not parse: {}", fields[0], e.what()));
  }
  if (fields.size() > 1) a.op = fields[1];
  if (fields.size() > 2) a.argument = fields[2];
  if (fields.size() > 3) {
    a.neg_inf = a.pos_inf = a.nan = false;
    std::istringstream kinds(fields[3]);
    for (std::string kind; std::getline(kinds, kind, ',');) {
      if (kind == "-inf") a.neg_inf = true;
      else if (kind == "+inf" || kind == "inf") a.pos_inf = true;
      else if (kind == "nan") a.nan = true;
      else throw std::invalid_argument(fmt::format("names a kind '{}': the kinds are -inf, +inf, nan", kind));
    }
  }
  return a;
}

}  // namespace sentinel::options
