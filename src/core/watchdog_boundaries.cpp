// Frames of module boundaries: what a module was handed or returned, what a compiled call made.
#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>
#include <torch/nn/module.h>

#include "core/entry_builder.h"
#include "core/watchdog_impl.h"

namespace sentinel {

using frames::EntryRecord;
using frames::FrameRecord;
using frames::Role;

void Watchdog::Impl::check_returned(uint32_t module_place, const std::vector<at::Tensor>& outputs,
                                    std::unique_lock<std::mutex>& lock) {
  if (!place_rule || !place_rule->holds_any() || delivery.stopped() || !batches.open() ||
      batches.is_traced(batches.current())) {
    return;
  }
  // Only the outputs holding a tolerated value are read: reading every module's outputs would
  // double the cost of watching.
  std::vector<size_t> worth;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (place_rule->holds_tolerated(core::storage_key(outputs[i]), module_place)) worth.push_back(i);
  }
  if (worth.empty()) return;
  c10::InferenceMode no_autograd;
  FrameRecord f = boundary_frame(module_place, BoundaryFrame::Returned);
  for (size_t i : worth) {
    f.add(read_entry(f, outputs[i], Role::Output, outputs.size() == 1 ? -1 : static_cast<int>(i), -1, false));
  }
  finish_frame(f, lock);
}

void Watchdog::Impl::prove_finite(c10::ArrayRef<at::Tensor> tensors, double bound) {
  const uint32_t proof = ++proofs;
  for (const at::Tensor& t : tensors) {
    if (t.defined() && !t.is_inference()) keep_magnitude_of(t, bound, proof);
  }
}

const Watchdog::Impl::ReadMagnitude* Watchdog::Impl::magnitude_of(const c10::TensorImpl* impl) const {
  const auto found = read_magnitudes.find(impl);
  if (found == read_magnitudes.end()) return nullptr;
  // (The address may be a freed tensor's, reused: the record's own tensor must be this one.)
  const auto held = found->second.tensor.lock();
  if (held.get() != impl || held->version_counter().current_version() != found->second.version) return nullptr;
  return &found->second;
}

bool Watchdog::Impl::proven_entry(const at::Tensor& t, EntryRecord& e) const {
  if (!t.defined() || read_magnitudes.empty()) return false;
  const ReadMagnitude* known = magnitude_of(t.unsafeGetTensorImpl());
  if (!known || known->proof == 0) return false;
  e.state = frames::EntryState::Proven;
  e.dtype = static_cast<int8_t>(t.scalar_type());
  e.storage = core::storage_key(t);
  e.proven_tensor = t.unsafeGetTensorImpl();
  e.proof = known->proof;
  return true;
}

FrameRecord Watchdog::Impl::boundary_frame(uint32_t module_place, BoundaryFrame kind) {
  static constexpr const char* kOps[] = {"call", "return", "compiled call", "forward"};
  FrameRecord f;
  f.reset();
  f.batch_number = batches.current();
  f.op = f.op_key = strings.intern(kOps[static_cast<int>(kind)]);
  f.direction = static_cast<uint8_t>(Direction::Forward);
  f.place = f.module_place = module_place;
  f.attribution = static_cast<uint8_t>(Attribution::UserScope);
  f.in_model = true;
  f.is_return = kind == BoundaryFrame::Returned;
  return f;
}

void Watchdog::Impl::record_boundary(uint32_t module_place, BoundaryFrame kind,
                                     const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                     std::unique_lock<std::mutex>& lock) {
  if (delivery.stopped() || !batches.open()) return;
  c10::InferenceMode no_autograd;
  const bool handed = kind == BoundaryFrame::Handed;
  const Role role = handed ? Role::Input : Role::Output;
  // A cache of many layers fills several frames, in order.
  const size_t per_frame = handed ? FrameRecord::kMaxInputEntries : FrameRecord::kMaxEntries;
  for (size_t start = 0; start < tensors.size(); start += per_frame) {
    FrameRecord f = boundary_frame(module_place, kind);
    const size_t end = std::min(tensors.size(), start + per_frame);
    for (size_t i = start; i < end; ++i) {
      EntryRecord e = read_entry(f, tensors[i].second, role, -1, -1, opts.headroom());
      e.path = strings.intern(tensors[i].first);
      f.add(e);
    }
    finish_frame(f, lock);
    if (delivery.stopped()) return;
  }
}

void Watchdog::Impl::record_whole_module(const torch::nn::Module& module, uint32_t module_place,
                                         const std::vector<std::pair<std::string, at::Tensor>>& inputs,
                                         const std::vector<std::pair<std::string, at::Tensor>>& outputs,
                                         const std::vector<std::pair<std::string, at::Tensor>>& buffers,
                                         std::unique_lock<std::mutex>& lock) {
  if (delivery.stopped() || !batches.open()) return;
  c10::InferenceMode no_autograd;
  FrameRecord f = boundary_frame(module_place, BoundaryFrame::Module);
  f.whole_module = true;
  // The inputs are mostly what earlier modules returned, read then: the batch's read cache serves
  // them. (FrameRecord::add keeps room for the outputs, and a non-finite entry over a finite one.)
  // What a frame that goes on with the outputs repeats: the inf/nan the module was handed, which
  // the place rule does not take for the module's own when it returns them.
  std::vector<EntryRecord> handed_nonfinite;
  auto add = [&](const std::pair<std::string, at::Tensor>& named, Role role) {
    EntryRecord e = read_entry(f, named.second, role, -1, -1, false);
    e.path = strings.intern(named.first);
    if (role == Role::Input && !e.stats.finite()) handed_nonfinite.push_back(e);
    f.add(e);
  };
  // As HF's frames: the module's own parameters, what it was handed, what it returned. A
  // parameter is read once a batch (the cache serves its later calls: its version is unchanged),
  // or not at all where what the optimizer's step wrote into it was proven finite.
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    EntryRecord e = core::make_entry(Role::Param, -1, -1);
    if (!proven_entry(p.value(), e)) e = read_entry(f, p.value(), Role::Param, -1, -1, false);
    e.param_name = strings.intern(p.key());
    f.add(e);
  }
  for (const auto& named : inputs) add(named, Role::Input);
  auto make_room = [&] {
    if (f.has_room(Role::Output)) return true;
    // (a cache of many layers): the outputs go on in the next frame
    finish_frame(f, lock);
    if (delivery.stopped()) return false;
    if (!lock.owns_lock()) lock.lock();  // (a trip that warns unlocks to report)
    f = boundary_frame(module_place, BoundaryFrame::Module);
    f.whole_module = true;
    for (const EntryRecord& e : handed_nonfinite) f.add(e);
    return true;
  };
  for (const auto& named : outputs) {
    if (!make_room()) return;
    add(named, Role::Output);
  }
  // A buffer the forward may have written without counting a version: read anew, and shown only
  // where it holds an inf/nan (HF's frames list no buffer), which the module wrote, or waits for a device.
  for (const auto& [name, t] : buffers) {
    EntryRecord e = read_entry(f, t, Role::Output, -1, -1, false, nullptr, /*reuse_reads=*/false);
    if (e.pending_slot < 0 && e.stats.finite()) continue;
    e.path = strings.intern(name);
    e.written_argument = true;
    if (!make_room()) return;
    f.add(e);
  }
  finish_frame(f, lock);
}

void Watchdog::Impl::record_written(const std::string& what,
                                    const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                    std::unique_lock<std::mutex>& lock) {
  if (delivery.stopped() || !batches.open()) return;
  c10::InferenceMode no_autograd;
  // Outside the model: any inf/nan there is an error, as an op outside the model that made it.
  FrameRecord f = boundary_frame(0, BoundaryFrame::Module);
  f.op = f.op_key = strings.intern(what);
  f.in_model = false;
  // A fused optimizer writes without counting a version: nothing read before its step is reused.
  const KeepingMagnitudes keeping(*this);
  for (const auto& [name, t] : tensors) {
    EntryRecord e = read_entry(f, t, Role::Output, -1, -1, false, nullptr, /*reuse_reads=*/false);
    e.path = strings.intern(name);  // (what the step wrote: its output, named as the tensor is)
    f.add(e);
  }
  finish_frame(f, lock);
}

}  // namespace sentinel
