#include "report/origin.h"

#include <string>

namespace sentinel {
namespace report {
namespace {

bool made_by_op(const Entry& e) { return e.role == EntryRole::Output || e.role == EntryRole::Gradient; }

std::string join_labels(const Frame& f, bool outputs) {
  std::string out;
  for (const auto& e : f.entries) {
    if (made_by_op(e) != outputs || e.kind != EntryKind::Tensor || e.stats.finite()) continue;
    if (!out.empty()) out += ", ";
    out += e.label;
  }
  return out;
}

std::string where(const Frame& f) {
  std::string place = f.module_path.empty() ? "the model's root" : f.module_path;
  if (!f.module_class.empty()) place += " (" + f.module_class + ")";
  if (f.direction == Direction::Backward && f.op == "AccumulateGrad") return "the parameter gradients of " + place;
  if (f.direction == Direction::Backward) {
    return "backward node " + f.op + " (the gradient of " + (f.forward_op.empty() ? "an op" : f.forward_op) +
           " in " + place + ")";
  }
  return f.op + " in " + place;
}

}  // namespace

void describe_origin(Report& report) {
  const Frame& t = report.trigger();
  report.batch_number = t.batch_number;
  report.produced_here = t.inputs_finite && !t.outputs_finite;
  if (report.produced_here) {
    const std::string outputs = join_labels(t, true);
    report.origin = "origin: " + where(t) + " produced the first inf/nan" +
                    (outputs.empty() ? std::string(" (in an output not shown)") : " (in " + outputs + ")") +
                    ": all its inputs and parameters were finite";
    return;
  }
  std::string params, inputs;
  for (const auto& e : t.entries) {
    if (e.kind != EntryKind::Tensor || e.stats.finite() || made_by_op(e)) continue;
    if (e.role == EntryRole::Input) {
      inputs += (inputs.empty() ? "" : ", ") + e.label;
    } else {
      params += (params.empty() ? "" : ", ") + (t.module_path.empty() ? e.label : t.module_path + "." + e.label);
    }
  }
  report.origin = "origin: inf/nan passed through " + where(t) + " - it was already in ";
  if (!params.empty()) report.origin += "parameter " + params + (inputs.empty() ? "" : " and ");
  if (!inputs.empty()) report.origin += inputs;
  if (params.empty() && inputs.empty()) report.origin += "an input not shown (beyond the per-frame entry limit)";
  if (t.op_index == 0 && !inputs.empty()) report.origin += " (the batch's input)";
}

}  // namespace report
}  // namespace sentinel
