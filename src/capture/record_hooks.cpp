// The one RecordFunction callback of the process, shared by every watchdog: it tracks op depth
// and scopes per thread and passes the outermost ops to the session active on that thread.
#include <ATen/record_function.h>

#include <cstring>
#include <mutex>
#include <utility>

#include "capture/thread_state.h"

namespace sentinel {
namespace capture {

namespace {
// Trivially destructible, so readable until the thread's very end: set once its state is gone.
thread_local bool state_destroyed = false;
struct StateOfThread {
  ThreadState state;
  ~StateOfThread() { state_destroyed = true; }
};
}  // namespace

ThreadState& thread_state() {
  static thread_local StateOfThread of_thread;
  return of_thread.state;
}

bool thread_state_destroyed() { return state_destroyed; }

namespace {
std::mutex last_session_mutex;
std::weak_ptr<Session> last_session;
}  // namespace

void note_batch_session(const std::weak_ptr<Session>& session) {
  std::lock_guard<std::mutex> lock(last_session_mutex);
  last_session = session;
}

std::shared_ptr<Session> last_batch_session_in_process() {
  std::lock_guard<std::mutex> lock(last_session_mutex);
  return last_session.lock();
}

namespace {

std::mutex registration_mutex;
int registration_count = 0;
at::CallbackHandle registration_handle = 0;

Session* bound_torchscript_session(ThreadState& ts) {
  for (auto it = ts.bound.rbegin(); it != ts.bound.rend(); ++it) {
    if (auto s = it->lock()) {
      if (s->opens_batches_on_torchscript_forward()) return s.get();
    }
  }
  return nullptr;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadState& ts = thread_state();
  switch (fn.scope()) {
    case at::RecordScope::FUNCTION:
      // Nested ops (the mm inside a linear, the empty inside a dropout) are ignored.
      if (ts.op_depth++ == 0 && ts.backward_depth == 0) {
        if (Session* s = ts.active()) s->op_start(fn, ts);
      }
      break;
    case at::RecordScope::BACKWARD_FUNCTION:
      if (ts.backward_depth++ == 0) {
        Session* s = ts.active();
        std::shared_ptr<Session> last;
        if (!s && (last = ts.last_batch_session.lock())) s = last.get();
        // A thread that never ran a batch itself: an autograd worker (CUDA nodes run on one).
        if (!s && ts.bound.empty() && (last = last_batch_session_in_process())) s = last.get();
        if (s) {
          ts.backward_node_op_depth = ts.op_depth;
          s->backward_node_start(fn, ts);
        }
      }
      break;
    case at::RecordScope::TORCHSCRIPT_FUNCTION:
      // Only a top-level `forward` is a batch (TorchScript also runs helpers such as `defaults`).
      if (ts.torchscript_depth++ == 0 && ts.active() == nullptr && std::strcmp(fn.name(), "forward") == 0) {
        if (Session* s = bound_torchscript_session(ts)) {
          ts.auto_batch = s;
          s->begin_auto_batch();
        }
      }
      break;
    case at::RecordScope::USER_SCOPE:
      ts.scopes.push_back(ScopeEntry{fn.name(), nullptr});
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

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  ThreadState& ts = thread_state();
  switch (fn.scope()) {
    case at::RecordScope::FUNCTION: {
      // The depth is given back after the hooks: an op a hook runs itself is a nested op, which
      // no hook sees, so the hooks need no RecordFunction guard (whose every use copies
      // LibTorch's thread-local callback lists).
      const DepthRelease release{ts.op_depth};
      if (ts.op_depth == 1 && ts.open_frame_owner != nullptr) {
        std::exchange(ts.open_frame_owner, nullptr)->op_end(fn, ts);
      } else if (ts.open_backward_owner != nullptr && ts.op_depth == ts.backward_node_op_depth + 1) {
        ts.open_backward_owner->backward_op_end(fn, ts);
      }
      break;
    }
    case at::RecordScope::BACKWARD_FUNCTION: {
      const DepthRelease release{ts.backward_depth};
      if (ts.backward_depth == 1 && ts.open_backward_owner != nullptr) {
        std::exchange(ts.open_backward_owner, nullptr)->backward_node_end(ts);
      }
      break;
    }
    case at::RecordScope::TORCHSCRIPT_FUNCTION:
      if (--ts.torchscript_depth == 0 && ts.auto_batch != nullptr) {
        Session* s = ts.auto_batch;
        ts.auto_batch = nullptr;
        s->end_auto_batch();
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

}  // namespace

void acquire_callback() {
  std::lock_guard<std::mutex> lock(registration_mutex);
  if (registration_count++ == 0) {
    registration_handle = at::addGlobalCallback(
        at::RecordFunctionCallback(on_start, on_end)
            .needsInputs(true)
            .needsOutputs(true)
            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                     at::RecordScope::TORCHSCRIPT_FUNCTION, at::RecordScope::USER_SCOPE}));
  }
}

void release_callback() {
  std::lock_guard<std::mutex> lock(registration_mutex);
  if (--registration_count == 0) {
    at::removeCallback(registration_handle);
    registration_handle = 0;
  }
}

}  // namespace capture
}  // namespace sentinel
