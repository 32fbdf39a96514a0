#pragma once
// Reading one tensor into a frame's entry, where it should be read: on its device (the entry waits
// for a read-back), beside its op on a second thread, or here on the CPU through the batch's
// statistics cache (with the FP8 probe and the collections' menu in the same read when the tensor
// is a GEMM operand that wants them). One interface, three readers, each owning its state; the
// watchdog picks one per request (`EntryReaders::pick`).
#include <sentinel/options.h>
#include <sentinel/watchdog.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/step_observers.h"
#include "device/deferred_frames.h"
#include "device/device_read_cache.h"
#include "device/stats_device.h"
#include "frames/frame_record.h"
#include "frames/stats_cache.h"
#include "frames/string_table.h"
#include "overlap/side_reader.h"

namespace at {
class Tensor;
}

namespace sentinel::core {

// A GEMM operand read for the FP8 probe of its slot and/or a statistics collection, in one read.
struct GemmOperand {
  fp8::Role role;
  bool probe = false;    // Options::fp8 selects its slot at this step
  bool collect = false;  // a statistics collection does
};

struct ReadRequest {
  frames::Role role = frames::Role::Input;
  int index = -1;  // the argument or result
  int sub = -1;    // the element of a tensor list
  bool headroom = false;
  const GemmOperand* gemm = nullptr;
  // false: read even if this memory was read in this batch and looks unchanged (the user's code,
  // a collective, may have written it without LibTorch knowing).
  bool reuse_reads = true;
};

// What the readers share with the watchdog (all outlive them).
struct ReadContext {
  const Options& opts;
  const frames::StringTable& strings;
  frames::PlaceTable& places;
  StepObservers& observers;
  DeviceCounters& counters;
};

class EntryReader {
 public:
  virtual ~EntryReader() = default;
  virtual frames::EntryRecord read(frames::FrameRecord& f, const at::Tensor& t, const ReadRequest& r) = 0;
};

// Here, now: the statistics through the batch's cache, or a GEMM operand's statistics, FP8 probe
// and menu in one read.
class CpuReader final : public EntryReader {
 public:
  explicit CpuReader(ReadContext ctx) : ctx_(ctx) {}
  frames::EntryRecord read(frames::FrameRecord& f, const at::Tensor& t, const ReadRequest& r) override;
  // Tensors already read in this batch (and the parameters kept across batches).
  frames::StatsCache& cache() { return cache_; }

 private:
  ReadContext ctx_;
  frames::StatsCache cache_;
};

// An input of an op that writes nothing but its results, read on a second thread while the op runs
// (Options::read_inputs_beside_ops, only while a core is left idle); its entry is filled by
// `collect` before anything uses the frame.
class BesideReader final : public EntryReader {
 public:
  BesideReader(ReadContext ctx, CpuReader& cpu) : ctx_(ctx), cpu_(cpu) {}
  // Whether the inputs now being added (`active`, set per op) go to the second thread.
  void set_active(bool active) { active_ = active; }
  bool takes(const frames::FrameRecord& f, const at::Tensor& t, const ReadRequest& r) const;
  frames::EntryRecord read(frames::FrameRecord& f, const at::Tensor& t, const ReadRequest& r) override;
  // The op's inputs are all posted: the second thread may start.
  void start(frames::FrameRecord& f);
  // Fills the entries of `f` read beside its op, waiting for them.
  void collect(frames::FrameRecord& f);

 private:
  ReadContext ctx_;
  CpuReader& cpu_;
  bool active_ = false;
  std::unique_ptr<overlap::SideReader> side_;  // made at the first read beside an op
};

// On the tensor's device (CUDA, or a test's device): a reduction started there without waiting;
// the entry names its slot, and the frame waits in `deferred()` for the read-back.
class DeviceReader final : public EntryReader {
 public:
  explicit DeviceReader(ReadContext ctx) : ctx_(ctx) {}
  // The device that reads `t`, made at the first tensor one takes; nullptr: read on the CPU.
  device::StatsDevice* owner_of(const at::Tensor& t);
  frames::EntryRecord read(frames::FrameRecord& f, const at::Tensor& t, const ReadRequest& r) override;

  device::StatsDevice* device() { return device_.get(); }
  device::DeferredFrames& deferred() { return deferred_; }
  device::DeviceReadCache& reads() { return reads_; }
  // One op's list of tensors is read between these (StatsDevice::hold_launches): their plain
  // reductions start together at the release. A release that fails says so, and device tensors
  // are no longer read.
  void hold_launches(c10::ArrayRef<at::Tensor> tensors);
  void release_launches() noexcept;
  // A read-back failed: device tensors are no longer read (said by the caller).
  void fail() { failed_ = true; }
  bool failed() const { return failed_; }

 private:
  ReadContext ctx_;
  std::unique_ptr<device::StatsDevice> device_;
  bool tried_ = false;
  bool failed_ = false;
  device::DeferredFrames deferred_;
  device::DeviceReadCache reads_;  // device tensors already read in this batch
  std::vector<recipes::RecipeJob> recipe_jobs_;  // the recipes of the read being enqueued
  bool warned_collect_ = false;
  bool warned_recipes_ = false;
  bool holding_ = false;
};

// Holds a DeviceReader's launches while it lives: one op's list of tensors.
class HeldLaunches {
 public:
  HeldLaunches(DeviceReader* reader, c10::ArrayRef<at::Tensor> tensors) : reader_(reader) {
    if (reader_) reader_->hold_launches(tensors);
  }
  ~HeldLaunches() {
    if (reader_) reader_->release_launches();
  }
  HeldLaunches(HeldLaunches&& other) noexcept : reader_(other.reader_) { other.reader_ = nullptr; }
  HeldLaunches(const HeldLaunches&) = delete;
  HeldLaunches& operator=(const HeldLaunches&) = delete;
  HeldLaunches& operator=(HeldLaunches&&) = delete;

 private:
  DeviceReader* reader_;
};

// The three, and the choice among them.
struct EntryReaders {
  explicit EntryReaders(ReadContext ctx) : cpu(ctx), beside(ctx, cpu), device(ctx) {}
  EntryReader& pick(const frames::FrameRecord& f, const at::Tensor& t, const ReadRequest& r) {
    if (device.owner_of(t)) return device;
    if (beside.takes(f, t, r)) return beside;
    return cpu;
  }
  CpuReader cpu;
  BesideReader beside;
  DeviceReader device;
};

}  // namespace sentinel::core
