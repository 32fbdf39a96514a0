#pragma once
// What the capture layer calls into: one watched model. The capture layer owns the per-op
// protocol (which ops are outermost, which sessions watch them, the frame each fills between an
// op's start and end, what happens when one of them throws); a session fills and judges frames.
#include <atomic>
#include <memory>

#include "frames/frame_record.h"

namespace sentinel {
namespace capture {

class OpCall;
struct ThreadState;

class Session {
 public:
  virtual ~Session() = default;
  // TorchScript sessions open a batch at each top-level `forward` on their thread.
  virtual bool opens_batches_on_torchscript_forward() const = 0;
  virtual void begin_auto_batch() = 0;
  virtual void end_auto_batch() = 0;
  // Outermost FUNCTION-scope op: its inputs are only readable in the start callback. `frame` was
  // reset for this op; false: no frame for it (no batch open, a view, a stopped run).
  virtual bool op_start(const OpCall& op, frames::FrameRecord& frame, ThreadState& thread) = 0;
  virtual void op_end(const OpCall& op, frames::FrameRecord& frame, ThreadState& thread) = 0;
  // An autograd node (BACKWARD_FUNCTION): its incoming gradients are its inputs; the gradients it
  // produces are the outputs of the ops it runs (autograd gives the node's own outputs to no one).
  virtual bool backward_node_start(const OpCall& node, frames::FrameRecord& frame, ThreadState& thread) = 0;
  virtual void backward_op_end(const OpCall& op, frames::FrameRecord& frame, ThreadState& thread) = 0;
  virtual void backward_node_end(frames::FrameRecord& frame, ThreadState& thread) = 0;
  // A start or end above threw `what` (LibTorch would swallow it and drop the frame). The frame
  // is marked with it; `keep`: the frame is still open (its end will come), else it is finished
  // here with what it holds. Must not throw.
  virtual void frame_failed(frames::FrameRecord& frame, const char* what, bool keep) noexcept = 0;
  // A batch's start or end threw `what` inside a callback: said, not thrown. Must not throw.
  virtual void callback_failed(const char* what) noexcept = 0;
};

// A session as other threads see it. Threads keep strong references to the anchor, never to the
// session: a callback enters the anchor for as long as it uses the session, and the session's
// owner closes the anchor before destroying it, which waits for the callbacks already inside.
class SessionAnchor {
 public:
  explicit SessionAnchor(Session* session) : session_(session) {}
  SessionAnchor(const SessionAnchor&) = delete;
  SessionAnchor& operator=(const SessionAnchor&) = delete;

  class Use {
   public:
    Use() = default;
    explicit Use(SessionAnchor* anchor);
    Use(Use&& other) noexcept : anchor_(other.anchor_), session_(other.session_) { other.anchor_ = nullptr; }
    Use& operator=(Use&&) = delete;
    ~Use();
    Session* get() const { return session_; }
    explicit operator bool() const { return session_ != nullptr; }

   private:
    SessionAnchor* anchor_ = nullptr;
    Session* session_ = nullptr;
  };

  // The session, kept alive until the Use is destroyed; empty once closed.
  Use enter() { return Use(this); }
  // No callback enters from now on; returns when those already inside (on other threads) are out.
  void close();
  bool closed() const { return session_.load() == nullptr; }

 private:
  friend class Use;
  std::atomic<Session*> session_;
  std::atomic<int> inside_{0};
};

}  // namespace capture
}  // namespace sentinel
