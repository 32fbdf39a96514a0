#pragma once
// Statistics computed where the tensor lives, read back later: the watchdog hands each tensor of
// a watched op to a StatsDevice, which starts its reduction into a numbered result slot without
// waiting, and makes a range of slots readable at once (one host synchronisation) when the
// watchdog needs the numbers: at batch end, every N frames, or after every op on request.
//
// Two implementations: CUDA tensors (src/device/cuda_stats_device.cpp, built where LibTorch has
// CUDA), and a CPU device that defers the same way (src/device/cpu_deferred_device.cpp), so that
// everything built on deferral (pending frames, slot order, the first-frame search, the moment of
// detection) runs and is tested on any machine.
#include <sentinel/stats.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp8/recipe_probe.h"
#include "fp8/fp8_probe_math.h"
#include "fp8/fp8_probe_result.h"
#include "stats/tensor_stats.h"

namespace at {
class Tensor;
}

namespace sentinel {
namespace device {

// What one slot held when read back.
struct SlotResult {
  TensorStats stats;
  HeadroomCounts headroom;
  stats::Fp8ProbeResult probe;
  std::vector<recipes::BlockProbeResult> recipes;  // one per Request::recipes job, in order
};

// What to compute beyond the statistics.
struct Request {
  bool headroom = false;
  const stats::Fp8ProbeParams* probe = nullptr;  // FP8 cast under these parameters ...
  float probe_scale = 1.0f;                       // ... which are those of this scale
  fp8::Format probe_format = fp8::Format::E4M3;   // and format
  bool accumulate = false;  // add to what the slot already holds (several tensors, one slot)
  bool shared_slot = false;  // the slot is one that several tensors add to (the first one too)
  // The recipes beside delayed scaling, each a read of the tensor after its statistics (their
  // amax sets the tensor-wide scales): only for a device whose replays_recipes().
  const std::vector<recipes::RecipeJob>* recipes = nullptr;
};

class StatsDevice {
 public:
  virtual ~StatsDevice() = default;
  // Whether `t` is this device's to read (a CUDA tensor for the CUDA device).
  virtual bool owns(const at::Tensor& t) const = 0;
  // Read, or why not (an owned tensor of a dtype or layout the device cannot reduce in place).
  virtual stats::Readability readability(const at::Tensor& t) const = 0;
  // Whether it runs Request::recipes (current, MXFP8, NVFP4, Float8Block) as it runs the probe.
  virtual bool replays_recipes() const { return false; }
  // Starts reducing `t` (owned and readable) into `slot`: no host synchronisation, no allocation.
  virtual void enqueue(const at::Tensor& t, int64_t slot, const Request& request) = 0;
  // Between hold_launches() and release_launches() (nothing else runs on the device meanwhile:
  // one op's list of tensors is being read), enqueue() may gather the plain reductions (no probe,
  // no recipes) and start them together at the release, in as few launches as it can. A device
  // that starts each at once ignores both.
  virtual void hold_launches() {}
  virtual void release_launches() {}
  // Makes slots [first, end) readable, waiting once for all of them; then they may be reused.
  virtual void read_back(int64_t first, int64_t end) = 0;
  // A slot of the last read_back().
  virtual SlotResult result(int64_t slot) const = 0;
  // Slots that can be in flight between two read-backs.
  virtual int64_t capacity() const = 0;
  // True while the work being enqueued is captured into a CUDA graph rather than run: nothing
  // may wait for it now, and its slots hold nothing until the graph is replayed.
  virtual bool capturing() const { return false; }
  // Host synchronisations made so far (read-backs that waited).
  virtual int64_t synchronisations() const = 0;
};

// The CUDA device, or null where this build's LibTorch has no CUDA (or no GPU is present);
// `why` then says why.
std::unique_ptr<StatsDevice> make_cuda_device(int64_t capacity, std::string* why = nullptr);

// The CPU device that defers like a GPU: results are computed at enqueue, hidden until read back.
std::unique_ptr<StatsDevice> make_cpu_deferred_device(int64_t capacity);

// Tests: watchdogs made while a factory is set read through the device it makes (for every tensor
// that device owns) instead of the CUDA device. Null restores the default.
using DeviceFactory = std::unique_ptr<StatsDevice> (*)(int64_t capacity);
void set_device_factory_for_testing(DeviceFactory factory);
DeviceFactory device_factory_for_testing();

}  // namespace device
}  // namespace sentinel
