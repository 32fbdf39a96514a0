#include "report/origin.h"

#include <string>

#include "stats/tensor_stats.h"

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

std::string module_of(const Frame& f) {
  std::string place = f.module_path.empty() ? "the model's root" : f.module_path;
  if (!f.module_class.empty()) place += " (" + f.module_class + ")";
  return place;
}

std::string where(const Frame& f) {
  const std::string place = module_of(f);
  if (f.direction == Direction::Backward && f.op == "AccumulateGrad") return "the parameter gradients of " + place;
  if (f.direction == Direction::Backward) {
    return "backward node " + f.op + " (the gradient of " + (f.forward_op.empty() ? "an op" : f.forward_op) +
           " in " + place + ")";
  }
  return f.op + " in " + place;
}

// The latest fused TorchScript group (Options::keep_torchscript_fusion) before the trigger in its
// batch: its results were not read, so an inf/nan first seen after it may have been made in it.
const Frame* unread_fused_group_before(const Report& report) {
  const Frame& t = report.trigger();
  for (size_t i = report.frames.size(); i-- > 1;) {
    const Frame& f = report.frames[i - 1];
    if (f.batch_number != t.batch_number || f.direction != t.direction) break;
    for (const auto& e : f.entries) {
      if (e.kind == EntryKind::Skipped && e.skip_reason == stats::describe(stats::Readability::InsideFusedKernel)) return &f;
    }
  }
  return nullptr;
}

// How a value tolerated inside the module that made it became an error at `t`.
std::string escape_text(Escape escape, const Frame& t) {
  switch (escape) {
    case Escape::Read: return where(t) + " read it";
    case Escape::Written:
      return where(t) + " wrote it into a tensor that module did not make (a parameter, a buffer or its input)";
    case Escape::Returned: return module_of(t) + " returned it from its forward";
    case Escape::None: break;
  }
  return where(t) + " met it";
}

}  // namespace

void describe_origin(Report& report) {
  const Frame& t = report.trigger();
  report.batch_number = t.batch_number;
  if (report.origin_frame) {
    // The value was made earlier and tolerated inside its module: the origin is the op that made it.
    const Frame& m = *report.origin_frame;
    const std::string outputs = join_labels(m, true);
    report.produced_here = false;
    report.origin = "origin: " + where(m) + " produced the first inf/nan" +
                    (outputs.empty() ? std::string() : " (in " + outputs + ")") +
                    (m.inputs_finite ? ": all its inputs and parameters were finite" : "") + "; tolerated inside " +
                    module_of(m) + " until " + escape_text(report.escape, t);
    return;
  }
  report.produced_here = t.inputs_finite && !t.outputs_finite;
  if (report.produced_here) {
    const std::string outputs = join_labels(t, true);
    report.origin = "origin: " + where(t) + " produced the first inf/nan" +
                    (outputs.empty() ? std::string(" (in an output not shown)") : " (in " + outputs + ")") +
                    ": all its inputs and parameters were finite";
    if (report.escape == Escape::Written) report.origin += ", and wrote it into a tensor its module did not make";
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
  if (const Frame* fused = unread_fused_group_before(report)) {
    report.origin += "; the fused TorchScript group " + fused->op +
                     " ran before it unread and may have made it (watch without keep_torchscript_fusion to see its ops)";
  }
}

}  // namespace report
}  // namespace sentinel
