// Who made a value, decided from the call rather than the schema: whether an alias-annotated op
// copied (aten::to's dtype change, reshape of a non-contiguous tensor), and which memory holds no
// values yet (the empty family's results, until something writes them).
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/InferenceMode.h>

#include "core/entry_builder.h"
#include "core/watchdog_impl.h"

namespace sentinel {

using frames::FrameRecord;

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
  if (uninitialized.empty()) return;
  for_each_tensor(inputs, [&](const at::Tensor& t) { uninitialized.written(t); });
}

}  // namespace sentinel
