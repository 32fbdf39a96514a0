#pragma once
// Frames whose numbers are still on a device. They wait here, outside the bounded frame ring and
// in the order they were made, until one read-back fills them all; only then do they go through
// the ring and detection, so the first non-finite frame is found exactly and the frames before
// it are the ones a report shows, however many frames the read-back waited for.
#include <cstdint>
#include <vector>

#include <sentinel/fp8.h>

#include "frames/frame_record.h"
#include "device/stats_device.h"

namespace sentinel {
namespace device {

// An FP8-probed slot: its numbers belong to this (place, role) of the open step as well.
struct PendingProbe {
  int64_t slot;
  uint32_t place;
  fp8::Role role;
};

class DeferredFrames {
 public:
  int64_t take_slot() { return next_slot_++; }
  int64_t slots_in_flight() const { return next_slot_ - first_unread_; }
  // The slots in flight are [first_unread_slot(), next_slot()).
  int64_t first_unread_slot() const { return first_unread_; }
  int64_t next_slot() const { return next_slot_; }
  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  // The frames of earlier read-backs stay constructed and are written over (constructing one
  // writes all of its 2 KiB; assign copies the entries in use).
  void push(const frames::FrameRecord& f) {
    if (count_ == frames_.size()) frames_.emplace_back();
    frames_[count_++].assign(f);
  }
  void note_probe(const PendingProbe& p) { probes_.push_back(p); }

  // Reads back every slot in flight (one wait) and fills the waiting frames; hands them over in
  // the order they were made by swapping them into `out` (whose old contents are dropped), and
  // the probed slots' numbers through `on_probe(probe, result)`. A frame is a few KiB: the two
  // vectors trade places batch after batch and keep their memory and their frames, so that a
  // batch of a thousand frames allocates and constructs nothing (a deque freed and allocated
  // every frame's node each batch). `out` holds the frames read back, no more.
  template <typename OnProbe>
  void resolve(StatsDevice& device, OnProbe&& on_probe, std::vector<frames::FrameRecord>& out) {
    if (slots_in_flight() > 0) device.read_back(first_unread_, next_slot_);
    first_unread_ = next_slot_;
    for (size_t i = 0; i < count_; ++i) fill(device, frames_[i]);
    for (const auto& p : probes_) on_probe(p, device.result(p.slot));
    frames_.resize(count_);
    out.swap(frames_);
    count_ = 0;
    probes_.clear();
  }
  // Forgets every waiting frame and slot: their numbers cannot be read back.
  void drop() {
    count_ = 0;
    probes_.clear();
    first_unread_ = next_slot_;
  }

 private:
  static void fill(const StatsDevice& device, frames::FrameRecord& f) {
    if (!f.pending) return;
    for (int i = 0; i < f.entry_count; ++i) {
      frames::EntryRecord& e = f.entries[i];
      if (e.pending_slot < 0) continue;
      const SlotResult r = device.result(e.pending_slot);
      e.stats = r.stats;
      if (e.has_headroom) e.headroom = r.headroom;
      e.pending_slot = -1;
      if (!e.stats.finite()) (e.role == frames::Role::Output ? f.outputs_finite : f.inputs_finite) = false;
    }
    for (int role = 0; role < 2; ++role) {
      if (f.omitted_slot[role] >= 0 && !device.result(f.omitted_slot[role]).stats.finite()) {
        (role == 1 ? f.outputs_finite : f.inputs_finite) = false;
      }
      f.omitted_slot[role] = -1;
    }
    f.pending = false;
  }

  std::vector<frames::FrameRecord> frames_;  // the first count_ wait; the rest are kept for reuse
  size_t count_ = 0;
  std::vector<PendingProbe> probes_;
  int64_t next_slot_ = 0;
  int64_t first_unread_ = 0;
};

}  // namespace device
}  // namespace sentinel
