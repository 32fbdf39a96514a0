#pragma once
// Where a GEMM operand's scaling blocks lie: along the dimension the GEMM reduces over, as
// TransformerEngine lays out its blocks for the forward GEMM. Internal.
#include <sentinel/fp8_scaling.h>

#include <cstdint>
#include <string>

#include "fp8/block_probe.h"

namespace sentinel {
namespace recipes {

// `op`: the forward GEMM (for a gradient, the op whose backward node it feeds); `arg`: the
// operand's argument index; `dims`: its number of dimensions.
//   addmm/baddbmm(bias, a, b), mm/bmm/matmul(a, b): a along its last dimension, b along its
//     second-to-last (the K of [.., K, N]); a 1-D b along its only one.
//   linear(x, W): both along the last dimension (W is [N, K]).
//   convolutions: along the channels (dim 1) of the input and the weight; a transposed
//     convolution's weight [C_in, C_out/g, ...] along dim 0.
//   gradients: along the last dimension (the dgrad GEMM's reduction), the channels for convs.
// NVFP4 and Float8Block weights of the matrix GEMMs take 16 x 16 and 128 x 128 tiles
// (`tiles_2d`, `tiled_weights`), as TransformerEngine does.
inline BlockLayout operand_layout(const std::string& op, fp8::Role role, int arg, int64_t dims, bool tiled_weights) {
  BlockLayout layout;
  const bool conv = op.find("conv") != std::string::npos;
  if (conv) {
    const bool transposed_weight = op.find("conv_transpose") != std::string::npos && role == fp8::Role::Weight;
    layout.dim = dims >= 2 ? (transposed_weight ? 0 : 1) : 0;
    return layout;
  }
  if (role == fp8::Role::Gradient) {
    layout.dim = -1;
    return layout;
  }
  const bool second = (op == "aten::addmm" || op == "aten::baddbmm") ? arg == 2 : arg == 1;
  const bool linear = op == "aten::linear";
  layout.dim = second && !linear && dims >= 2 ? -2 : -1;
  layout.tiles_2d = tiled_weights && role == fp8::Role::Weight && dims >= 2;
  return layout;
}

}  // namespace recipes
}  // namespace sentinel
