#include "report/origin.h"

#include <fmt/format.h>

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

// The largest finite value of a floating dtype as reports name it; 0 for others.
double largest_finite(const std::string& dtype) {
  static const struct {
    const char* name;
    double max;
  } kTypes[] = {{"float16", 65504.0},           {"bfloat16", 3.3895313892515355e38}, {"float32", 3.4028234663852886e38},
                {"Float8_e4m3fn", 448.0},        {"Float8_e5m2", 57344.0},            {"Float8_e4m3fnuz", 240.0},
                {"Float8_e5m2fnuz", 57344.0}};
  for (const auto& t : kTypes) {
    if (dtype == t.name) return t.max;
  }
  return 0.0;
}

bool is_conversion(const std::string& op) {
  static const char* const kOps[] = {"aten::to", "aten::_to_copy", "aten::type_as", "aten::_autocast_to_reduced_precision",
                                     "aten::_autocast_to_full_precision", "aten::copy_"};
  for (const char* name : kOps) {
    if (op == name) return true;
  }
  return false;
}

const Entry* first_tensor(const Frame& f, bool output) {
  for (const auto& e : f.entries) {
    if (e.kind == EntryKind::Tensor && made_by_op(e) == output && e.role != EntryRole::Parameter) return &e;
  }
  return nullptr;
}

// For an op that made the first inf/nan from finite values by narrowing them: a conversion says
// its two dtypes and how many values exceeded the target's range (each one inf, or NaN in a
// format without inf); an op whose result is narrower than an argument (autocast runs a linear
// in float16, casting its float32 input inside) names the argument that did not fit.
std::string narrowing_note(const Frame& f) {
  const Entry* out = first_tensor(f, true);
  if (!out || out->stats.finite()) return "";
  const double limit = largest_finite(out->dtype);
  if (limit == 0.0) return "";
  if (is_conversion(f.op)) {
    const Entry* in = first_tensor(f, false);
    if (!in || in->dtype == out->dtype || in->stats.count != out->stats.count) return "";
    const int64_t overflowed = out->stats.nonfinite() - in->stats.nonfinite();
    if (overflowed <= 0) return "";
    return fmt::format("; a conversion {} → {}: {} value{} above {:g}, {}'s largest", in->dtype, out->dtype, overflowed,
                       overflowed == 1 ? "" : "s", limit, out->dtype);
  }
  for (const auto& e : f.entries) {
    if (e.kind != EntryKind::Tensor || made_by_op(e) || e.dtype == out->dtype || !e.stats.finite()) continue;
    if (largest_finite(e.dtype) <= limit || e.stats.abs_max <= limit) continue;
    return fmt::format("; its {} ({}, abs max {:.2e}) does not fit {}, the dtype its result was computed in (autocast "
                       "casts its arguments to it)",
                       e.label, e.dtype, e.stats.abs_max, out->dtype);
  }
  return "";
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
                    (m.inputs_finite ? ": all its inputs and parameters were finite" + narrowing_note(m) : "") +
                    "; tolerated inside " +
                    module_of(m) + " until " + escape_text(report.escape, t);
    return;
  }
  report.produced_here = t.inputs_finite && !t.outputs_finite;
  if (report.produced_here) {
    const std::string outputs = join_labels(t, true);
    report.origin = "origin: " + where(t) + " produced the first inf/nan" +
                    (outputs.empty() ? std::string(" (in an output not shown)") : " (in " + outputs + ")") +
                    ": all its inputs and parameters were finite" + narrowing_note(t);
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
