// Gradient frames: one per autograd node run by backward(), linked to the forward op (and so the
// module) it differentiates through the autograd sequence number.
//
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/InferenceMode.h>

#include <cstring>

#include "capture/op_call.h"
#include "core/entry_builder.h"
#include "core/uninitialized_ops.h"
#include "core/gemm_ops.h"
#include "core/watchdog_impl.h"

namespace sentinel {

using frames::EntryRecord;
using frames::EntryState;
using frames::FrameRecord;
using frames::Role;

namespace {
// torch.compile's backward, one autograd node that runs the compiled backward graph.
bool is_compiled_backward(const char* node_name) { return std::strstr(node_name, "CompiledFunctionBackward") != nullptr; }
}  // namespace

bool Watchdog::Impl::backward_node_start(const capture::OpCall& fn, FrameRecord& f, capture::ThreadState&) {
  std::lock_guard<std::mutex> lock(mutex);
  if (delivery.stopped()) return false;
  // AccumulateGrad only adds a finished gradient into a parameter's .grad: that gradient was an
  // output of the node before it, and check_parameter_gradients() names it by parameter.
  if (std::strstr(fn.name(), "AccumulateGrad") != nullptr) return false;
  c10::InferenceMode no_autograd;
  if (is_compiled_backward(fn.name())) {
    ++compiled_backward_nodes;
    forget_reads();
  }

  f.batch_number = batches.current();
  f.direction = static_cast<uint8_t>(Direction::Backward);
  f.op = strings.intern(fn.name());
  auto link = forward_ops.find(fn.seq_nr());
  if (link != forward_ops.end()) {
    f.place = link->second.place;
    f.forward_op = link->second.op;
    f.attribution = link->second.attribution;
  } else {
    f.place = index->root_place();
    f.attribution = static_cast<uint8_t>(Attribution::ModelRoot);
  }
  const auto inputs = fn.inputs();  // the incoming gradients
  // The backward of a GEMM multiplies by its incoming gradient: FP8's gradient slot (E5M2 in HYBRID).
  const bool gemm_node = f.forward_op != 0 && core::is_gemm_backward_node(fn.name());
  const bool operand = gemm_node && gemm_mask(f.forward_op) != 0;
  core::Fp8Monitor& fp8 = observers.fp8();
  dumps::TensorDumper& dumper = observers.dumper();
  const bool probe_fp8 =
      operand && fp8.enabled() && fp8.wants(f.batch_number, gemm_mask(f.forward_op), f.place, places) != 0;
  const bool collect = operand && observers.collector().wants(f.batch_number, f.place, fp8::Role::Gradient, places);
  const bool dump = operand && dumper.enabled() && dumper.wants(f.batch_number, places.path(f.place));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].isTensor()) continue;
    const at::Tensor& g = inputs[i].toTensor();
    GemmOperand gemm{fp8::Role::Gradient, probe_fp8 && g.defined(), collect && g.defined()};
    f.add(read_entry(f, g, Role::Input, static_cast<int>(i), -1, false, gemm.probe || gemm.collect ? &gemm : nullptr));
    if (dump) dumper.save(g, places.path(f.place), "gradient", f.batch_number, opts.output());
  }
  backward_in_batch = true;
  ranks.backward_ran_in_batch = true;
  return true;
}

void Watchdog::Impl::backward_op_end(const capture::OpCall& fn, FrameRecord& f, capture::ThreadState&) {
  std::lock_guard<std::mutex> lock(mutex);
  if (delivery.stopped()) return;
  c10::InferenceMode no_autograd;
  if (core::returns_uninitialized(fn.name())) {
    note_uninitialized(fn.outputs());  // a buffer the node fills next
    return;
  }
  if (core::writes_asynchronously(fn.name())) {
    // A collective in the node (FSDP2's reduce-scatter of the gradients): what it returns is
    // written after it returns, and holds values from then on.
    note_collective_writes(fn.outputs());
    forget_reads();
    return;
  }
  // What the node's own ops return is what it produces: the gradients it passes on.
  int next = f.outputs_seen;
  for (const auto& v : fn.outputs()) {
    if (v.isTensor()) f.add(read_entry(f, v.toTensor(), Role::Output, next++, -1, false));
  }
}

void Watchdog::Impl::backward_node_end(FrameRecord& f, capture::ThreadState&) {
  std::unique_lock<std::mutex> lock(mutex);
  if (compiled_backward_nodes > 0 && is_compiled_backward(strings.at(f.op).c_str())) {
    // Its kernels may have written, in place, what its ops made and was read (a weight's
    // gradient scaled where the GEMM left it): the parameters' .grad is read again.
    --compiled_backward_nodes;
    forget_reads();
  }
  if (delivery.stopped()) return;
  finish_frame(f, lock);
}

void Watchdog::Impl::check_parameter_gradients() {
  std::unique_lock<std::mutex> lock(mutex);
  if (delivery.stopped() || !index) return;
  backward_in_batch = false;
  ranks.backward_ran_in_batch = true;
  if (batches.open()) gradients_checked_in_batch = true;
  capture::NotRecorded no_recursion;
  c10::InferenceMode no_autograd;
  const uint32_t op = strings.intern("AccumulateGrad");
  FrameRecord f;
  auto flush = [&] {
    if (f.entry_count + f.entries_omitted > 0 && !delivery.stopped()) finish_frame(f, lock);
    if (!lock.owns_lock()) lock.lock();  // a trip unlocks to report
  };
  uint32_t place = UINT32_MAX;
  const KeepingMagnitudes keeping(*this);
  for (const auto& [param, ref] : index->params()) {
    const at::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    if (ref.place != place) {  // one frame per module, as HF lists a module's parameters together
      if (place != UINT32_MAX) flush();
      f.reset();
      f.batch_number = batches.current();
      f.direction = static_cast<uint8_t>(Direction::Backward);
      f.op = op;
      f.place = ref.place;
      f.attribution = static_cast<uint8_t>(Attribution::Parameter);
      place = ref.place;
    }
    // At batch end the user's code has run since the backward: a gradient all-reduce writes the
    // gradients without bumping their version counters, so earlier reads of them are not reused.
    EntryRecord e = read_entry(f, grad, Role::Output, -1, -1, false, nullptr, /*reuse_reads=*/!ranks.grads_at_batch_end);
    e.param_name = ref.name;
    // A parameter's gradient is what AccumulateGrad produced: an output of this frame.
    e.role = Role::Output;
    f.add(e);
  }
  if (place != UINT32_MAX) flush();
  resolve_deferred(lock);  // the step's numbers are all in before it closes
  close_step_locked();  // the training step is complete: forward, backward, gradients
}

}  // namespace sentinel
