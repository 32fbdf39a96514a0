#pragma once
// Configs written into a fresh temporary directory per test, and checks of the errors they raise.
#include <gtest/gtest.h>
#include <sentinel/errors.h>
#include <sentinel/options.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace sentinel_test {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = std::filesystem::temp_directory_path() /
           ("sentinel_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Writes `text` to <dir>/<name> and returns the path.
  std::string write(const std::string& text, const std::string& name = "config.yaml") const {
    const std::filesystem::path path = dir_ / name;
    std::ofstream out(path, std::ios::binary);
    out << text;
    return path.string();
  }

  // The message of the OptionError that loading `text` raises ("" and a failure when none).
  std::string error_of(const std::string& text, std::string* path_out = nullptr) const {
    const std::string path = write(text);
    if (path_out) *path_out = path;
    try {
      sentinel::Options::from_yaml(path);
    } catch (const sentinel::OptionError& e) {
      return e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected sentinel::OptionError, got another exception: " << e.what();
      return {};
    }
    ADD_FAILURE() << "expected sentinel::OptionError for:\n" << text;
    return {};
  }

  // Loading `text` fails with a message that starts with "<path>:<line>: " and contains `parts`.
  void expect_error(const std::string& text, int line, const std::vector<std::string>& parts) const {
    std::string path;
    const std::string message = error_of(text, &path);
    const std::string prefix = path + ":" + std::to_string(line) + ": ";
    EXPECT_EQ(message.rfind(prefix, 0), 0u) << "expected prefix '" << prefix << "' in: " << message << "\nconfig:\n"
                                            << text;
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "expected '" << part << "' in: " << message;
    }
  }

  std::filesystem::path dir_;
};

// The 1-based line of the n-th (0-based) line of `text` that contains `needle`; 0 when none.
inline int line_containing(const std::string& text, const std::string& needle, int nth = 0) {
  int line = 1;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (text.substr(start, end - start).find(needle) != std::string::npos && nth-- == 0) return line;
    start = end + 1;
    ++line;
  }
  return 0;
}

}  // namespace sentinel_test
