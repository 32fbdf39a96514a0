// Host side of a result slot: the statistics and the probe result as the CPU pass gives them.
#include <cmath>
#include <limits>

#include "cuda/device_stats.h"

namespace sentinel {
namespace cuda {

TensorStats decode_stats(const DeviceSlot& slot) {
  TensorStats t;
  t.count = static_cast<int64_t>(slot.count);
  t.nan = static_cast<int64_t>(slot.nan);
  t.pos_inf = static_cast<int64_t>(slot.pos_inf);
  t.neg_inf = static_cast<int64_t>(slot.neg_inf);
  t.zeros = static_cast<int64_t>(slot.zeros);
  t.subnormal = static_cast<int64_t>(slot.subnormal);
  t.abs_max = fp8::detail::bits_to_float(slot.abs_max_bits);
  t.abs_min = slot.abs_min_complement == 0 ? std::numeric_limits<double>::infinity()
                                           : fp8::detail::bits_to_float(~slot.abs_min_complement);
  return t;
}

stats::Fp8ProbeResult decode_probe(const DeviceSlot& slot, float scale) {
  stats::Fp8ProbeResult r;
  r.count = static_cast<int64_t>(slot.probe_count);
  r.overflow = static_cast<int64_t>(slot.overflow);
  r.underflow = static_cast<int64_t>(slot.underflow);
  r.add_scaled_sums(slot.sum_sq_error, slot.sum_a_q, slot.sum_q_sq, scale);
  return r;
}

HeadroomCounts decode_headroom(const DeviceSlot& slot) {
  HeadroomCounts h;
  h.fp16_overflow = static_cast<int64_t>(slot.fp16_overflow);
  h.fp16_underflow = static_cast<int64_t>(slot.fp16_underflow);
  h.bf16_overflow = static_cast<int64_t>(slot.bf16_overflow);
  h.bf16_underflow = static_cast<int64_t>(slot.bf16_underflow);
  return h;
}

}  // namespace cuda
}  // namespace sentinel
