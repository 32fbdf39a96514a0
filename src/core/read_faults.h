#pragma once
// Tests: makes a tensor read throw, as a read that fails inside a RecordFunction callback would
// (a tensor kind no check foresaw, memory exhausted), to show that the capture layer catches it,
// keeps the frame and says what went wrong. Costs one relaxed atomic load per read otherwise.
#include <atomic>
#include <cstdint>
#include <stdexcept>

namespace sentinel {
namespace core {
namespace testing {

inline std::atomic<int64_t>& reads_until_failure() {
  static std::atomic<int64_t> n{0};
  return n;
}

// The `nth` tensor read from now on (1: the next one) throws std::runtime_error; 0 disarms.
inline void fail_read(int64_t nth) { reads_until_failure().store(nth, std::memory_order_relaxed); }

inline void maybe_fail_read() {
  auto& n = reads_until_failure();
  if (n.load(std::memory_order_relaxed) > 0 && n.fetch_sub(1) == 1) {
    throw std::runtime_error("injected read failure");
  }
}

}  // namespace testing
}  // namespace core
}  // namespace sentinel
