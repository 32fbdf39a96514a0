// Turns compact frame records into the plain Report values that renderers consume.
#include <c10/core/ScalarType.h>

#include <algorithm>

#include "core/watchdog_impl.h"
#include "stats/tensor_stats.h"

namespace sentinel {

namespace {

std::string entry_label(const core::EntryRecord& e, const core::StringTable& strings) {
  if (e.param_name != 0) {  // a parameter, or (an output of AccumulateGrad) its gradient
    return e.role == core::Role::Param ? strings.at(e.param_name) : strings.at(e.param_name) + ".grad";
  }
  std::string label = e.role == core::Role::Input ? "input" : "output";
  if (e.index >= 0) label += "[" + std::to_string(e.index) + "]";
  if (e.sub_index >= 0) label += "[" + std::to_string(e.sub_index) + "]";
  return label;
}

std::string dtype_text(int8_t dtype) {
  return dtype < 0 ? std::string() : stats::dtype_name(static_cast<c10::ScalarType>(dtype));
}

std::string join_labels(const Frame& f, bool inputs) {
  std::string out;
  for (const auto& e : f.entries) {
    if (e.is_output == inputs || e.kind != EntryKind::Tensor || e.stats.finite()) continue;
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

Frame Watchdog::Impl::to_frame(const core::FrameRecord& r) const {
  Frame f;
  f.batch_number = r.batch_number;
  f.op_index = r.op_index;
  f.direction = static_cast<Direction>(r.direction);
  f.module_path = places.path(r.place);
  f.module_class = places.cls(r.place);
  f.op = strings.at(r.op);
  if (r.forward_op != 0) f.forward_op = strings.at(r.forward_op);
  f.attribution = static_cast<Attribution>(r.attribution);
  f.entries_omitted = r.entries_omitted;
  f.inputs_finite = r.inputs_finite;
  f.outputs_finite = r.outputs_finite;
  // HF's order: parameters, inputs, outputs (each in call order).
  for (core::Role role : {core::Role::Param, core::Role::Input, core::Role::Output}) {
    for (int i = 0; i < r.entry_count; ++i) {
      const auto& e = r.entries[i];
      if (e.role != role) continue;
      Entry out;
      out.label = entry_label(e, strings);
      out.is_output = e.role == core::Role::Output;
      out.has_headroom = e.has_headroom;
      out.headroom = e.headroom;
      out.dtype = dtype_text(e.dtype);
      out.stats = e.stats;
      switch (e.state) {
        case core::EntryState::Read: out.kind = EntryKind::Tensor; break;
        case core::EntryState::None: out.kind = EntryKind::None; break;
        case core::EntryState::NotATensor: out.kind = EntryKind::NotATensor; break;
        case core::EntryState::Skipped:
          out.kind = EntryKind::Skipped;
          out.skip_reason = stats::describe(static_cast<stats::Readability>(e.skip_reason));
          break;
      }
      f.entries.push_back(std::move(out));
    }
  }
  return f;
}

Report Watchdog::Impl::build_report() const {
  Report report;
  for (size_t i = 0; i < ring.size(); ++i) report.frames.push_back(to_frame(ring.at(i)));
  const Frame& t = report.trigger();
  report.batch_number = t.batch_number;
  report.produced_here = t.inputs_finite && !t.outputs_finite;
  if (report.produced_here) {
    const std::string outputs = join_labels(t, false);
    report.origin = "origin: " + where(t) + " produced the first inf/nan" +
                    (outputs.empty() ? std::string(" (in an output not shown)") : " (in " + outputs + ")") +
                    ": all its inputs and parameters were finite";
  } else {
    std::string params, inputs;
    for (const auto& e : t.entries) {
      if (e.kind != EntryKind::Tensor || e.stats.finite() || e.is_output) continue;
      if (e.label.rfind("input", 0) == 0) inputs += (inputs.empty() ? "" : ", ") + e.label;
      else {
        params += (params.empty() ? "" : ", ") + (t.module_path.empty() ? e.label : t.module_path + "." + e.label);
      }
    }
    report.origin = "origin: inf/nan passed through " + where(t) + " - it was already in ";
    if (!params.empty()) report.origin += "parameter " + params + (inputs.empty() ? "" : " and ");
    if (!inputs.empty()) report.origin += inputs;
    if (params.empty() && inputs.empty()) report.origin += "an input not shown (beyond the per-frame entry limit)";
    if (t.op_index == 0 && !inputs.empty()) report.origin += " (the batch's input)";
  }
  return report;
}

}  // namespace sentinel
