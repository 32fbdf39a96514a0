#pragma once
// A frame's entry by its label ("input[0][17]", "output"), or nullptr.
#include <sentinel/report.h>

#include <string>

namespace sentinel_test {

inline const sentinel::Entry* find_entry(const sentinel::Frame& f, const std::string& label) {
  for (const auto& e : f.entries) if (e.label == label) return &e;
  return nullptr;
}

}  // namespace sentinel_test
