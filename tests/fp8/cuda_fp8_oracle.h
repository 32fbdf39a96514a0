// CUDA's own FP8 conversions, used as the reference the software casts must
// match bit for bit. Compiled by the host compiler, cuda_fp8.h takes its
// portable (non-PTX) path, which needs no GPU and no CUDA runtime.
#ifndef SENTINEL_TESTS_FP8_CUDA_FP8_ORACLE_H_
#define SENTINEL_TESTS_FP8_CUDA_FP8_ORACLE_H_

#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <ostream>

#include "sentinel/fp8.h"

namespace sentinel {
namespace fp8 {
namespace oracle {

inline uint8_t cuda_encode(float x, Format f, bool saturate) {
  return __nv_cvt_float_to_fp8(x, saturate ? __NV_SATFINITE : __NV_NOSAT,
                               f == Format::E4M3 ? __NV_E4M3 : __NV_E5M2);
}

inline float cuda_decode(uint8_t code, Format f) {
  if (f == Format::E4M3) {
    __nv_fp8_e4m3 v;
    v.__x = code;
    return static_cast<float>(v);
  }
  __nv_fp8_e5m2 v;
  v.__x = code;
  return static_cast<float>(v);
}

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// The four (format, saturation) combinations every cast test covers.
struct CastMode {
  Format format;
  bool saturate;
};
constexpr CastMode kAllModes[] = {
    {Format::E4M3, true}, {Format::E4M3, false}, {Format::E5M2, true}, {Format::E5M2, false}};

inline const char* mode_name(const CastMode& m) {
  if (m.format == Format::E4M3) return m.saturate ? "E4M3_satfinite" : "E4M3_nosat";
  return m.saturate ? "E5M2_satfinite" : "E5M2_nosat";
}

// Readable test parameter names in gtest output.
inline void PrintTo(const CastMode& m, std::ostream* os) { *os << mode_name(m); }

}  // namespace oracle
}  // namespace fp8
}  // namespace sentinel

#endif  // SENTINEL_TESTS_FP8_CUDA_FP8_ORACLE_H_
