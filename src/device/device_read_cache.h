#pragma once
// Reads of device tensors already started in this batch, by the memory they covered
// (frames/tensor_memory.h). An op's output is usually the next op's input and a weight serves its
// ops through views: on a GPU each read is a kernel launch and a pass over device memory, so a
// tensor whose memory was read and has not been written since takes the earlier read's slot
// while that slot is still in flight, or its numbers once they are back.
#include <ATen/core/Tensor.h>
#include <sentinel/stats.h>

#include <cstdint>
#include <vector>

#include "frames/tensor_memory.h"
#include "device/stats_device.h"

namespace sentinel {
namespace device {

class DeviceReadCache {
 public:
  struct Read {
    int64_t slot = -1;      // in flight: the slot the numbers come back in; -1 once back
    bool headroom = false;  // the read counted the fp16/bf16 headroom too
    TensorStats stats;      // once back
    HeadroomCounts headroom_counts;
    bool unusable = false;  // its slot was never read back, or its memory was written unseen
  };

  // An earlier read that serves `t` (keyed memory, unchanged since), with the headroom counts
  // if `want_headroom`; null when `t` must be read.
  const Read* find(const at::Tensor& t, bool want_headroom) {
    if (!frames::keyed_memory(t)) return nullptr;
    const Read* read = reads_.find(t, frames::version_of(t));
    if (!read || read->unusable || (want_headroom && !read->headroom)) return nullptr;
    ++hits_;
    return read;
  }
  // `t`, as it is now, is being read into `slot` (its own, not a slot other tensors add to).
  void started(const at::Tensor& t, int64_t slot, bool headroom) {
    if (!frames::keyed_memory(t)) return;
    Read read;
    read.slot = slot;
    read.headroom = headroom;
    if (in_flight_.empty()) reads_.drop_dead_tensors_when_due();  // no address of a read is held
    in_flight_.push_back(reads_.insert(t, frames::version_of(t), read));
  }
  // Slots [first, end) were just read back: their reads keep the numbers. Only the reads in
  // flight are visited, so a read-back after every op costs what that op read.
  void read_back(const StatsDevice& device, int64_t first, int64_t end) {
    for (Read* read : in_flight_) {
      if (read->slot < 0) continue;  // listed twice: its memory was read again
      if (read->slot >= first && read->slot < end) {
        const SlotResult r = device.result(read->slot);
        read->stats = r.stats;
        read->headroom_counts = r.headroom;
      } else {
        read->unusable = true;  // never read back: not to be trusted
      }
      read->slot = -1;
    }
    in_flight_.clear();
  }
  // The slots in flight will never be read back (a failed device): their reads are forgotten.
  void drop_in_flight() {
    if (in_flight_.empty()) return;
    reads_.keep_if([](const Read& read) { return read.slot < 0; });
    in_flight_.clear();
  }
  void clear() {
    reads_.clear();
    in_flight_.clear();
  }
  // The reads of memory in these storages (sorted) serve no tensor any more: written where no
  // version counter saw it. Marked, not erased: a read in flight is held by its address.
  void forget_storages(const std::vector<const c10::StorageImpl*>& storages) {
    if (!storages.empty()) reads_.visit_storages(storages, [](Read& read) { read.unusable = true; });
  }
  // Keeps the parameters' reads that are back (Options::reuse_unchanged_parameter_reads).
  template <typename Range, typename TensorOf>
  void clear_except(const Range& keep, TensorOf tensor_of) {
    drop_in_flight();
    reads_.clear_except(keep, tensor_of);
  }
  int64_t hits() const { return hits_; }

 private:
  frames::MemoryMap<Read> reads_;
  std::vector<Read*> in_flight_;  // reads_'s values whose slot is in flight (stable addresses)
  int64_t hits_ = 0;
};

}  // namespace device
}  // namespace sentinel
