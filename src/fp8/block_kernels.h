#pragma once
// The vector loops of the block-scaled recipes (MXFP8, NVFP4), over a buffer of whole blocks:
// one pass finds each block's amax, a loop over the amaxes turns them into scales, a second pass
// (block_cast.cpp, over the same few KiB, still in cache) casts every element with its block's
// scale. Compiled once per SIMD level (stats/simd_level.h). Internal.
#include <sentinel/block_scaling.h>

#include <cfloat>
#include <cstdint>

#include "fp8/fp8_probe_math.h"
#include "fp8/fp8_probe_result.h"

namespace sentinel {
namespace recipes {

// An element format's rounding and thresholds are stats::Fp8ProbeParams with scale 1 (the
// magic-number cast of fp8/fp8_probe_math.h): the blocks' own factors scale the elements.
stats::Fp8ProbeParams element_format(fp8::Format f);
stats::Fp8ProbeParams e2m1_format();

// Blocks whose |x| reach kLargeForFloatSums, or stay below kSmallForFloatSums, are summed in
// double: their squares could leave float's range in the lanes.
constexpr float kLargeForFloatSums = 1e17f;
constexpr float kSmallForFloatSums = 1e-12f;

// How the cast pass takes a block (block_scales' `path`), bits. kExactCast: element by element
// in double, by the caller. kMayFlush: some element may flush to zero or be zero, so the loop
// counts underflows. kMaySaturate: some element may round above the format's max, so the loop
// counts overflows and saturates. Neither bit: the block's extremes show that no element can
// (rounding is monotonic in |x| * encode), and the loop skips that work.
constexpr uint8_t kExactCast = 1, kMayFlush = 2, kMaySaturate = 4;

// Path bits in each of eight path bytes read as one word (the loops scan paths 8 at a time).
constexpr uint64_t in_word(uint8_t bits) { return 0x0101010101010101ull * bits; }

// The path of a block whose |x| lie in [low, amax] (special: it holds inf or NaN) under these
// factors and element format. Bitwise operators: short-circuits would be branches, which keep
// the scale loop from vectorising.
inline uint32_t block_path(float amax, float low, uint32_t special, float encode, float decode,
                           const stats::Fp8ProbeParams& e) {
  const uint32_t bad_scale = (1u - ((decode > 0.0f) & (decode <= FLT_MAX))) | (encode == 0.0f);
  const uint32_t exact = special | bad_scale | (amax >= kLargeForFloatSums) | (amax < kSmallForFloatSums);
  const uint32_t flush = 1u - (low * encode >= e.underflow_below);
  const uint32_t saturate = 1u - (amax * encode <= e.overflow_above);
  return exact * kExactCast | flush * kMayFlush | saturate * kMaySaturate;
}

// What turns a block's amax into its scale, fixed for one tensor (include/sentinel/block_scaling.h).
struct ScaleRule {
  fp8::ScalingRecipe kind = fp8::ScalingRecipe::MXFP8;  // MXFP8, NVFP4 or Float8Block
  fp8::Format element = fp8::Format::E4M3;              // MXFP8's and Float8Block's element format
  fp8::MxScaleRule rule = fp8::MxScaleRule::RoundUp;
  float tensor_scale = 1.0f;                            // NVFP4's S_enc (fp8::nvfp4_tensor_scale)
  bool pow2 = true;                                     // Float8Block: power-of-two scales
  float epsilon = 0.0f;                                 // Float8Block: the amax's floor
};

// Blocks counted by block_scales, as BlockProbeResult counts them.
struct ScaleTally {
  int64_t zero = 0, saturated = 0, at_min = 0, nonfinite = 0;
};

// For n blocks with amax[k], low[k] and special[k] (block_amaxes): the scale of each, as
// fp8::mxfp8_block_scale / fp8::nvfp4_block_scale / fp8::float8_block_scale give it (an OCP-rule block holding inf or NaN
// gets the NaN scale), in vector lanes: code[k], encode[k], decode[k]; and path[k] (block_path:
// kExactCast where the block holds inf or NaN, its scale is lost or zero, or its squares could
// leave float's range), for casting to `element`. Adds the blocks' tallies to `tally`; the
// histogram of codes is the caller's.
void block_scales(const float* amax, const float* low, const uint8_t* special, int64_t n, const ScaleRule& rule,
                  const stats::Fp8ProbeParams& element, uint8_t* code, float* encode, float* decode, uint8_t* path,
                  ScaleTally& tally);

// `block` is 16 or 32 (NVFP4's and MXFP8's): each size has loops of its own, unrolled over a block.

// For nblocks blocks of `block` floats at p: amax[k] = max |x| of block k (NaN ignored, as fmaxf
// does; inf counts), low[k] <= min |x| of block k (the min over the few blocks read with it),
// special[k] = 1 if the block holds an inf or NaN.
void block_amaxes(const float* p, int64_t nblocks, int block, float* amax, float* low, uint8_t* special);

// Casts every element of the blocks whose path is not kExactCast with its block's encode/decode
// factors and adds the overflow and underflow counts and the sums, in the dequantized domain (x
// and x_hat = q * decode; float lanes over 512 elements, then double; fused multiply-adds where
// the CPU has them). `count` is left to the caller, which knows how many elements were padding
// (zeros, which add nothing else). Prefetches the nblocks blocks after the buffer (a prefetch
// never faults): where a tensor is read in place, they are the next buffer.
// power_of_two_scales: each such block's encode is 2^k and its decode 2^-k, both normal floats
// (MXFP8's E8M0 scales), which lets the loops skip both multiplies.
void cast_blocks(const float* p, int64_t nblocks, int block, bool power_of_two_scales, const float* encode,
                 const float* decode, const uint8_t* path, const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out);

}  // namespace recipes
}  // namespace sentinel
