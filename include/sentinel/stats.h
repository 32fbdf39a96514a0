#pragma once
// Statistics of one tensor, as computed by the sentinel's single fused pass.
#include <cstdint>
#include <limits>

namespace sentinel {

struct TensorStats {
  int64_t count = 0;      // elements read
  int64_t nan = 0;
  int64_t pos_inf = 0;
  int64_t neg_inf = 0;
  int64_t zeros = 0;      // +0 and -0
  int64_t subnormal = 0;  // non-zero elements below the dtype's smallest normal
  // Over the non-NaN elements; zeros count (as in HF's abs().min()).
  double abs_min = std::numeric_limits<double>::infinity();
  double abs_max = 0.0;

  int64_t nonfinite() const { return nan + pos_inf + neg_inf; }
  bool finite() const { return nonfinite() == 0; }
  // HF's view: torch's min()/max() propagate NaN, so a tensor holding NaN shows nan/nan.
  double hf_abs_min() const;
  double hf_abs_max() const;
};

// What casting to fp16 and to bf16 would do, counted exactly as the round-to-nearest-even casts
// round: values at or above the largest finite value plus half an ulp become inf; non-zero values
// at or below half the smallest subnormal become zero.
struct HeadroomCounts {
  int64_t fp16_overflow = 0;
  int64_t fp16_underflow = 0;
  int64_t bf16_overflow = 0;
  int64_t bf16_underflow = 0;
};

}  // namespace sentinel
