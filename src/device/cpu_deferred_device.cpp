// A device that defers like a GPU without being one: each tensor is read on the CPU when it is
// enqueued (as a kernel on the op's stream reads it right after the op), but its numbers stay
// hidden until read_back() publishes the slot range. The watchdog cannot tell it from the CUDA
// device, so the deferred machinery is exercised on any machine.
#include <ATen/core/Tensor.h>
#include <sentinel/errors.h>

#include <atomic>
#include <string>
#include <vector>

#include "device/stats_device.h"
#include "fp8/fp8_probe.h"
#include "stats/tensor_stats.h"

namespace sentinel {
namespace device {
namespace {

void add_into(SlotResult& into, const SlotResult& r) {
  stats::merge_part(r.stats, into.stats);
  into.headroom.fp16_overflow += r.headroom.fp16_overflow;
  into.headroom.fp16_underflow += r.headroom.fp16_underflow;
  into.headroom.bf16_overflow += r.headroom.bf16_overflow;
  into.headroom.bf16_underflow += r.headroom.bf16_underflow;
  into.probe.add(r.probe);
  if (into.recipes.size() < r.recipes.size()) into.recipes.resize(r.recipes.size());
  for (size_t i = 0; i < r.recipes.size(); ++i) into.recipes[i].add(r.recipes[i]);
}

class CpuDeferredDevice final : public StatsDevice {
 public:
  explicit CpuDeferredDevice(int64_t capacity) : computed_(capacity), published_(capacity) {
    if (capacity <= 0) throw InputError("sentinel: a deferred device needs capacity > 0, got " + std::to_string(capacity));
  }
  bool owns(const at::Tensor& t) const override { return t.defined() && t.device().is_cpu(); }
  stats::Readability readability(const at::Tensor& t) const override { return stats::compute_readability(t); }
  bool replays_recipes() const override { return true; }

  void enqueue(const at::Tensor& t, int64_t slot, const Request& request) override {
    if (holding_ && !request.probe && !request.recipes) {
      held_.push_back(Held{t, slot, request.accumulate, request.headroom});
      return;
    }
    SlotResult r;
    if (request.probe) {
      stats::compute_with_fp8_probe(t, request.probe_scale, request.probe_format, r.stats, r.probe);
    } else {
      stats::compute(t, r.stats);
    }
    if (request.headroom) stats::compute_headroom(t, r.headroom);
    if (request.recipes) {
      r.recipes.resize(request.recipes->size());
      for (size_t i = 0; i < r.recipes.size(); ++i) recipes::run_recipe_job(t, (*request.recipes)[i], r.stats, r.recipes[i]);
    }
    SlotResult& into = computed_[index(slot)];
    if (!request.accumulate) into = SlotResult{};
    add_into(into, r);
  }

  // As the CUDA device: the held reductions run together at the release, here as one read of
  // the list shared out between ATen's threads.
  void hold_launches() override { holding_ = true; }
  void release_launches() override {
    holding_ = false;
    if (held_.empty()) return;
    std::vector<at::Tensor> tensors;
    for (const Held& h : held_) tensors.push_back(h.tensor);
    std::vector<TensorStats> stats(tensors.size());
    std::vector<stats::Readability> readability(tensors.size());
    stats::compute_many(tensors, stats.data(), readability.data());
    for (size_t i = 0; i < held_.size(); ++i) {
      SlotResult r;
      r.stats = stats[i];
      if (held_[i].headroom) stats::compute_headroom(tensors[i], r.headroom);
      SlotResult& into = computed_[index(held_[i].slot)];
      if (!held_[i].accumulate) into = SlotResult{};
      add_into(into, r);
    }
    held_.clear();
  }

  void read_back(int64_t first, int64_t end) override {
    release_launches();
    if (end - first > capacity()) {
      throw Error("sentinel: " + std::to_string(end - first) + " slots to read back from a ring of " +
                  std::to_string(capacity()));
    }
    for (int64_t s = first; s < end; ++s) {
      published_[index(s)] = computed_[index(s)];
      computed_[index(s)] = SlotResult{};  // reused zeroed, as the CUDA ring is
    }
    ++synchronisations_;
  }
  SlotResult result(int64_t slot) const override { return published_[index(slot)]; }
  int64_t capacity() const override { return static_cast<int64_t>(computed_.size()); }
  int64_t synchronisations() const override { return synchronisations_; }

 private:
  size_t index(int64_t slot) const { return static_cast<size_t>(slot % capacity()); }
  std::vector<SlotResult> computed_;   // what the "device" holds
  std::vector<SlotResult> published_;  // what the host has read back
  int64_t synchronisations_ = 0;
  struct Held {
    at::Tensor tensor;
    int64_t slot;
    bool accumulate, headroom;
  };
  bool holding_ = false;
  std::vector<Held> held_;  // between hold_launches() and release_launches()
};

}  // namespace

std::unique_ptr<StatsDevice> make_cpu_deferred_device(int64_t capacity) {
  return std::make_unique<CpuDeferredDevice>(capacity);
}

namespace {
std::atomic<DeviceFactory> testing_factory{nullptr};
}

void set_device_factory_for_testing(DeviceFactory factory) { testing_factory.store(factory); }
DeviceFactory device_factory_for_testing() { return testing_factory.load(); }

}  // namespace device
}  // namespace sentinel
