#pragma once
// The last N frames, in a buffer allocated once: its bound holds always (after dumps and traces
// too), unlike HF's deque that turns into an unbounded list after the first dump.
#include <cstddef>
#include <vector>

#include "core/frame_record.h"

namespace sentinel {
namespace core {

class FrameRing {
 public:
  explicit FrameRing(size_t capacity) : slots_(capacity) {}
  void push(const FrameRecord& f) {
    slots_[head_].assign(f);
    head_ = (head_ + 1) % slots_.size();
    if (size_ < slots_.size()) ++size_;
  }
  size_t size() const { return size_; }
  size_t capacity() const { return slots_.size(); }
  // i = 0 is the oldest kept frame.
  const FrameRecord& at(size_t i) const {
    return slots_[(head_ + slots_.size() - size_ + i) % slots_.size()];
  }

 private:
  std::vector<FrameRecord> slots_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace core
}  // namespace sentinel
