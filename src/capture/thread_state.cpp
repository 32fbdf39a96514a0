// Per-thread capture state and the anchors sessions are reached through (thread_state.h,
// session.h): nothing here reads RecordFunction.
#include "capture/thread_state.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

namespace sentinel {
namespace capture {

// ---- SessionAnchor ----------------------------------------------------------------------------

namespace {
// Anchors this thread is inside of, so that closing one from inside its own callback (a report
// callback that destroys the watchdog) does not wait for itself. Trivially destructible: readable
// until the thread's very end.
constexpr int kMaxNested = 32;
thread_local const SessionAnchor* entered_here[kMaxNested];
thread_local int entered_count = 0;
}  // namespace

SessionAnchor::Use::Use(SessionAnchor* anchor) {
  anchor->inside_.fetch_add(1);
  Session* s = anchor->session_.load();
  if (s == nullptr) {
    anchor->inside_.fetch_sub(1);
    return;
  }
  anchor_ = anchor;
  session_ = s;
  if (entered_count < kMaxNested) entered_here[entered_count] = anchor;
  ++entered_count;
}

SessionAnchor::Use::~Use() {
  if (anchor_ == nullptr) return;
  --entered_count;
  anchor_->inside_.fetch_sub(1);
}

void SessionAnchor::close() {
  session_.store(nullptr);
  int own = 0;
  for (int i = 0; i < std::min(entered_count, kMaxNested); ++i) own += entered_here[i] == this;
  // Callbacks on other threads finish what they started; they never wait for this thread.
  while (inside_.load() > own) std::this_thread::yield();
}

// ---- Thread state -----------------------------------------------------------------------------

namespace {
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
std::weak_ptr<SessionAnchor> last_session;
}  // namespace

void note_batch_session(const std::weak_ptr<SessionAnchor>& session) {
  std::lock_guard<std::mutex> lock(last_session_mutex);
  last_session = session;
}

std::shared_ptr<SessionAnchor> last_batch_session_in_process() {
  std::lock_guard<std::mutex> lock(last_session_mutex);
  return last_session.lock();
}

bool is_machinery_scope(const char* name) {
  // FSDP2 (fully_shard) names each step of its work "FSDP::…": pre_forward, all_gather,
  // post_backward_reduce, root_post_backward_callback. torch.optim names a step
  // "Optimizer.step#AdamW.step": the optimizer's own ops, and whatever a closure it calls runs
  // outside the model's modules (Lightning's training step, its backward and its clipping), are
  // the training loop's, judged as they are outside any scope.
  return std::strncmp(name, "FSDP::", 6) == 0 || std::strncmp(name, "Optimizer.step#", 15) == 0;
}

}  // namespace capture
}  // namespace sentinel
