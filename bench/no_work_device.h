#pragma once
// A device that does no work: what the watchdog's device path (deferred frames, result slots,
// reads reused, read-backs) costs the host per op, launches excluded. It owns CPU tensors (the CPU
// benchmarks), or CUDA tensors (bench_cuda: a watched GPU step without its launches).
#include <ATen/core/Tensor.h>

#include <memory>

#include "device/stats_device.h"

namespace bench {

class NoWorkDevice final : public sentinel::device::StatsDevice {
 public:
  NoWorkDevice(int64_t capacity, c10::DeviceType owned) : capacity_(capacity), owned_(owned) {}
  bool owns(const at::Tensor& t) const override { return t.defined() && t.device().type() == owned_; }
  sentinel::stats::Readability readability(const at::Tensor& t) const override {
    const auto r = sentinel::stats::compute_readability(t);
    return r == sentinel::stats::Readability::NotOnCpu && owned_ != c10::DeviceType::CPU
               ? sentinel::stats::Readability::Read
               : r;
  }
  void enqueue(const at::Tensor&, int64_t, const sentinel::device::Request&) override {}
  void read_back(int64_t, int64_t) override { ++synchronisations_; }
  sentinel::device::SlotResult result(int64_t) const override { return {}; }
  int64_t capacity() const override { return capacity_; }
  int64_t synchronisations() const override { return synchronisations_; }

 private:
  int64_t capacity_;
  c10::DeviceType owned_;
  int64_t synchronisations_ = 0;
};

inline std::unique_ptr<sentinel::device::StatsDevice> no_work_device(int64_t capacity) {
  return std::make_unique<NoWorkDevice>(capacity, c10::DeviceType::CPU);
}

inline std::unique_ptr<sentinel::device::StatsDevice> no_work_cuda_device(int64_t capacity) {
  return std::make_unique<NoWorkDevice>(capacity, c10::DeviceType::CUDA);
}

}  // namespace bench
