#pragma once
// Per-thread capture state. RecordFunction callbacks are plain function pointers, so everything
// they need between a start and its end lives here.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include "capture/session.h"
#include "core/frame_record.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace sentinel {
namespace capture {

struct ScopeEntry {
  std::string name;                         // a named scope ("gate", RECORD_USER_SCOPE's name)
  const torch::nn::Module* module = nullptr;  // or a module scope
};

struct ThreadState {
  // Sessions made on this thread, innermost last; weak so a session destroyed elsewhere is
  // never touched again.
  std::vector<std::weak_ptr<Session>> bound;
  Session* explicit_batch = nullptr;  // batch() opened on this thread
  Session* auto_batch = nullptr;      // TorchScript forward running on this thread
  int op_depth = 0;
  int torchscript_depth = 0;
  int backward_depth = 0;

  std::vector<ScopeEntry> scopes;
  uint64_t scopes_version = 0;  // bumped on every push/pop, to cache the scope's place

  // The frame of the outermost op in flight, filled between its start and end callbacks.
  Session* open_frame_owner = nullptr;
  core::FrameRecord open_frame;

  // Backward: a training step's backward usually runs after its forward's batch has ended
  // (debug.forward(x), then loss.backward()); it belongs to the session that ran the last batch
  // on this thread.
  std::weak_ptr<Session> last_batch_session;
  Session* open_backward_owner = nullptr;
  int backward_node_op_depth = 0;  // op depth when the node started: its own ops are at this depth
  core::FrameRecord open_backward_frame;

  // The outermost op in flight, for a dump of its arguments should its frame trip. The arguments
  // are held from its start: RecordFunction's view of them does not outlive the start callback
  // of an unboxed call. Cleared at its end (the vector keeps its capacity: no allocation per op).
  struct EndingOp {
    const core::FrameRecord* frame = nullptr;  // set while its end callback runs
    std::string op, overload;
    std::vector<c10::IValue> inputs;
    c10::ArrayRef<c10::IValue> outputs;
    bool in_place = false;
  } ending_op;

  Session* active() const { return explicit_batch ? explicit_batch : auto_batch; }
};

ThreadState& thread_state();
// True once this thread's state has been destroyed: at its exit, before thread_local objects made
// earlier (a watchdog the user keeps in one), and on the main thread before static objects.
// Whatever is destroyed after it must not touch it.
bool thread_state_destroyed();

// The session that last opened a batch anywhere in the process. A backward pass may run its nodes
// on a thread that never ran a batch (LibTorch's autograd runs CUDA nodes on a worker thread per
// device); such nodes belong to this session.
void note_batch_session(const std::weak_ptr<Session>& session);
std::shared_ptr<Session> last_batch_session_in_process();

// Registers the process-wide RecordFunction callback while at least one session exists.
void acquire_callback();
void release_callback();

}  // namespace capture
}  // namespace sentinel
