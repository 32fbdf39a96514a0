#pragma once
// Whether an op's name ("aten::mul") is one of a fixed list of ATen op names.
#include <cstddef>
#include <cstring>

namespace sentinel {
namespace capture {

template <size_t N>
bool is_aten_op_in(const char* op_name, const char* const (&ops)[N]) {
  if (std::strncmp(op_name, "aten::", 6) != 0) return false;
  for (const char* op : ops) {
    if (std::strcmp(op_name, op) == 0) return true;
  }
  return false;
}

}  // namespace capture
}  // namespace sentinel
