// Who made a value, decided from the call rather than the schema: whether an alias-annotated op
// copied (aten::to's dtype change, reshape of a non-contiguous tensor), and which memory holds no
// values yet (the empty family's results, until something writes them).
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/InferenceMode.h>

#include "core/entry_builder.h"
#include "core/watchdog_impl.h"

namespace sentinel {

using frames::EntryState;
using frames::FrameRecord;
using frames::Role;

namespace {

// Calls f(tensor) for each defined tensor of `values`, lists included.
template <typename F>
void for_each_tensor(c10::ArrayRef<c10::IValue> values, F&& f) {
  for (const auto& v : values) {
    if (v.isTensor()) {
      if (v.toTensor().defined()) f(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) {
        if (t.defined()) f(t);
      }
    }
  }
}

}  // namespace

bool Watchdog::Impl::settle_copy_or_view(FrameRecord& f, c10::ArrayRef<c10::IValue> outputs, capture::ThreadState& ts) {
  f.undecided = FrameRecord::Undecided::No;
  const std::vector<c10::IValue>& inputs = ts.ending_op.inputs;
  bool copied = false;
  for_each_tensor(outputs, [&](const at::Tensor& result) {
    const uintptr_t storage = core::storage_key(result);
    bool shared = false;
    for_each_tensor(inputs, [&](const at::Tensor& t) { shared = shared || core::storage_key(t) == storage; });
    copied = copied || !shared;
  });
  if (!copied) return false;  // a view: the same values in the same memory, read where they were made
  // A copy: new memory, and for a conversion new values. Its arguments are read now (the op
  // wrote none of them: a schema that annotates its results as aliases declares no write).
  c10::InferenceMode no_autograd;
  c10::SmallVector<const core::ParamRef*, 8> params;
  find_params(inputs, ts, params);
  add_arguments(f, inputs, op_infos[f.op_key], params, 0, 0, 0);
  return true;
}

void Watchdog::Impl::note_uninitialized(c10::ArrayRef<c10::IValue> outputs) {
  for_each_tensor(outputs, [&](const at::Tensor& t) { uninitialized.made(t); });
}

void Watchdog::Impl::note_written_memory(const OpInfo& info, c10::ArrayRef<c10::IValue> outputs,
                                         const std::vector<c10::IValue>& held) {
  // Arguments written and not returned (a _foreach_ op's, an optimizer's), held since the start.
  for (size_t i = 0; i < held.size() && i < 64; ++i) {
    if ((info.written_unreturned >> i) & 1) for_each_tensor(held[i], [&](const at::Tensor& t) { uninitialized.written(t); });
  }
  // A result in memory that held no values: written by the op. In full where the op declares a
  // write (copy_, an out= argument: their results are the arguments written); where it does not (a
  // custom op handed a buffer, returning a view of the part it filled), how much is unknown.
  for_each_tensor(outputs, [&](const at::Tensor& t) {
    if (!uninitialized.tracks(t)) return;
    if (info.writes) uninitialized.written(t);
    else uninitialized.written_in_part(t);
  });
}

void Watchdog::Impl::note_collective_writes(c10::ArrayRef<c10::IValue> inputs) {
  for_each_tensor(inputs, [&](const at::Tensor& t) {
    if (!t.has_storage()) return;
    collective_memory.insert_or_assign(core::storage_key(t), t.storage().getWeakStorageImpl());
    if (!uninitialized.empty()) uninitialized.written(t);
  });
}

bool Watchdog::Impl::nonfinite_from_collective(const FrameRecord& f) const {
  if (collective_memory.empty()) return false;
  const auto written_by_collective = [&](uintptr_t storage) {
    const auto it = storage != 0 ? collective_memory.find(storage) : collective_memory.end();
    return it != collective_memory.end() && !it->second.expired();
  };
  for (int i = 0; i < f.entry_count; ++i) {
    const auto& e = f.entries[i];
    if (e.role == Role::Output) continue;
    if (e.state == EntryState::Read && !e.stats.finite() && written_by_collective(e.storage)) return true;
    // A copy into a collective's result: the collective finishing its write from its own buffer
    // (Gloo's reduce-scatter copies what it received into the output as its work is waited on).
    if (e.state == EntryState::Skipped && e.skip_reason == static_cast<uint8_t>(stats::Readability::Overwritten) &&
        written_by_collective(e.storage)) {
      return true;
    }
  }
  return false;
}

}  // namespace sentinel
