#pragma once
// The one accumulator behind every statistic: reduce (one element), combine (two partial
// results), project (to TensorStats). Plain arithmetic only, so the same code compiles for the
// CPU and, under nvcc, for the GPU.
#include <sentinel/stats.h>

#include <cmath>
#include <cstdint>

#ifndef SENTINEL_HOST_DEVICE
#if defined(__CUDACC__)
#define SENTINEL_HOST_DEVICE __host__ __device__
#else
#define SENTINEL_HOST_DEVICE
#endif
#endif

namespace sentinel {
namespace stats {

SENTINEL_HOST_DEVICE inline float abs_value(float x) { return fabsf(x); }
SENTINEL_HOST_DEVICE inline double abs_value(double x) { return fabs(x); }

// Counts are uint32 so a block of up to 2^31 elements vectorises (one lane width with the
// floats); callers combine blocks into the int64 totals.
template <typename acc_t>
struct AbsStatsAccumulator {
  acc_t abs_min;
  acc_t abs_max;
  uint32_t nan = 0, inf = 0, pos_inf = 0, zeros = 0, subnormal = 0;

  SENTINEL_HOST_DEVICE explicit AbsStatsAccumulator(acc_t init_min) : abs_min(init_min), abs_max(0) {}

  // `smallest_normal` belongs to the tensor's own dtype (fp16 subnormals are not fp32's).
  SENTINEL_HOST_DEVICE void reduce(acc_t x, acc_t inf_value, acc_t smallest_normal) {
    acc_t a = abs_value(x);  // clears the sign bit: |-0| is +0, as torch's abs()
    // Written as selects that ignore NaN (a comparison with NaN is false), which the compiler
    // turns into min/max vector instructions.
    abs_min = a < abs_min ? a : abs_min;
    abs_max = a > abs_max ? a : abs_max;
    nan += (a != a);
    inf += (a == inf_value);
    pos_inf += (x == inf_value);
    zeros += (a == 0);
    subnormal += (a < smallest_normal) & (a > 0);
  }

  SENTINEL_HOST_DEVICE void combine(const AbsStatsAccumulator& o) {
    abs_min = o.abs_min < abs_min ? o.abs_min : abs_min;
    abs_max = o.abs_max > abs_max ? o.abs_max : abs_max;
    nan += o.nan;
    inf += o.inf;
    pos_inf += o.pos_inf;
    zeros += o.zeros;
    subnormal += o.subnormal;
  }

  // Adds this block into `out`, which holds the totals of earlier blocks.
  SENTINEL_HOST_DEVICE void project(int64_t block_count, TensorStats& out) const {
    out.count += block_count;
    out.nan += nan;
    out.pos_inf += pos_inf;
    out.neg_inf += inf - pos_inf;
    out.zeros += zeros;
    out.subnormal += subnormal;
    if (static_cast<double>(abs_min) < out.abs_min) out.abs_min = static_cast<double>(abs_min);
    if (static_cast<double>(abs_max) > out.abs_max) out.abs_max = static_cast<double>(abs_max);
  }
};

}  // namespace stats
}  // namespace sentinel
