#pragma once
// fp8_round_scaled (fp8/fp8_probe_math.h) on the lanes of a GCC vector: the same magic-number
// rounding in the same operations, for the SIMD loops of the FP8 probe and the block recipes.
// CPU only (the GPU kernels use the scalar form).
#include <cstring>

namespace sentinel {
namespace stats {

// q0 = each lane of a (finite or not, >= 0) rounded to the grid, before saturation. V holds
// float lanes, U uint32_t lanes of the same width; exp_mask is 0x7f800000 in every lane, offset
// and floor are Fp8ProbeParams' magic_offset and magic_floor. (An out parameter: a vector returned
// by value would change the ABI between the SIMD variants.)
template <typename V, typename U>
__attribute__((always_inline)) inline void fp8_round_lanes(const V& a, const U& exp_mask, const U& offset,
                                                           const V& floor, V& q0) {
  U abits;
  std::memcpy(&abits, &a, sizeof abits);
  const U mbits = (abits & exp_mask) + offset;
  V magic;
  std::memcpy(&magic, &mbits, sizeof magic);
  magic = magic > floor ? magic : floor;
  q0 = (a + magic) - magic;
}

}  // namespace stats
}  // namespace sentinel
