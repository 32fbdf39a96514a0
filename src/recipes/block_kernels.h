#pragma once
// The vector loops of the block-scaled recipes (MXFP8, NVFP4), over a buffer of whole blocks:
// one pass finds each block's amax, a loop over the amaxes turns them into scales, a second pass
// (over the same few KiB, still in cache) casts every element with its block's scale. Compiled
// once per SIMD level (stats/simd_level.h). Internal.
#include <sentinel/block_scaling.h>

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

// Blocks whose |x| reach kLargeForFloatSums, or stay below kSmallForFloatSums, are summed in
// double: their squares could leave float's range in the lanes.
constexpr float kLargeForFloatSums = 1e17f;
constexpr float kSmallForFloatSums = 1e-12f;

// What turns a block's amax into its scale, fixed for one tensor (include/sentinel/block_scaling.h).
struct ScaleRule {
  fp8::ScalingRecipe kind = fp8::ScalingRecipe::MXFP8;  // MXFP8 or NVFP4
  fp8::Format element = fp8::Format::E4M3;              // MXFP8's element format
  fp8::MxScaleRule rule = fp8::MxScaleRule::RoundUp;
  float tensor_scale = 1.0f;                            // NVFP4's S_enc (fp8::nvfp4_tensor_scale)
};

// Blocks counted by block_scales, as BlockProbeResult counts them.
struct ScaleTally {
  int64_t zero = 0, saturated = 0, at_min = 0, nonfinite = 0;
};

// For n blocks with amax[k] and special[k] (block_amaxes): the scale of each, as
// fp8::mxfp8_block_scale / fp8::nvfp4_block_scale give it (an OCP-rule block holding inf or NaN
// gets the NaN scale), in vector lanes: code[k], encode[k], decode[k]; skip[k] = 1 where the
// block must be cast element by element in double (it holds inf or NaN, its scale is lost or
// zero, or its squares could leave float's range). Adds the blocks' tallies to `tally`; the
// histogram of codes is the caller's.
void block_scales(const float* amax, const uint8_t* special, int64_t n, const ScaleRule& rule, uint8_t* code,
                  float* encode, float* decode, uint8_t* skip, ScaleTally& tally);

// `block` is 16 or 32 (NVFP4's and MXFP8's): each size has loops of its own, unrolled over a block.

// For nblocks blocks of `block` floats at p: amax[k] = max |x| of block k (NaN ignored, as fmaxf
// does; inf counts), special[k] = 1 if the block holds an inf or NaN.
void block_amaxes(const float* p, int64_t nblocks, int block, float* amax, uint8_t* special);

// Casts every element of the blocks not marked in `skip` with its block's encode/decode factors
// and adds the overflow and underflow counts and the sums, in the dequantized domain (x and
// x_hat = q * decode; float lanes over 256 elements, then double; fused multiply-adds where the
// CPU has them). `count` is left to the caller, which knows how many elements were padding
// (zeros, which add nothing else).
void cast_blocks(const float* p, int64_t nblocks, int block, const float* encode, const float* decode,
                 const uint8_t* skip, const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out);

}  // namespace recipes
}  // namespace sentinel
