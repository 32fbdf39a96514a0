#pragma once
// Folding a block's accumulators into a DeviceSlot: atomics on the GPU, plain arithmetic on the
// host (which lets the CPU tests run the kernel's whole reduction scheme without a GPU).
#include "cuda/device_stats.h"
#include "fp8/fp8_probe_math.h"
#include "stats/headroom_math.h"
#include "stats/stats_accumulator.h"

namespace sentinel {
namespace cuda {

SENTINEL_HOST_DEVICE inline unsigned int magnitude_bits(float a) { return fp8::detail::float_to_bits(a); }

// The slot's operations, for one thread at a time (host) ...
struct PlainSlotOps {
  template <typename T>
  static SENTINEL_HOST_DEVICE void add(T* target, T value) { *target += value; }
  static SENTINEL_HOST_DEVICE void max(unsigned int* target, unsigned int value) {
    if (value > *target) *target = value;
  }
};

#if defined(__CUDACC__)
// ... and for every block at once (device).
struct AtomicSlotOps {
  template <typename T>
  static __device__ void add(T* target, T value) { atomicAdd(target, value); }
  static __device__ void max(unsigned int* target, unsigned int value) { atomicMax(target, value); }
};
#endif

template <typename Ops>
SENTINEL_HOST_DEVICE void merge_stats(DeviceSlot& s, const stats::AbsStatsAccumulator<float>& a) {
  using ull = unsigned long long;
  if (a.nan) Ops::add(&s.nan, static_cast<ull>(a.nan));
  if (a.pos_inf) Ops::add(&s.pos_inf, static_cast<ull>(a.pos_inf));
  if (a.inf != a.pos_inf) Ops::add(&s.neg_inf, static_cast<ull>(a.inf - a.pos_inf));
  if (a.zeros) Ops::add(&s.zeros, static_cast<ull>(a.zeros));
  if (a.subnormal) Ops::add(&s.subnormal, static_cast<ull>(a.subnormal));
  Ops::max(&s.abs_max_bits, magnitude_bits(a.abs_max));
  if (a.abs_min <= a.abs_max) Ops::max(&s.abs_min_complement, ~magnitude_bits(a.abs_min));  // not +inf: read something
}

template <typename Ops>
SENTINEL_HOST_DEVICE void merge_probe(DeviceSlot& s, const stats::Fp8ProbeAccumulator<double>& p) {
  using ull = unsigned long long;
  Ops::add(&s.probe_count, static_cast<ull>(p.count));
  if (p.overflow) Ops::add(&s.overflow, static_cast<ull>(p.overflow));
  if (p.underflow) Ops::add(&s.underflow, static_cast<ull>(p.underflow));
  Ops::add(&s.sum_sq_error, p.sum_sq_error);
  Ops::add(&s.sum_a_q, p.sum_a_q);
  Ops::add(&s.sum_q_sq, p.sum_q_sq);
}

template <typename Ops>
SENTINEL_HOST_DEVICE void merge_headroom(DeviceSlot& s, const stats::HeadroomAccumulator& h) {
  using ull = unsigned long long;
  if (h.fp16_overflow) Ops::add(&s.fp16_overflow, static_cast<ull>(h.fp16_overflow));
  if (h.fp16_underflow) Ops::add(&s.fp16_underflow, static_cast<ull>(h.fp16_underflow));
  if (h.bf16_overflow) Ops::add(&s.bf16_overflow, static_cast<ull>(h.bf16_overflow));
  if (h.bf16_underflow) Ops::add(&s.bf16_underflow, static_cast<ull>(h.bf16_underflow));
}

}  // namespace cuda
}  // namespace sentinel
