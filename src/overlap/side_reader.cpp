#include "overlap/side_reader.h"

#include <exception>
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

SideReader::~SideReader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SideReader::post(const void* owner, const at::Tensor& t, uint32_t version, int entry) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Read& r = reads_[count_++];
    r.tensor = t;
    r.version = version;
    r.entry = entry;
    owner_ = owner;
    if (!thread_.joinable() && !no_thread_) {
      try {
        thread_ = std::thread([this] { thread_main(); });
      } catch (const std::system_error&) {
        no_thread_ = true;  // the process's thread limit: reads stay on the op's thread, as before
      }
    }
  }
  work_cv_.notify_one();
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
  static const bool second_core = std::thread::hardware_concurrency() >= 2;
  if (!second_core || !t.defined() || stats::compute_readability(t) != stats::Readability::Read) return false;
  const auto dtype = t.scalar_type();
  if (dtype != c10::kFloat && dtype != c10::kDouble && dtype != c10::kHalf && dtype != c10::kBFloat16) return false;
  return t.numel() * static_cast<int64_t>(t.element_size()) >= kMinBytes;
}

}  // namespace overlap
}  // namespace sentinel
