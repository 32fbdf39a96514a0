#pragma once
// Runs a shell command and returns its exit code with its standard output and error together.
#include <array>
#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace sentinel_test {

struct Run {
  int code;  // -1 when the command did not exit normally
  std::string output;
};

inline Run shell(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace sentinel_test
