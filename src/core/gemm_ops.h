#pragma once
// Which ops are GEMMs, and which of their arguments are the GEMM's operands: the tensors FP8
// casts, the statistics collections read and the dumps save.
#include <cstdint>
#include <cstring>
#include <string>

namespace sentinel {
namespace core {

// Bit i: argument i is an operand. addmm/baddbmm(bias, a, b); the others (a, b, ...). 0: not a GEMM.
inline int8_t gemm_operands(const std::string& name) {
  if (name == "aten::addmm" || name == "aten::baddbmm") return 0b110;
  static const char* const kGemms[] = {"aten::linear", "aten::matmul", "aten::mm", "aten::bmm", "aten::conv1d",
                                       "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
                                       "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d"};
  for (const char* g : kGemms) {
    if (name == g) return 0b011;
  }
  return 0;
}

// Bit i: argument i is a factor of a matrix product every element of which reaches an element of
// the result, if the result has any: mm and bmm (a, b), addmm and baddbmm (bias, a, b) with beta
// and alpha 1 (the caller checks). An inf or NaN in a factor then makes the result non-finite
// (inf * 0 is NaN, NaN spreads, inf - inf is NaN), so a finite result says that every factor was
// finite. 0: no such op.
inline uint8_t factors_of_product(const std::string& name) {
  if (name == "aten::mm" || name == "aten::bmm") return 0b011;
  if (name == "aten::addmm" || name == "aten::baddbmm") return 0b111;
  return 0;
}

// The backward node of a GEMM, whose incoming gradient is the GEMM's gradient operand. Composite
// ops (aten::linear, aten::matmul) share their sequence number with the first node made inside
// them (the TBackward0 of weight.t()): only a GEMM's own node holds the gradient.
inline bool is_gemm_backward_node(const char* node_name) {
  return std::strstr(node_name, "mmBackward") || std::strstr(node_name, "ConvolutionBackward");
}

}  // namespace core
}  // namespace sentinel
