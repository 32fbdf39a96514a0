#pragma once
// JSON as text, for every writer: names of modules, scopes, layers and files are the user's
// strings, and nlohmann::json::dump throws on bytes that are not UTF-8. Such bytes are written as
// U+FFFD instead: a report with one odd name is still written, never lost to an exception.
#include <nlohmann/json.hpp>

#include <string>

namespace sentinel {
namespace report {

inline std::string json_text(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

}  // namespace report
}  // namespace sentinel
