#pragma once
// What the capture layer calls into: one watched model. The RecordFunction callback finds the
// session for the current thread and hands it the outermost ops.
#include <memory>

namespace at {
class RecordFunction;
}

namespace sentinel {
namespace capture {

struct ThreadState;

class Session {
 public:
  virtual ~Session() = default;
  // TorchScript sessions open a batch at each top-level `forward` on their thread.
  virtual bool opens_batches_on_torchscript_forward() const = 0;
  virtual void begin_auto_batch() = 0;
  virtual void end_auto_batch() = 0;
  // Outermost FUNCTION-scope op: inputs are only readable in the start callback.
  virtual void op_start(const at::RecordFunction& fn, ThreadState& thread) = 0;
  virtual void op_end(const at::RecordFunction& fn, ThreadState& thread) = 0;
  // An autograd node (BACKWARD_FUNCTION): its incoming gradients are its inputs; the gradients it
  // produces are the outputs of the ops it runs (autograd gives the node's own outputs to no one).
  virtual void backward_node_start(const at::RecordFunction& fn, ThreadState& thread) = 0;
  virtual void backward_op_end(const at::RecordFunction& fn, ThreadState& thread) = 0;
  virtual void backward_node_end(ThreadState& thread) = 0;
};

}  // namespace capture
}  // namespace sentinel
