#include "overlap/side_reader.h"

#include <pthread.h>

#include <exception>
#include <new>
#include <set>
#include <system_error>

namespace sentinel {
namespace overlap {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
// Below this a read takes a few microseconds, as long as waking the other thread.
constexpr int64_t kMinBytes = int64_t{256} << 10;
}  // namespace

// The process's readers, locked around fork(): a child copies only the forking thread, so a
// reader's mutex held by its own thread, or a read it had started, would otherwise never be
// released or finished there.
struct ForkGuard {
  static std::mutex& registry_mutex() {
    static std::mutex* m = new std::mutex;  // never destroyed: fork() may come during exit
    return *m;
  }
  static std::set<SideReader*>& readers() {
    static auto* r = new std::set<SideReader*>;
    return *r;
  }
  static void prepare() {
    registry_mutex().lock();
    for (SideReader* r : readers()) r->mutex_.lock();
  }
  static void in_parent() {
    for (SideReader* r : readers()) r->mutex_.unlock();
    registry_mutex().unlock();
  }
  static void in_child() {
    for (SideReader* r : readers()) {
      r->after_fork_in_child();
      r->mutex_.unlock();
    }
    registry_mutex().unlock();
  }
  // Whether the handlers are registered: if not (no memory), a child could wait for a thread it
  // does not have, so the reader never starts one.
  static bool add(SideReader* r) {
    static const bool registered = pthread_atfork(&prepare, &in_parent, &in_child) == 0;
    std::lock_guard<std::mutex> lock(registry_mutex());
    readers().insert(r);
    return registered;
  }
  static void remove(SideReader* r) {
    std::lock_guard<std::mutex> lock(registry_mutex());
    readers().erase(r);
  }
};

SideReader::SideReader() { no_thread_ = !ForkGuard::add(this); }

SideReader::~SideReader() {
  ForkGuard::remove(this);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_ && thread_->joinable()) thread_->join();
}

void SideReader::after_fork_in_child() {
  (void)thread_.release();  // the handle of a thread the child does not have: dropped, not joined
  // The condition variable still counts that thread as its waiter: signalling it would wait for
  // the waiter to wake, and destroying it would wait for the waiter to leave, both forever. A new
  // one is made in its place; the old one is not destroyed, as that is what would wait.
  new (&work_cv_) std::condition_variable;
  no_thread_ = true;        // the ops' threads read everything from now on
  for (int i = 0; i < next_; ++i) {
    if (reads_[i].done) continue;
    reads_[i].failed = true;  // started by the thread the child does not have
    reads_[i].done = true;
  }
  finished_.store(next_, std::memory_order_relaxed);
}

void SideReader::post(const void* owner, const at::Tensor& t, uint32_t version, int entry) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Read& r = reads_[count_++];
    r.tensor = t;
    r.version = version;
    r.entry = entry;
    r.done = false;
    owner_ = owner;
    if (!thread_ && !no_thread_) {
      try {
        thread_ = std::make_unique<std::thread>([this] { thread_main(); });
      } catch (const std::system_error&) {
        no_thread_ = true;  // the process's thread limit: reads stay on the op's thread, as before
      }
    }
  }
}

void SideReader::start(const void* owner) {
  if (has_reads_for(owner)) work_cv_.notify_one();
}

void SideReader::run_one(std::unique_lock<std::mutex>& lock) {
  Read& r = reads_[next_++];
  lock.unlock();
  try {
    r.readability = stats::compute(r.tensor, r.stats);
    r.failed = false;
  } catch (const std::exception&) {
    r.failed = true;  // read again on the op's thread at collect, which handles it as it always has
  }
  lock.lock();
  r.done = true;
  finished_.fetch_add(1, std::memory_order_release);
}

void SideReader::wait_for_started(std::unique_lock<std::mutex>& lock) {
  if (finished_.load(std::memory_order_acquire) == count_) return;
  // Polled, not slept on: the read in progress ends within microseconds, and a sleep and wake-up
  // through the kernel would cost more than that on every op that waits.
  lock.unlock();
  for (int spins = 0; finished_.load(std::memory_order_acquire) != count_; ++spins) {
    if (spins < 4096) {
      cpu_relax();
    } else {
      std::this_thread::yield();  // the other thread was descheduled mid-read: let it run
    }
  }
  lock.lock();
}

void SideReader::thread_main() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || next_ < count_; });
    if (stop_) return;
    run_one(lock);
  }
}

bool worth_reading_beside(const at::Tensor& t) {
  if (!t.defined() || stats::compute_readability(t) != stats::Readability::Read) return false;
  const auto dtype = t.scalar_type();
  if (dtype != c10::kFloat && dtype != c10::kDouble && dtype != c10::kHalf && dtype != c10::kBFloat16) return false;
  return t.numel() * static_cast<int64_t>(t.element_size()) >= kMinBytes;
}

}  // namespace overlap
}  // namespace sentinel
