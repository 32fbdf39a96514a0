#pragma once
// An entry's label as reports show it: a parameter's name ("weight"), its gradient's
// ("weight.grad"), "input[i][j]" / "output[i]" / "output", or a path into a module's argument or
// result ("output.logits").
#include <string>

#include "frames/frame_record.h"
#include "frames/string_table.h"

namespace sentinel::frames {

inline std::string entry_label(const EntryRecord& e, const StringTable& strings) {
  if (e.path != 0) return strings.at(e.path);
  if (e.param_name != 0) {  // a parameter, or (an output of AccumulateGrad) its gradient
    return e.role == Role::Param ? strings.at(e.param_name) : strings.at(e.param_name) + ".grad";
  }
  std::string label = e.role == Role::Input ? "input" : "output";
  if (e.index >= 0) label += "[" + std::to_string(e.index) + "]";
  if (e.sub_index >= 0) label += "[" + std::to_string(e.sub_index) + "]";
  return label;
}

}  // namespace sentinel::frames
