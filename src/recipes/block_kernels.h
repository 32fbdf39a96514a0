#pragma once
// The vector loops of the block-scaled recipes (MXFP8, NVFP4), over a buffer of whole blocks:
// one pass finds each block's amax, the caller turns amaxes into scales, a second pass (over
// the same few KiB, still in cache) casts every element with its block's scale. Compiled once
// per SIMD level (stats/simd_level.h). Internal.
#include <sentinel/fp8.h>

#include <cstdint>

namespace sentinel {
namespace recipes {

// The element format's rounding: the magic-number cast of stats/fp8_probe_math.h, generalised
// to E2M1. a (finite, >= 0) rounds to ((a + magic) - magic), magic = max(exponent bits of a +
// magic_offset, magic_floor); values that round above `max` saturate to it.
struct ElementFormat {
  float max = 448.0f;
  float magic_floor = 0;
  uint32_t magic_offset = 0;
  const char* name = "E4M3";
  float overflow_above = 464.0f;  // scaled values above this round above max (and saturate)
  float zero_at_most = 0;         // scaled values at or below this round to zero
};
ElementFormat element_format(fp8::Format f);
ElementFormat e2m1_format();

// The scalar cast of one element, as the loops compute it: |x| * encode rounded to the grid and
// saturated. Sets `overflow` when the rounded value was above the format's max.
float cast_scaled(float ax, float encode, const ElementFormat& e, bool& overflow);

// Counts and sums of the cast blocks, in the dequantized domain (x and x_hat = q * decode).
struct BlockSums {
  int64_t count = 0, overflow = 0, underflow = 0;
  double sum_sq_error = 0, sum_x_xhat = 0, sum_x_sq = 0, sum_xhat_sq = 0;
};

// For nblocks blocks of `block` (16 or 32) floats at p: amax[k] = max |x| of block k (NaN
// ignored, as fmaxf does; inf counts), special[k] = 1 if the block holds an inf or NaN.
void block_amaxes(const float* p, int64_t nblocks, int block, float* amax, uint8_t* special);

// Casts every element of the blocks not marked in `skip` with its block's encode/decode factors
// and adds the overflow and underflow counts and the sums (float lanes over 256 elements, then
// double). `count` is left to the caller, which knows how many elements were padding (zeros,
// which add nothing else).
void cast_blocks(const float* p, int64_t nblocks, int block, const float* encode, const float* decode,
                 const uint8_t* skip, const ElementFormat& e, BlockSums& out);

}  // namespace recipes
}  // namespace sentinel
