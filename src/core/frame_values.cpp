// Turns compact frame records into the plain Report values that renderers consume.
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <algorithm>

#include "core/watchdog_impl.h"
#include "frames/entry_label.h"
#include "report/origin.h"
#include "stats/tensor_stats.h"

namespace sentinel {

namespace {

std::string dtype_text(int8_t dtype) {
  return dtype < 0 ? std::string() : stats::dtype_name(static_cast<c10::ScalarType>(dtype));
}

}  // namespace

Frame Watchdog::Impl::to_frame(const frames::FrameRecord& r) const {
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
  f.recomputed = r.recomputed;
  if (r.error != 0) f.error = strings.at(r.error);
  // HF's order: parameters, inputs, outputs (each in call order).
  for (frames::Role role : {frames::Role::Param, frames::Role::Input, frames::Role::Output}) {
    for (int i = 0; i < r.entry_count; ++i) {
      const auto& e = r.entries[i];
      if (e.role != role) continue;
      Entry out;
      out.label = frames::entry_label(e, strings);
      out.role = e.role == frames::Role::Param    ? EntryRole::Parameter
                 : e.role == frames::Role::Input  ? EntryRole::Input
                 : e.param_name != 0              ? EntryRole::Gradient
                                                  : EntryRole::Output;
      out.is_output = e.role == frames::Role::Output;
      out.has_headroom = e.has_headroom;
      out.headroom = e.headroom;
      out.dtype = dtype_text(e.dtype);
      out.stats = e.stats;
      switch (e.state) {
        case frames::EntryState::Read: out.kind = EntryKind::Tensor; break;
        case frames::EntryState::None: out.kind = EntryKind::None; break;
        case frames::EntryState::NotATensor: out.kind = EntryKind::NotATensor; break;
        case frames::EntryState::Skipped:
          out.kind = EntryKind::Skipped;
          out.skip_reason = stats::describe(static_cast<stats::Readability>(e.skip_reason));
          break;
        case frames::EntryState::Proven: read_proven(e, out); break;
      }
      f.entries.push_back(std::move(out));
    }
  }
  return f;
}

void Watchdog::Impl::read_proven(const frames::EntryRecord& e, Entry& out) const {
  out.kind = EntryKind::Skipped;
  out.skip_reason = stats::describe(stats::Readability::ProvenThenWritten);
  // The frame saw what the proof covered while no later proof or read replaced it and the
  // tensor's version is still the one proven.
  const ReadMagnitude* known = magnitude_of(static_cast<const c10::TensorImpl*>(e.proven_tensor));
  if (!known || known->proof != e.proof) return;
  const at::Tensor t(known->tensor.lock());
  const stats::Readability r = stats::compute(t, out.stats);
  if (r != stats::Readability::Read) {
    out.skip_reason = stats::describe(r);
    return;
  }
  out.kind = EntryKind::Tensor;
}

Report Watchdog::Impl::build_report(const core::DetectionPolicy::Judgement* judged) const {
  Report report;
  for (size_t i = 0; i < ring.size(); ++i) report.frames.push_back(to_frame(ring.at(i)));
  if (judged) {
    report.escape = judged->escape;
    if (judged->made_by) report.origin_frame = to_frame(*judged->made_by);
  }
  report.tolerated = delivery.policy().tolerated();
  report::describe_origin(report);
  return report;
}

}  // namespace sentinel
