// The RecordFunction callback, and the only translation unit that reads RecordFunction itself.
// LibTorch is built with NDEBUG, and RecordFunction has a member only without it: this file sees
// the header as LibTorch was built (first include, before anything can include it otherwise),
// and every other file reads an event through capture::OpCall.
#ifndef NDEBUG
#define NDEBUG
#define SENTINEL_RESTORE_ASSERTS
#endif
#include <ATen/record_function.h>
#ifdef SENTINEL_RESTORE_ASSERTS
#undef NDEBUG
#undef SENTINEL_RESTORE_ASSERTS
#endif

#include <ATen/core/function_schema.h>
#include <ATen/core/operator_name.h>

#include <cstring>
#include <mutex>
#include <utility>

#include "capture/compiler_tracing.h"
#include "capture/guarded_hooks.h"
#include "capture/loop_window.h"
#include "capture/op_call.h"
#include "capture/op_name_list.h"
#include "capture/thread_state.h"
#include "torchscript/fusion_guard.h"

namespace sentinel {
namespace capture {

// ---- OpCall, NotRecorded ----------------------------------------------------------------------

OpCall::OpCall(const at::RecordFunction& fn, bool at_end) : fn_(fn), name_(fn.name()), seq_nr_(fn.seqNr()) {
  // A fused group's event was started without inputs (LibTorch asserts on reading them).
  if (torchscript::is_fusion_group_name(name_) && !fn.operator_name()) return;
  if (at_end) {
    const auto& out = fn.outputs();
    outputs_ = c10::ArrayRef<c10::IValue>(out.data(), out.size());
  } else {
    const auto in = fn.inputs();
    inputs_ = c10::ArrayRef<c10::IValue>(in.data(), in.size());
  }
}

const char* OpCall::overload_name() const { return fn_.overload_name(); }
c10::optional<c10::FunctionSchema> OpCall::schema() const { return fn_.operator_schema(); }

// ---- LibTorch's thread state at a thread's exit ------------------------------------------------

namespace {
// A watchdog kept in a thread_local object made before LibTorch's RecordFunction state of that
// thread is destroyed after it, at the thread's exit: from then on nothing may touch that state
// (it is freed memory). A marker made right after the state is touched is destroyed before it
// (thread_locals go in reverse order of construction) and says so. Trivially destructible:
// readable until the thread's very end.
thread_local bool libtorch_state_gone = false;
struct LibTorchStateMarker {
  ~LibTorchStateMarker() { libtorch_state_gone = true; }
};
// Called right after LibTorch's RecordFunction state was touched (so exists) on this thread.
void mark_libtorch_state_made() {
  static thread_local LibTorchStateMarker marker;
  (void)marker;
}
}  // namespace

NotRecorded::NotRecorded() {
  if (libtorch_state_gone) return;  // the thread is ending: no op is recorded any more
  was_enabled_ = at::isRecordFunctionEnabled();
  mark_libtorch_state_made();
  at::enableRecordFunction(false);
  touched_ = true;
}
NotRecorded::~NotRecorded() {
  if (touched_ && !libtorch_state_gone) at::enableRecordFunction(was_enabled_);
}

bool callbacks_installed() { return at::hasCallbacks(); }

// ---- The per-op protocol ----------------------------------------------------------------------

namespace {

// A deque: slots never move, so a frame handed to the second thread stays where it was.
OpenFrame& next_slot(std::deque<OpenFrame>& slots, size_t count) {
  if (slots.size() <= count) slots.emplace_back();
  return slots[count];
}

// Opens `anchor`'s frame for an op (Session::op_start) or an autograd node
// (Session::backward_node_start) in the next of `slots`, counted in `count` once open.
using StartHook = bool (Session::*)(const OpCall&, frames::FrameRecord&, ThreadState&);
void open_frame(ThreadState& ts, std::deque<OpenFrame>& slots, size_t& count, StartHook start,
                const std::shared_ptr<SessionAnchor>& anchor, const OpCall& call) {
  OpenFrame& slot = next_slot(slots, count);
  auto use = anchor->enter();
  if (!use) return;
  slot.frame.reset();
  bool opened = false;
  try {
    opened = (use.get()->*start)(call, slot.frame, ts);
  } catch (...) {
    // A start that failed after naming the op keeps its frame: the end reads the outputs.
    opened = slot.frame.op != 0;
    report_failure(*use.get(), opened ? &slot.frame : nullptr, true);
  }
  if (!opened) return;
  slot.owner = anchor;
  ++count;
}

void open_op(ThreadState& ts, const std::shared_ptr<SessionAnchor>& anchor, const OpCall& call) {
  open_frame(ts, ts.open_frames, ts.open_frame_count, &Session::op_start, anchor, call);
}

void open_backward_node(ThreadState& ts, const std::shared_ptr<SessionAnchor>& anchor, const OpCall& call) {
  ThreadState::BackwardNode& node = *ts.innermost_node();
  open_frame(ts, node.open, node.count, &Session::backward_node_start, anchor, call);
}

// The sessions an autograd node (or a forward recomputed inside one) belongs to: the batches open
// on this thread, else the session that ran the last batch here, else anywhere (LibTorch's
// autograd runs CUDA nodes on a worker thread per device that never ran a batch itself).
template <typename F>
void for_each_backward_session(ThreadState& ts, F&& f) {
  if (ts.any_active()) {
    ts.for_each_active(f);
    return;
  }
  auto last = ts.last_batch_session.lock();
  if (!last && ts.bound.empty()) last = last_batch_session_in_process();
  if (last) f(last);
}

// An event that is not an op (no schema, no namespace in its name) but a marker around ops: a
// Python (or C++) autograd Function's apply, named after its class and carrying autograd's
// sequence number (gradient checkpointing's CheckpointFunction runs a whole block in one), or
// torch.compile's markers around a compiled call, inside which the extern kernels of the graph
// run as ATen ops. It is passed through, so that the ops inside are watched as any other. (Every
// ATen op's name has a namespace; a fused TorchScript group, "fused_gelu_mul", is an op of its
// own.)
bool marker_around_ops(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (has_namespace(name) || fn.operator_name()) return false;
  if (fn.seqNr() >= 0) return true;
  static constexpr const char* kCompiledCallMarkers[] = {"Torch-Compiled Region", "TorchDynamo Cache Lookup",
                                                         "Pregraph bytecode", "AOTDispatcher", "CompiledFunction",
                                                         "## Call CompiledFxGraph"};
  for (const char* marker : kCompiledCallMarkers) {
    if (std::strncmp(name, marker, std::strlen(marker)) == 0) return true;
  }
  return false;
}

// Hands the first `count` frames of `slots` to their sessions' `end(session, frame)`, releasing
// each slot's owner: the end of an op, or of an autograd node.
template <typename EndHook>
void close_frames(std::deque<OpenFrame>& slots, size_t count, EndHook&& end) {
  for (size_t i = 0; i < count; ++i) {
    OpenFrame& slot = slots[i];
    const auto owner = std::move(slot.owner);
    auto use = owner->enter();
    if (!use) continue;
    guarded(*use.get(), &slot.frame, false, [&] { end(*use.get(), slot.frame); });
  }
}

std::shared_ptr<SessionAnchor> bound_torchscript_session(ThreadState& ts) {
  for (auto it = ts.bound.rbegin(); it != ts.bound.rend(); ++it) {
    auto anchor = it->lock();
    if (!anchor) continue;
    auto use = anchor->enter();
    if (use && use.get()->opens_batches_on_torchscript_forward()) return anchor;
  }
  return nullptr;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadState& ts = thread_state();
  switch (fn.scope()) {
    case at::RecordScope::FUNCTION:
      if (marker_around_ops(fn)) break;
      // Nested ops (the mm inside a linear, the empty inside a dropout) are ignored. Inside a
      // backward, only a forward recomputed there (gradient checkpointing) and PyTorch's machinery
      // make op frames: ops the innermost node runs itself (the engine's evaluate_function event
      // is one level up).
      if (ts.op_depth++ == 0 && ts.backward_depth == 0) {
        if (ts.any_active() && !compiler_tracing()) {
          const OpCall call(fn, /*at_end=*/false);
          ts.open_frame_count = 0;
          ts.open_frame_depth = 1;
          ts.for_each_active([&](const std::shared_ptr<SessionAnchor>& a) { open_op(ts, a, call); });
        }
      } else if (ts.backward_depth > 0 && ts.op_depth == ts.innermost_node()->op_depth + 1 &&
                 (ts.recomputing_forward() || ts.machinery_in_node())) {
        const OpCall call(fn, /*at_end=*/false);
        ts.open_frame_count = 0;
        ts.open_frame_depth = ts.op_depth;
        for_each_backward_session(ts, [&](const std::shared_ptr<SessionAnchor>& a) { open_op(ts, a, call); });
      }
      break;
    case at::RecordScope::BACKWARD_FUNCTION: {
      if (ts.backward_nodes.size() <= static_cast<size_t>(ts.backward_depth)) ts.backward_nodes.emplace_back();
      ++ts.backward_depth;
      ThreadState::BackwardNode& node = *ts.innermost_node();
      node.count = 0;
      node.op_depth = ts.op_depth;
      node.scopes = ts.scopes.size();
      if (compiler_tracing()) break;  // AOTAutograd tracing the backward: a node with no frame
      const OpCall call(fn, /*at_end=*/false);
      for_each_backward_session(ts, [&](const std::shared_ptr<SessionAnchor>& a) { open_backward_node(ts, a, call); });
      break;
    }
    case at::RecordScope::TORCHSCRIPT_FUNCTION:
      // Only a top-level `forward` is a batch (TorchScript also runs helpers such as `defaults`).
      if (ts.torchscript_depth++ == 0 && !ts.any_active() && std::strcmp(fn.name(), "forward") == 0) {
        if (auto anchor = bound_torchscript_session(ts)) {
          auto use = anchor->enter();
          if (use) {
            ts.auto_batch = anchor;
            ts.last_batch_session = anchor;
            note_batch_session(anchor);
            guarded(*use.get(), nullptr, false, [&] { use.get()->begin_auto_batch(); });
          }
        }
      }
      break;
    case at::RecordScope::USER_SCOPE:
      ts.scopes.push_back(ScopeEntry{fn.name(), nullptr, is_machinery_scope(fn.name())});
      ++ts.scopes_version;
      break;
    default:
      break;
  }
  return nullptr;
}

// Gives a depth back when the end callback returns, whatever its hooks did.
struct DepthRelease {
  int& depth;
  ~DepthRelease() { --depth; }
};

void remove_callback_if_unneeded(ThreadState& ts);

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  ThreadState& ts = thread_state();
  switch (fn.scope()) {
    case at::RecordScope::FUNCTION: {
      if (marker_around_ops(fn)) break;
      // The depth is given back after the hooks: an op a hook runs itself is a nested op, which
      // no hook sees, so the hooks need no RecordFunction guard (whose every use copies
      // LibTorch's thread-local callback lists).
      const DepthRelease release{ts.op_depth};
      if (ts.open_frame_count > 0 && ts.op_depth == ts.open_frame_depth) {
        const OpCall call(fn, /*at_end=*/true);
        close_frames(ts.open_frames, std::exchange(ts.open_frame_count, 0),
                     [&](Session& s, frames::FrameRecord& f) { s.op_end(call, f, ts); });
        ts.ending_op.inputs.clear();  // the arguments' tensors are not kept alive past their op
      } else if (ThreadState::BackwardNode* node = ts.innermost_node();
                 node != nullptr && node->count > 0 && ts.op_depth == node->op_depth + 1 && !ts.recomputing_forward() &&
                 !compiler_tracing()) {  // (a compiled backward compiles its graph inside its node's first run)
        const OpCall call(fn, /*at_end=*/true);
        for (size_t i = 0; i < node->count; ++i) {
          OpenFrame& slot = node->open[i];
          auto use = slot.owner->enter();
          if (!use) continue;
          guarded(*use.get(), &slot.frame, true, [&] { use.get()->backward_op_end(call, slot.frame, ts); });
        }
      } else if (ts.op_depth == 1 && ts.callback != 0 && !ts.any_active()) {
        remove_callback_if_unneeded(ts);
      }
      break;
    }
    case at::RecordScope::BACKWARD_FUNCTION: {
      if (ts.backward_depth == 0) break;  // (started before this thread's callback was added)
      const DepthRelease release{ts.backward_depth};
      ThreadState::BackwardNode& node = *ts.innermost_node();
      if (node.count > 0) {
        close_frames(node.open, std::exchange(node.count, 0),
                     [&](Session& s, frames::FrameRecord& f) { s.backward_node_end(f, ts); });
      }
      break;
    }
    case at::RecordScope::TORCHSCRIPT_FUNCTION:
      if (--ts.torchscript_depth == 0 && ts.auto_batch != nullptr) {
        const auto anchor = std::move(ts.auto_batch);
        ts.auto_batch = nullptr;
        auto use = anchor->enter();
        if (use) guarded(*use.get(), nullptr, false, [&] { use.get()->end_auto_batch(); });
      }
      break;
    case at::RecordScope::USER_SCOPE:
      if (!ts.scopes.empty()) ts.scopes.pop_back();
      ++ts.scopes_version;
      break;
    default:
      break;
  }
}

// ---- This thread's callback -------------------------------------------------------------------

bool live(const std::weak_ptr<SessionAnchor>& w) {
  auto a = w.lock();
  return a && !a->closed();
}

bool needs_callback(const ThreadState& ts) {
  if (ts.any_active() || ts.open_frame_count > 0 || ts.backward_depth > 0) return true;
  if (live(ts.last_batch_session)) return true;
  for (const auto& w : ts.bound) {
    if (live(w)) return true;
  }
  return false;
}

// Forgets this thread's callback when LibTorch no longer holds it: one added while the autograd
// engine ran a callback of its own (a replay inside the backward's final callback) is dropped when
// the backward returns, the engine putting back the thread-local state it found.
void forget_dropped_callback(ThreadState& ts) {
  if (ts.callback == 0 || libtorch_state_gone) return;
  for (const auto& entry : at::get_record_function_tls_().sorted_tls_callbacks_) {
    if (entry.handle_ == ts.callback) return;
  }
  ts.callback = 0;
}

void add_callback(ThreadState& ts) {
  forget_dropped_callback(ts);
  if (ts.callback != 0 || libtorch_state_gone) return;
  ts.callback = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::TORCHSCRIPT_FUNCTION, at::RecordScope::USER_SCOPE}));
  mark_libtorch_state_made();
}

// A session destroyed on another thread cannot remove this thread's callback: the thread does it
// itself, at an outermost op outside any batch, once every session it knew is gone. (The event
// now ending keeps its own copy of the callbacks it runs.)
void remove_callback_if_unneeded(ThreadState& ts) {
  static thread_local uint32_t ops_since_check = 0;
  if (++ops_since_check < 64) return;
  ops_since_check = 0;
  if (needs_callback(ts)) return;
  at::removeCallback(ts.callback);
  ts.callback = 0;
}

}  // namespace

void bind_to_this_thread(const std::shared_ptr<SessionAnchor>& anchor, bool observe_ops) {
  ThreadState& ts = thread_state();
  ts.bound.push_back(anchor);
  if (observe_ops) add_callback(ts);
}

void unbind_from_this_thread(const SessionAnchor* anchor) {
  if (thread_state_destroyed()) return;
  ThreadState& ts = thread_state();
  for (auto it = ts.bound.begin(); it != ts.bound.end();) {
    auto a = it->lock();
    it = (!a || a.get() == anchor) ? ts.bound.erase(it) : it + 1;
  }
  for (auto it = ts.batches.begin(); it != ts.batches.end();) it = it->get() == anchor ? ts.batches.erase(it) : it + 1;
  if (ts.auto_batch.get() == anchor) ts.auto_batch = nullptr;
  ts.ending_op.inputs.clear();
  // At the thread's exit LibTorch's state may be gone, and its callbacks with it.
  if (ts.callback != 0 && !libtorch_state_gone && !needs_callback(ts)) {
    at::removeCallback(ts.callback);
    ts.callback = 0;
  }
}

bool push_batch(const std::shared_ptr<SessionAnchor>& anchor) {
  ThreadState& ts = thread_state();
  if (batch_open_here(anchor.get())) return false;
  ts.batches.push_back(anchor);
  ts.last_batch_session = anchor;
  note_batch_session(anchor);
  add_callback(ts);
  return true;
}

namespace {

// After a batch that held a whole training step (its backward and the gradients' check), nothing
// this thread runs before its next batch makes a frame: the optimizer's ops, the data loader's.
// The callback comes off until push_batch puts it back, so that those ops pay LibTorch nothing
// for it: every event boxes its op's arguments and results for the callback, about a microsecond
// an op, and LibTorch's optimizers run thousands of ops a step, one parameter at a time. It stays
// where anything else may need it: a batch or TorchScript forward open here, an op or autograd
// node in flight, a named scope open (its end would be missed), a session that opens batches on
// TorchScript forwards.
void park_callback_between_steps(ThreadState& ts) {
  if (ts.callback == 0 || libtorch_state_gone) return;
  if (ts.any_active() || ts.op_depth != 0 || ts.backward_depth != 0 || ts.torchscript_depth != 0 ||
      ts.open_frame_count != 0 || !ts.scopes.empty()) {
    return;
  }
  for (const auto& w : ts.bound) {
    auto anchor = w.lock();
    if (!anchor) continue;
    auto use = anchor->enter();
    if (use && use.get()->opens_batches_on_torchscript_forward()) return;
  }
  at::removeCallback(ts.callback);
  ts.callback = 0;
}

// The window's global callback: a thread whose own callback is installed is watched by that one
// (both would count its ops twice).
std::unique_ptr<at::ObserverContext> on_start_in_window(const at::RecordFunction& fn) {
  return thread_state().callback != 0 ? nullptr : on_start(fn);
}

void on_end_in_window(const at::RecordFunction& fn, at::ObserverContext* context) {
  if (thread_state().callback == 0) on_end(fn, context);
}

std::mutex window_mutex;
at::CallbackHandle window_callback = 0;
int windows_open = 0;
// The thread's scopes when its window opened: one the window saw begin but will not see end (the
// optimizer's step scope, inside which the window closes) is not left open for later batches.
thread_local size_t scopes_when_window_opened = 0;

}  // namespace

bool open_loop_window(const std::shared_ptr<SessionAnchor>& anchor) {
  ThreadState& ts = thread_state();
  if (batch_open_here(anchor.get())) return false;
  ts.batches.push_back(anchor);
  forget_dropped_callback(ts);  // (else the window takes the thread's ops for its callback's)
  scopes_when_window_opened = ts.scopes.size();
  std::lock_guard<std::mutex> lock(window_mutex);
  if (windows_open++ == 0 && !libtorch_state_gone) {
    window_callback = at::addGlobalCallback(at::RecordFunctionCallback(on_start_in_window, on_end_in_window)
                                                .needsInputs(true)
                                                .needsOutputs(true)
                                                .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                                         at::RecordScope::USER_SCOPE}));
    mark_libtorch_state_made();
  }
  return true;
}

namespace {

// Takes `anchor`'s batch (the innermost) off the thread's list; whether it was there.
bool erase_batch(ThreadState& ts, const SessionAnchor* anchor) {
  for (auto it = ts.batches.rbegin(); it != ts.batches.rend(); ++it) {
    if (it->get() == anchor) {
      ts.batches.erase(std::next(it).base());
      return true;
    }
  }
  return false;
}

}  // namespace

void close_loop_window(const SessionAnchor* anchor) {
  if (thread_state_destroyed()) return;
  ThreadState& ts = thread_state();
  erase_batch(ts, anchor);
  if (ts.callback == 0 && ts.scopes.size() > scopes_when_window_opened) {
    ts.scopes.resize(scopes_when_window_opened);
    ++ts.scopes_version;
  }
  std::lock_guard<std::mutex> lock(window_mutex);
  if (windows_open > 0 && --windows_open == 0 && window_callback != 0) {
    if (!libtorch_state_gone) at::removeCallback(window_callback);
    window_callback = 0;
  }
}

void pop_batch(const SessionAnchor* anchor, bool step_done) {
  if (thread_state_destroyed()) return;
  ThreadState& ts = thread_state();
  if (erase_batch(ts, anchor) && step_done) park_callback_between_steps(ts);
}

bool batch_open_here(const SessionAnchor* anchor) {
  for (const auto& a : thread_state().batches) {
    if (a.get() == anchor) return true;
  }
  return false;
}

}  // namespace capture
}  // namespace sentinel
