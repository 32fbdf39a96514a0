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

// The statistics menu (min, max, mean, std, norms, dynamic range), reduced alongside
// AbsStatsAccumulator from the same chunks while they are still in cache: never a second read of
// the tensor from memory. Sums are kept in double. The variance uses per-chunk means combined by
// Chan's rule, so a large mean does not cancel the spread away as sum(x^2) - n mean^2 would.
struct MomentsAccumulator {
  int64_t n = 0;
  double mean = 0, m2 = 0;          // of the elements so far; m2 = sum (x - mean)^2
  double sum_abs = 0, sum_sq = 0;
  double min = INFINITY, max = -INFINITY;  // over the non-NaN elements
  double min_nonzero_abs = INFINITY;
  double max_abs = 0;
  bool any_nan = false;

  // One chunk (in cache), read twice: sums and extremes, then the squared deviations from the
  // chunk's own mean.
  template <typename F>
  SENTINEL_HOST_DEVICE void add_chunk(const F* p, int64_t len) {
    if (len <= 0) return;
    MomentsAccumulator c;
    double sum = 0;
    for (int64_t i = 0; i < len; ++i) c.reduce_first_loop(static_cast<double>(p[i]), sum);
    c.n = len;
    c.mean = sum / static_cast<double>(len);
    for (int64_t i = 0; i < len; ++i) {
      const double d = static_cast<double>(p[i]) - c.mean;
      c.m2 += d * d;
    }
    combine(c);
  }

  // One element of a chunk's first loop: extremes and sums (`sum` of the values, for the mean).
  SENTINEL_HOST_DEVICE void reduce_first_loop(double x, double& sum) {
    const double a = fabs(x);
    sum += x;
    sum_abs += a;
    sum_sq += x * x;
    any_nan |= (x != x);
    min = x < min ? x : min;
    max = x > max ? x : max;
    max_abs = a > max_abs ? a : max_abs;
    min_nonzero_abs = (a > 0 && a < min_nonzero_abs) ? a : min_nonzero_abs;
  }

  SENTINEL_HOST_DEVICE void combine(const MomentsAccumulator& o) {
    if (o.n == 0) return;
    if (n == 0) {
      *this = o;
      return;
    }
    const double total = static_cast<double>(n + o.n);
    const double delta = o.mean - mean;
    mean += delta * (static_cast<double>(o.n) / total);
    m2 += o.m2 + delta * delta * (static_cast<double>(n) * static_cast<double>(o.n) / total);
    n += o.n;
    sum_abs += o.sum_abs;
    sum_sq += o.sum_sq;
    any_nan |= o.any_nan;
    min = o.min < min ? o.min : min;
    max = o.max > max ? o.max : max;
    max_abs = o.max_abs > max_abs ? o.max_abs : max_abs;
    min_nonzero_abs = o.min_nonzero_abs < min_nonzero_abs ? o.min_nonzero_abs : min_nonzero_abs;
  }
};

}  // namespace stats
}  // namespace sentinel
