#pragma once
// The last N frames. Its bound holds always (after dumps and traces too), unlike HF's deque that
// turns into an unbounded list after the first dump. Slots are made as frames arrive, never
// before: a large max_frames_to_save costs memory only once that many frames were recorded
// (sizeof(FrameRecord), 2,000 bytes, per frame; docs/usage.md), and a deque adds slots without
// moving the ones it has.
#include <cstddef>
#include <deque>

#include "frames/frame_record.h"

namespace sentinel {
namespace frames {

class FrameRing {
 public:
  explicit FrameRing(size_t capacity) : capacity_(capacity) {}
  void push(const FrameRecord& f) {
    if (slots_.size() < capacity_) {
      slots_.emplace_back().assign(f);
      head_ = slots_.size() % capacity_;
      return;
    }
    slots_[head_].assign(f);
    head_ = (head_ + 1) % capacity_;
  }
  size_t size() const { return slots_.size(); }
  size_t capacity() const { return capacity_; }
  // Slots made so far (memory in use: allocated() * sizeof(FrameRecord)).
  size_t allocated() const { return slots_.size(); }
  // i = 0 is the oldest kept frame.
  const FrameRecord& at(size_t i) const { return slots_[(head_ + capacity_ - slots_.size() + i) % capacity_]; }

 private:
  size_t capacity_;
  std::deque<FrameRecord> slots_;
  size_t head_ = 0;
};

}  // namespace frames
}  // namespace sentinel
