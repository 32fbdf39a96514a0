#pragma once
// Two scaled magnitudes rounded to an FP8 format and saturated at its largest finite value, by
// CUDA's own conversions (cuda_fp8.h): on a GPU of compute capability 8.9 or more, one
// instruction takes a pair to FP8 codes (round to nearest even, saturating) and one takes the
// codes back to half precision, where the probe's arithmetic (fp8_round_scaled, then
// fp8_saturate) spends about six instructions an element. The two give the same values on every
// finite magnitude: tests/fp8/test_fp8_pair_round.cpp compares them, CUDA's host emulation of
// the same conversions standing in for the instructions. Included by device code and by tests
// that have cuda_fp8.h.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "fp8/fp8_probe_math.h"

namespace sentinel {
namespace cuda {

// a0, a1: finite, >= 0 (the probe's fast path takes normal magnitudes only). `kind` is E4M3 or E5M2.
SENTINEL_HOST_DEVICE inline void fp8_pair_round(float a0, float a1, stats::Fp8ProbeParams::Fp8Kind kind, float& q0,
                                                float& q1) {
  const __nv_fp8_interpretation_t format = kind == stats::Fp8ProbeParams::Fp8Kind::kE5M2 ? __NV_E5M2 : __NV_E4M3;
  const __nv_fp8x2_storage_t codes = __nv_cvt_float2_to_fp8x2(make_float2(a0, a1), __NV_SATFINITE, format);
  const __half2_raw halves = __nv_cvt_fp8x2_to_halfraw2(codes, format);  // every FP8 value is a half
  __half_raw low, high;
  low.x = halves.x;
  high.x = halves.y;
  q0 = __half2float(__half(low));
  q1 = __half2float(__half(high));
}

}  // namespace cuda
}  // namespace sentinel
