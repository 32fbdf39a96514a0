// TransformerEngine's Float8BlockScaling scale (compute_scale_from_amax), re-derived in double:
// the reference for fp8::float8_block_scale and for the block cast's vector loop.
#ifndef SENTINEL_TESTS_FP8_FLOAT8_BLOCK_ORACLE_H_
#define SENTINEL_TESTS_FP8_FLOAT8_BLOCK_ORACLE_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "sentinel/fp8.h"

namespace sentinel {
namespace fp8 {
namespace oracle {

struct Float8BlockScale {
  uint8_t code;  // scale_inv's biased exponent (0 for a float subnormal)
  float scale, scale_inv;
  bool saturated;  // the division overflowed: FLT_MAX
};

// fp8_max / amax rounded once to float (double rounding is innocuous for a division: 53 >=
// 2 * 24 + 2), FLT_MAX where that is inf, 1 for a zero or infinite amax; with `pow2` the power of
// two at or below it, by frexp; scale_inv = 1 / scale rounded to float.
inline Float8BlockScale float8_block_reference(float amax, Format element, bool pow2, float epsilon) {
  const float a = std::max(amax, epsilon);
  float scale = 1.0f;
  bool saturated = false;
  if (a != 0.0f && std::isfinite(a)) {
    scale = static_cast<float>(static_cast<double>(max_value(element)) / a);
    if (std::isinf(scale)) {
      scale = FLT_MAX;
      saturated = true;
    }
    if (pow2) {
      int e = 0;
      std::frexp(scale, &e);  // scale = m * 2^e, m in [0.5, 1)
      scale = std::ldexp(1.0f, e - 1);
    }
  }
  const float scale_inv = static_cast<float>(1.0 / static_cast<double>(scale));
  const int code = scale_inv < FLT_MIN ? 0 : std::ilogb(scale_inv) + 127;
  return {static_cast<uint8_t>(code), scale, scale_inv, saturated};
}

}  // namespace oracle
}  // namespace fp8
}  // namespace sentinel

#endif  // SENTINEL_TESTS_FP8_FLOAT8_BLOCK_ORACLE_H_
