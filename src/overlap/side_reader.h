#pragma once
// Reads the statistics of an op's inputs on a second thread while the op itself runs.
//
// With one BLAS thread and ATen's one intra-op thread, the second core idles while a GEMM runs;
// the weights that GEMM takes (and the views of packed projections that attention takes) can be
// read there instead of before the op on its own thread. The reads are exact because they overlap
// only the op that takes those tensors, and only ops known to write nothing but their results
// (src/overlap/pure_ops.h): nothing writes the memory while it is read. The op's end waits for
// every read before its frame is finished, so detection, the frame and its call stacks are those
// of a read made on the op's own thread.
#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include <sentinel/stats.h>

#include "stats/tensor_stats.h"

namespace sentinel {
namespace overlap {

class SideReader {
 public:
  static constexpr int kMaxReads = 16;  // per op: a frame keeps at most 12 inputs

  struct Read {
    at::Tensor tensor;   // held until collected
    uint32_t version = 0;  // the tensor's version when the read was posted
    int entry = -1;        // the caller's index for it
    TensorStats stats;
    stats::Readability readability = stats::Readability::Undefined;
    bool failed = false;  // the read threw (no memory for its walk): the caller reads it itself
    bool done = false;    // finished (under the lock)
  };

  // Registered for fork(): the process's readers are locked across it, and in a child, where the
  // thread no longer exists, each reader is left to the ops' own threads (after_fork_in_child).
  SideReader();
  SideReader(const SideReader&) = delete;
  SideReader& operator=(const SideReader&) = delete;
  ~SideReader();

  // Whether a read for `owner` can be posted now: there is room, and no other owner (another
  // thread's op) has reads in flight.
  bool can_post(const void* owner) const { return (owner_ == nullptr || owner_ == owner) && count_ < kMaxReads; }
  // Queues a read of `t` for `owner`, remembered as `entry`. The thread starts at the first post.
  void post(const void* owner, const at::Tensor& t, uint32_t version, int entry);
  // Wakes the thread for what `owner` has queued: once per op, as waking a sleeping core costs
  // microseconds of the op's own thread.
  void start(const void* owner);
  bool has_reads_for(const void* owner) const { return owner_ == owner && count_ > 0; }
  // Waits for every read of `owner` (reading on this thread whatever the other has not started),
  // hands each to `done(const Read&)` in posting order, and releases the tensors.
  template <typename Done>
  void collect(const void* owner, Done&& done) {
    if (!has_reads_for(owner)) return;
    std::unique_lock<std::mutex> lock(mutex_);
    while (next_ < count_) run_one(lock);
    wait_for_started(lock);
    for (int i = 0; i < count_; ++i) {
      done(static_cast<const Read&>(reads_[i]));
      reads_[i].tensor.reset();
    }
    count_ = next_ = finished_ = 0;
    owner_ = nullptr;
  }
 private:
  friend struct ForkGuard;
  void thread_main();
  // In a forked child (this reader's mutex held): the thread is gone, so nothing may wait for it
  // or join it. Reads it had started are marked failed, which makes the collector read them again.
  void after_fork_in_child();
  // Takes the next unstarted read and runs it without the lock.
  void run_one(std::unique_lock<std::mutex>& lock);
  // Waits for the reads the other thread has started (at most one read's time).
  void wait_for_started(std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::array<Read, kMaxReads> reads_;  // fixed: a read in progress is never moved
  int count_ = 0, next_ = 0;
  std::atomic<int> finished_{0};  // polled without the lock while the last read ends
  const void* owner_ = nullptr;
  bool stop_ = false;
  bool no_thread_ = false;  // none could be started, or fork() could not be guarded: the op's thread reads all
  // A pointer, so that a forked child can drop the handle of a thread that does not exist there:
  // destroying or joining it would end or hang the child.
  std::unique_ptr<std::thread> thread_;
};

// Whether the statistics of `t` are worth a read on the second thread: a floating tensor on the
// CPU, large enough that the hand-over costs less than the read. (Whether a core is idle to read
// it is the caller's to know: spare_core.h.)
bool worth_reading_beside(const at::Tensor& t);

}  // namespace overlap
}  // namespace sentinel
