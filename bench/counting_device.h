#pragma once
// A device that counts what another device is asked to read and passes everything on: the
// elements of each tensor enqueued, and the bytes its dense span holds (what a CUDA reduction
// reads: an expanded view's smaller tensor). Used by gpt2_read_volume (the deferring CPU device)
// and bench_cuda's profile (the CUDA device).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "device/dense_span.h"
#include "device/stats_device.h"

namespace bench {

struct ReadCounts {
  int64_t elements = 0;
  int64_t span_bytes = 0;
};
// What every counting device has counted since the process started (device factories are plain
// function pointers: the counts cannot live in a capture).
inline ReadCounts counted_reads;

class CountingDevice final : public sentinel::device::StatsDevice {
 public:
  explicit CountingDevice(std::unique_ptr<sentinel::device::StatsDevice> inner) : inner_(std::move(inner)) {}
  bool owns(const at::Tensor& t) const override { return inner_->owns(t); }
  sentinel::stats::Readability readability(const at::Tensor& t) const override { return inner_->readability(t); }
  bool replays_recipes() const override { return inner_->replays_recipes(); }
  void enqueue(const at::Tensor& t, int64_t slot, const sentinel::device::Request& r) override {
    inner_->enqueue(t, slot, r);
    const auto span = sentinel::device::dense_span(t.sizes(), t.strides());
    const int64_t span_elements = t.is_non_overlapping_and_dense() || !span ? t.numel() : span->numel;
    counted_reads.elements += t.numel();
    counted_reads.span_bytes += span_elements * static_cast<int64_t>(t.element_size());
  }
  void hold_launches() override { inner_->hold_launches(); }
  void release_launches() override { inner_->release_launches(); }
  void read_back(int64_t first, int64_t end) override { inner_->read_back(first, end); }
  sentinel::device::SlotResult result(int64_t slot) const override { return inner_->result(slot); }
  int64_t capacity() const override { return inner_->capacity(); }
  bool capturing() const override { return inner_->capturing(); }
  int64_t synchronisations() const override { return inner_->synchronisations(); }

 private:
  std::unique_ptr<sentinel::device::StatsDevice> inner_;
};

// A factory (sentinel::device::DeviceFactory) of CountingDevices around those `Inner` makes.
template <sentinel::device::DeviceFactory Inner>
std::unique_ptr<sentinel::device::StatsDevice> counting_device(int64_t capacity) {
  return std::make_unique<CountingDevice>(Inner(capacity));
}

}  // namespace bench
