#pragma once
// How the front ends read words alike: names compared case-insensitively, and the boolean words
// of YAML 1.1 (which yaml-cpp and PyYAML, TransformerEngine's reader, accept), on the command line
// too.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>

namespace sentinel::options {

inline std::string lower_case(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// true / false for a boolean word in any case; nullopt for anything else.
inline std::optional<bool> boolean_word(std::string_view text) {
  const std::string low = lower_case(text);
  if (low == "true" || low == "yes" || low == "on") return true;
  if (low == "false" || low == "no" || low == "off") return false;
  return std::nullopt;
}

}  // namespace sentinel::options
