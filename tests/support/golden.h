#pragma once
// Golden files: compared exactly after masking volatile fields. SENTINEL_UPDATE_GOLDEN=1
// rewrites them (review the diff before committing).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace sentinel_test {

// Numbers printed as %8.2e depend on the BLAS build's last bits; layout, names and inf/nan do not.
inline std::string mask_numbers(const std::string& text) {
  static const std::regex number(R"(\d\.\d\de[+-]\d\d)");
  return std::regex_replace(text, number, "D.DDe+DD");
}

inline void expect_matches_golden(const std::string& actual, const std::string& name) {
  const std::string path = std::string(SENTINEL_GOLDEN_DIR) + "/" + name;
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
