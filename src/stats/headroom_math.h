#pragma once
// fp16/bf16 headroom of one element: whether casting it would overflow to inf or flush a non-zero
// value to zero, as the round-to-nearest-even casts round. Plain arithmetic, shared by the CPU
// pass and (under nvcc) the CUDA kernel.
#include <cstdint>

#include "stats/stats_accumulator.h"

namespace sentinel {
namespace stats {

// Round-to-nearest-even boundaries: fp16 max 65504, half an ulp above it 65520 (ties go to the
// even neighbour, 65536 = inf); smallest subnormal 2^-24, half of it 2^-25 (ties go to 0).
// bf16 max 0x7F7F, half an ulp above it 0x7F7F8000 as float32; smallest subnormal 2^-133.
// Every boundary is a float32 value, so comparing a float32 or a float64 with it is exact.
constexpr double kFp16Overflow = 0x1.ffep+15;  // 65520
constexpr double kFp16Flush = 0x1p-25;
constexpr double kBf16Overflow = 0x1.ffp+127;  // float32 bits 0x7F7F8000
constexpr double kBf16Flush = 0x1p-134;

struct HeadroomAccumulator {
  uint32_t fp16_overflow = 0, fp16_underflow = 0, bf16_overflow = 0, bf16_underflow = 0;

  // `a` is |x|; an element that is already inf is not an overflow of the cast.
  template <typename T>
  SENTINEL_HOST_DEVICE void reduce(T a, T inf_value) {
    const bool finite_nonzero = (a > 0) & (a != inf_value);
    fp16_overflow += (a >= T(kFp16Overflow)) & (a != inf_value);
    fp16_underflow += finite_nonzero & (a <= T(kFp16Flush));
    bf16_overflow += (a >= T(kBf16Overflow)) & (a != inf_value);
    bf16_underflow += finite_nonzero & (a <= T(kBf16Flush));
  }
  SENTINEL_HOST_DEVICE void combine(const HeadroomAccumulator& o) {
    fp16_overflow += o.fp16_overflow;
    fp16_underflow += o.fp16_underflow;
    bf16_overflow += o.bf16_overflow;
    bf16_underflow += o.bf16_underflow;
  }
};

}  // namespace stats
}  // namespace sentinel
