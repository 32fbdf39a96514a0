#pragma once
// What a block-scaled recipe (MXFP8, NVFP4, Float8Block) would do to one CPU tensor: every block's scale
// from its amax, every element cast with it, in the dequantized domain. Internal.
#include <sentinel/block_scaling.h>

#include <array>
#include <cstdint>

#include "fp8/fp8_probe_result.h"

namespace at {
class Tensor;
}

namespace sentinel {
namespace recipes {

struct BlockRecipe {
  fp8::ScalingRecipe kind = fp8::ScalingRecipe::MXFP8;  // MXFP8, NVFP4 or Float8Block
  fp8::Format element = fp8::Format::E4M3;              // MXFP8's and Float8Block's element format
  fp8::MxScaleRule rule = fp8::MxScaleRule::RoundUp;
  bool pow2 = true;         // Float8Block: power-of-two scales
  float epsilon = 0.0f;     // Float8Block: the amax's floor
};

// Where a tensor's blocks lie: along `dim` (the GEMM's reduction dimension), or, for NVFP4 and
// Float8Block weights, as 16 x 16 (128 x 128) tiles over the last two dimensions.
struct BlockLayout {
  int dim = -1;
  bool tiles_2d = false;
};

struct BlockProbeResult {
  stats::Fp8ProbeResult cast;  // count, overflow, underflow and the error sums, as for FP8
  int64_t blocks = 0;          // scales (blocks, or tiles)
  int64_t blocks_zero = 0;     // whose amax is 0
  int64_t blocks_saturated = 0;  // whose scale was clamped at its largest value
  int64_t blocks_at_min = 0;     // clamped at the smallest (E8M0 2^-127, or an E4M3 scale of 0)
  int64_t blocks_nonfinite = 0;  // holding an inf or NaN
  int64_t lost = 0;              // finite elements of blocks whose scale is NaN (OCP rule)
  // blocks per scale code: E8M0 (MXFP8), E4M3 (NVFP4), or scale_inv's exponent byte (Float8Block)
  std::array<int64_t, 256> scale_codes{};

  void add(const BlockProbeResult& o);
};

// The largest |x| of a tensor as the recipes see it (NaN ignored, as fmaxf does; inf kept): the
// statistics pass's abs_max (over the non-NaN elements), as float.
inline float recipe_amax(double abs_max) { return static_cast<float>(abs_max); }

// Probes `t` (float32/64/16, bfloat16; dense or strided; on the CPU) with `recipe` along
// `layout`; `tensor_amax` (recipe_amax) sets NVFP4's tensor scale. False for a tensor that is not
// read (out is left empty).
bool probe_blocks(const at::Tensor& t, const BlockRecipe& recipe, const BlockLayout& layout, float tensor_amax,
                  BlockProbeResult& out);

}  // namespace recipes
}  // namespace sentinel
