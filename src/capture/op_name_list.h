#pragma once
// Op names: whether one has a namespace, whether it is one of a fixed list of ATen op names.
#include <cstddef>
#include <cstring>

namespace sentinel {
namespace capture {

// A name with a namespace ("aten::mul"): a short scan by hand, since every op of every step asks
// (strstr's setup cost a measurable share of the watched step's host time).
inline bool has_namespace(const char* name) {
  for (const char* p = name; *p != '\0'; ++p) {
    if (p[0] == ':' && p[1] == ':') return true;
  }
  return false;
}

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
