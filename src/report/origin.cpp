#include "report/origin.h"

#include <fmt/format.h>

#include <initializer_list>
#include <string>
#include <vector>

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

bool one_of(const std::string& op, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (op == name) return true;
  }
  return false;
}

bool is_conversion(const std::string& op) {
  return one_of(op, {"aten::to", "aten::_to_copy", "aten::type_as", "aten::_autocast_to_reduced_precision",
                     "aten::_autocast_to_full_precision", "aten::copy_", "aten::_foreach_copy_"});
}

// Ops whose result holds their arguments' values side by side, converted to its dtype where it
// differs (FSDP's copy into the reduce-scatter's buffer in reduce_dtype, its all-gather's in
// param_dtype): each argument is converted as a whole, whatever the result's size.
bool gathers_values(const std::string& op) {
  return one_of(op, {"aten::cat", "aten::stack", "aten::_chunk_cat", "fsdp::chunk_cat", "fsdp::all_gather_copy_in",
                     "fsdp::split_with_sizes_copy", "aten::split_with_sizes_copy"});
}

// For an op that made the first inf/nan from finite values by narrowing them: a conversion says
// what it converted, the two dtypes and how many values exceeded the target's range (each one
// inf, or NaN in a format without inf); an op whose result is narrower than an argument (autocast
// runs a linear in float16, casting its float32 input inside) names the argument that did not fit.
std::string narrowing_note(const Frame& f) {
  // (A backward node's arguments are incoming gradients: one that is large says nothing of which
  // of its own ops narrowed what.)
  if (f.direction != Direction::Forward) return "";
  const Entry* out = nullptr;
  for (const auto& e : f.entries) {
    if (e.kind == EntryKind::Tensor && made_by_op(e) && !e.stats.finite()) {
      out = &e;
      break;
    }
  }
  const double limit = out ? largest_finite(out->dtype) : 0.0;
  if (limit == 0.0) return "";
  // The arguments whose finite values the result's dtype cannot hold: wider, and beyond its range.
  std::vector<const Entry*> wide;
  for (const auto& e : f.entries) {
    if (e.kind != EntryKind::Tensor || made_by_op(e) || e.dtype == out->dtype || !e.stats.finite()) continue;
    if (largest_finite(e.dtype) <= limit || e.stats.abs_max <= limit) continue;
    wide.push_back(&e);
  }
  if (wide.empty()) return "";
  const Entry& in = *wide.front();
  if ((is_conversion(f.op) && in.stats.count == out->stats.count) || gathers_values(f.op)) {
    std::string labels;
    for (const Entry* e : wide) labels += (labels.empty() ? "" : ", ") + e->label;
    const int64_t overflowed = out->stats.nonfinite();
    return fmt::format("; a conversion of {} {} → {}: {} value{} above {:g}, {}'s largest", labels, in.dtype,
                       out->dtype, overflowed, overflowed == 1 ? "" : "s", limit, out->dtype);
  }
  return fmt::format("; its {} ({}, abs max {:.2e}) does not fit {}, the dtype its result was computed in: the op's "
                     "own cast to it (autocast's) made the inf",
                     in.label, in.dtype, in.stats.abs_max, out->dtype);
}

// What the op was handed but nothing read (memory that held no values yet, a tensor subclass):
// "finite" then says nothing of it.
std::string read_inputs_finite(const Frame& f) {
  static const char* const kUnread[] = {"uninitialized: not read", "partly written: not read", "tensor subclass: not read"};
  std::string unread;
  for (const auto& e : f.entries) {
    if (e.kind != EntryKind::Skipped || made_by_op(e)) continue;
    for (const char* reason : kUnread) {
      if (e.skip_reason == reason) unread += fmt::format("{}{} ({})", unread.empty() ? "" : ", ", e.label, reason);
    }
  }
  return unread.empty() ? ": all its inputs and parameters were finite"
                        : ": the inputs and parameters it read were finite; not read: " + unread;
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
                    (m.inputs_finite ? read_inputs_finite(m) + narrowing_note(m) : "") +
                    "; tolerated inside " +
                    module_of(m) + " until " + escape_text(report.escape, t);
    return;
  }
  report.produced_here = t.inputs_finite && !t.outputs_finite;
  if (report.produced_here) {
    const std::string outputs = join_labels(t, true);
    report.origin = "origin: " + where(t) + " produced the first inf/nan" +
                    (outputs.empty() ? std::string(" (in an output not shown)") : " (in " + outputs + ")") +
                    read_inputs_finite(t) + narrowing_note(t);
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
