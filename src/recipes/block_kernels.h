#pragma once
// The vector loops of the block-scaled recipes (MXFP8, NVFP4), over a buffer of whole blocks:
// one pass finds each block's amax, the caller turns amaxes into scales, a second pass (over
// the same few KiB, still in cache) casts every element with its block's scale. Compiled once
// per SIMD level (stats/simd_level.h). Internal.
#include <sentinel/fp8.h>

#include <cstdint>

#include "stats/fp8_probe_math.h"
#include "stats/fp8_probe_result.h"

namespace sentinel {
namespace recipes {

// An element format's rounding and thresholds are stats::Fp8ProbeParams with scale 1 (the
// magic-number cast of stats/fp8_probe_math.h): the blocks' own factors scale the elements.
stats::Fp8ProbeParams element_format(fp8::Format f);
stats::Fp8ProbeParams e2m1_format();

// The scalar cast of one element, as the loops compute it: |x| * encode rounded to the grid and
// saturated. Sets `overflow` when the rounded value was above the format's max.
float cast_scaled(float ax, float encode, const stats::Fp8ProbeParams& e, bool& overflow);

// For nblocks blocks of `block` (16 or 32) floats at p: amax[k] = max |x| of block k (NaN
// ignored, as fmaxf does; inf counts), special[k] = 1 if the block holds an inf or NaN.
void block_amaxes(const float* p, int64_t nblocks, int block, float* amax, uint8_t* special);

// Casts every element of the blocks not marked in `skip` with its block's encode/decode factors
// and adds the overflow and underflow counts and the sums, in the dequantized domain (x and
// x_hat = q * decode; float lanes over 256 elements, then double). `count` is left to the caller,
// which knows how many elements were padding (zeros, which add nothing else).
void cast_blocks(const float* p, int64_t nblocks, int block, const float* encode, const float* decode,
                 const uint8_t* skip, const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out);

}  // namespace recipes
}  // namespace sentinel
