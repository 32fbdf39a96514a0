#pragma once
// Golden files: compared exactly after masking volatile fields. SENTINEL_UPDATE_GOLDEN=1
// rewrites them (review the diff before committing).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "support/test_paths.h"

namespace sentinel_test {

// Numbers printed as %8.2e depend on the BLAS build's last bits; layout, names and inf/nan do not.
inline std::string mask_numbers(const std::string& text) {
  static const std::regex number(R"(\d\.\d\de[+-]\d\d)");
  return std::regex_replace(text, number, "D.DDe+DD");
}

// The C++ call stack names this machine's build paths and inlining decisions: drop its lines.
inline std::string mask_cpp_stack(const std::string& text) {
  const std::string header = "C++ call stack at detection (innermost first):\n";
  auto start = text.find(header);
  if (start == std::string::npos) return text;
  auto end = start + header.size();
  while (end < text.size() && text.compare(end, 2, "  ") == 0) end = text.find('\n', end) + 1;
  return text.substr(0, start) + header + "  <masked>\n" + text.substr(end);
}

inline void expect_matches_golden(const std::string& actual, const std::string& name) {
  const std::string path = sentinel_test::golden_dir() + "/" + name;
  if (const char* update = std::getenv("SENTINEL_UPDATE_GOLDEN"); update && std::string(update) == "1") {
    std::ofstream(path) << actual;
    return;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing golden file " << path << " (run with SENTINEL_UPDATE_GOLDEN=1)";
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_EQ(actual, want.str()) << "differs from " << path;
}

}  // namespace sentinel_test
