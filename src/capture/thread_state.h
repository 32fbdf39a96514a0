#pragma once
// Per-thread capture state. RecordFunction callbacks are plain function pointers, so everything
// they need between a start and its end lives here. Sessions are reached through anchors only
// (src/capture/session.h): a session destroyed on another thread is never touched again.
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include "capture/session.h"
#include "frames/frame_record.h"

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace sentinel {
namespace capture {

struct ScopeEntry {
  std::string name;                           // a named scope ("gate", RECORD_USER_SCOPE's name)
  const torch::nn::Module* module = nullptr;  // or a module scope
  // PyTorch's own machinery (FSDP's all-gathers, casts and reduce-scatters; an optimizer's step):
  // it makes none of the model's values, and nothing it makes non-finite is the model's to tolerate.
  bool machinery = false;
};

// Whether a RecordFunction user scope of this name is PyTorch's machinery (ScopeEntry::machinery).
bool is_machinery_scope(const char* name);

// The frame one session fills for the op (or autograd node) in flight.
struct OpenFrame {
  std::shared_ptr<SessionAnchor> owner;
  frames::FrameRecord frame;
};

struct ThreadState {
  // Sessions made on this thread, innermost last.
  std::vector<std::weak_ptr<SessionAnchor>> bound;
  // Explicit batches (batch(), forward()) open on this thread, outermost first: every one of them
  // watches the ops run while it is open.
  std::vector<std::shared_ptr<SessionAnchor>> batches;
  std::shared_ptr<SessionAnchor> auto_batch;  // TorchScript forward running on this thread
  int op_depth = 0;
  int torchscript_depth = 0;
  int backward_depth = 0;

  std::vector<ScopeEntry> scopes;
  uint64_t scopes_version = 0;  // bumped on every push/pop, to cache the scope's place

  // The frames of the outermost op in flight, one per session watching it; the vector keeps its
  // capacity (no allocation per op).
  std::deque<OpenFrame> open_frames;
  size_t open_frame_count = 0;
  int open_frame_depth = 1;  // the op depth they run at: 1, or one below a backward node's


  // Backward: a training step's backward usually runs after its forward's batch has ended
  // (debug.forward(x), then loss.backward()); it belongs to the session that ran the last batch
  // on this thread.
  std::weak_ptr<SessionAnchor> last_batch_session;
  // The autograd nodes in flight, innermost last ([0, backward_depth)): a node's own backward may
  // run a whole backward of its own (a reentrant checkpoint's CheckpointFunctionBackward calls
  // torch.autograd.backward on the block it recomputed). Kept for reuse: no allocation per node.
  struct BackwardNode {
    std::deque<OpenFrame> open;  // the node's frame, one per session watching it
    size_t count = 0;
    int op_depth = 0;    // op depth when the node started: its own ops are one deeper
    size_t scopes = 0;   // scopes open when it started
  };
  std::deque<BackwardNode> backward_nodes;
  BackwardNode* innermost_node() { return backward_depth > 0 ? &backward_nodes[backward_depth - 1] : nullptr; }
  // A module entered after the innermost node started runs its forward again inside the backward
  // (gradient checkpointing recomputes it): its ops make no gradients.
  bool recomputing_forward() const {
    if (backward_depth == 0) return false;
    for (size_t i = backward_nodes[backward_depth - 1].scopes; i < scopes.size(); ++i) {
      if (scopes[i].module != nullptr) return true;
    }
    return false;
  }
  // PyTorch's machinery inside the innermost node (FSDP2 reduce-scatters a module's gradients in
  // its post-backward node): its ops are frames of their own, as outside a backward, so that its
  // cast to reduce_dtype is told from the collective that brings another rank's values.
  bool machinery_in_node() const {
    if (backward_depth == 0) return false;
    for (size_t i = backward_nodes[backward_depth - 1].scopes; i < scopes.size(); ++i) {
      if (scopes[i].machinery) return true;
    }
    return false;
  }

  // The outermost op in flight, for a dump of its arguments should its frame trip. The arguments
  // are held from its start: RecordFunction's view of them does not outlive the start callback
  // of an unboxed call. Cleared at its end (the vector keeps its capacity: no allocation per op).
  struct EndingOp {
    const frames::FrameRecord* frame = nullptr;  // set while its end callback runs
    std::string op, overload;
    std::vector<c10::IValue> inputs;
    std::vector<uint32_t> written_versions;  // of the arguments it writes and does not return
    c10::ArrayRef<c10::IValue> outputs;
    bool in_place = false;
  } ending_op;

  // This thread's own RecordFunction callback (0: none): registered while a session here may
  // need it, so that threads no session watches pay nothing for the ops they run.
  uint64_t callback = 0;

  // The anchors whose batches watch an op starting now: every explicit batch, then the
  // TorchScript batch (each once).
  template <typename F>
  void for_each_active(F&& f) const {
    for (const auto& a : batches) f(a);
    if (auto_batch) {
      bool seen = false;
      for (const auto& a : batches) seen = seen || a == auto_batch;
      if (!seen) f(auto_batch);
    }
  }
  bool any_active() const { return !batches.empty() || auto_batch != nullptr; }
};

ThreadState& thread_state();
// True once this thread's state has been destroyed: at its exit, before thread_local objects made
// earlier (a watchdog the user keeps in one), and on the main thread before static objects.
// Whatever is destroyed after it must not touch it.
bool thread_state_destroyed();

// The session that last opened a batch anywhere in the process. A backward pass may run its nodes
// on a thread that never ran a batch (LibTorch's autograd runs CUDA nodes on a worker thread per
// device, with the callbacks of the thread that called backward()); such nodes belong to this session.
void note_batch_session(const std::weak_ptr<SessionAnchor>& session);
std::shared_ptr<SessionAnchor> last_batch_session_in_process();

// A session made on this thread: it opens TorchScript batches here and this thread's ops reach
// the callback from now on; unless `observe_ops` is false (Options::exact false), when only its
// batches that watch ops install it.
void bind_to_this_thread(const std::shared_ptr<SessionAnchor>& anchor, bool observe_ops = true);
// Forgets `anchor` on this thread (bound, batches, open frames) and removes this thread's
// callback when no session is left to need it. Call after anchor->close().
void unbind_from_this_thread(const SessionAnchor* anchor);
// Explicit batches: false when `anchor` already has one open on this thread (forward() inside
// batch(): one batch).
bool push_batch(const std::shared_ptr<SessionAnchor>& anchor);
// `step_done`: the batch held a whole training step, its gradients checked; the thread's callback
// may then come off until its next batch (the ops between steps make no frame).
void pop_batch(const SessionAnchor* anchor, bool step_done);
bool batch_open_here(const SessionAnchor* anchor);

}  // namespace capture
}  // namespace sentinel
