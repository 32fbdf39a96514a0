// CUDA's own E8M0 and E2M1 conversions (cuda_fp8.h, cuda_fp4.h), compiled by the host compiler:
// the reference the software conversions and block scales must match bit for bit.
#ifndef SENTINEL_TESTS_FP8_CUDA_BLOCK_ORACLE_H_
#define SENTINEL_TESTS_FP8_CUDA_BLOCK_ORACLE_H_

#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

namespace sentinel {
namespace fp8 {
namespace oracle {

inline uint8_t cuda_e8m0(float x, bool round_up, bool saturate) {
  return __nv_cvt_float_to_e8m0(x, saturate ? __NV_SATFINITE : __NV_NOSAT, round_up ? cudaRoundPosInf : cudaRoundZero);
}

// E8M0 -> bfloat16 -> float (every E8M0 value is a bfloat16).
inline float cuda_e8m0_value(uint8_t code) {
  const __nv_bfloat16_raw b = __nv_cvt_e8m0_to_bf16raw(code);
  const uint32_t bits = static_cast<uint32_t>(b.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint8_t cuda_e2m1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); }

// E2M1 -> half -> float.
inline float cuda_e2m1_value(uint8_t code) {
  const __half_raw h = __nv_cvt_fp4_to_halfraw(code, __NV_E2M1);
  __half v(h);
  return __half2float(v);
}

}  // namespace oracle
}  // namespace fp8
}  // namespace sentinel

#endif  // SENTINEL_TESTS_FP8_CUDA_BLOCK_ORACLE_H_
